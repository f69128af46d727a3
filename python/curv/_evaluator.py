"""The Python side of libcurv's PythonObjective: evaluates the user's objective on the examples
the engine names by (batch, row) pairs, so the engine can slice probe batches into micro-batches
whatever their structure (tensors, dicts, tuples, Hugging Face BatchEncodings)."""
from collections.abc import Mapping

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # cross-entropy leaves these targets out of its mean, as torch does


def trainable(model):
    """(name, parameter) of the parameters that require grad, in the module's order: the
    parameters every analysis, direction and probe is over."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def batch_size(batch):
    """The examples of a batch: the first dimension of its first tensor."""
    if torch.is_tensor(batch):
        if batch.dim() == 0:
            raise ValueError("a probe batch tensor has no examples dimension (0-dim)")
        return batch.shape[0]
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (list, tuple)) or isinstance(batch, Mapping):
        for v in values:
            try:
                return batch_size(v)
            except ValueError:
                continue
    raise ValueError(f"a probe batch holds no tensor to count its examples by: {type(batch).__name__}")


def take_rows(batch, rows, n):
    """The examples `rows` of a batch of n: every tensor whose first dimension is n is indexed."""
    if torch.is_tensor(batch):
        if batch.dim() > 0 and batch.shape[0] == n:
            return batch.index_select(0, rows.to(batch.device))
        return batch
    if isinstance(batch, Mapping):
        return {k: take_rows(v, rows, n) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(take_rows(v, rows, n) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(take_rows(v, rows, n) for v in batch)
    return batch


def token_losses(logits, targets, loss_fn=None):
    """Per-target losses shaped like `targets`: cross-entropy over the last dimension of the
    logits, or `loss_fn(logits, targets)`; ignored targets (-100) give 0."""
    if loss_fn is not None:
        losses = loss_fn(logits, targets)
        if losses.shape != targets.shape:
            raise ValueError(f"the per-token loss function returned shape {tuple(losses.shape)} "
                             f"for targets of shape {tuple(targets.shape)}")
        return losses.masked_fill(targets == IGNORE_INDEX, 0) if not targets.is_floating_point() \
            else losses
    classes = logits.shape[-1]
    flat = F.cross_entropy(logits.reshape(-1, classes), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="none")
    return flat.reshape(targets.shape)


class Evaluator:
    def __init__(self, model, objective, batches, loss_fn=None):
        self.model = model
        self.objective = objective
        self.batches = list(batches)
        if not self.batches:
            raise ValueError("the probe set holds no batch")
        self.sizes = [batch_size(b) for b in self.batches]
        self.loss_fn = loss_fn
        self.has_logits = None

    def targets(self):
        """Runs the objective once per batch (no graph) to learn its kind and each batch's
        targets: the engine weighs micro-batches and forms token buckets from them."""
        out = []
        with torch.no_grad():
            for b, batch in enumerate(self.batches):
                result = self.objective(self.model, batch)
                kind = isinstance(result, (tuple, list))
                if self.has_logits is None:
                    self.has_logits = kind
                elif self.has_logits != kind:
                    raise ValueError(f"the objective returned (logits, targets) on one batch and a "
                                     f"loss on another (batch {b})")
                if kind:
                    if len(result) != 2:
                        raise ValueError("the objective must return (logits, targets) or a loss")
                    logits, targets = result
                    if targets.shape[0] != self.sizes[b] or logits.shape[:targets.dim()] != \
                            targets.shape:
                        raise ValueError(
                            f"batch {b}: logits {tuple(logits.shape)} and targets "
                            f"{tuple(targets.shape)} do not line up with {self.sizes[b]} examples "
                            f"(logits [..., C] over the targets' shape)")
                    out.append(targets.detach())
                else:
                    if not torch.is_tensor(result) or result.numel() != 1:
                        raise ValueError("the objective must return (logits, targets) or a scalar "
                                         "loss tensor")
                    out.append(torch.zeros(self.sizes[b], dtype=torch.float64))
        return out

    def _run(self, rows):
        rows = rows.cpu()
        b = int(rows[0, 0])
        idx = rows[:, 1]
        batch = self.batches[b]
        n = self.sizes[b]
        if idx.numel() != n or not torch.equal(idx, torch.arange(n)):
            batch = take_rows(batch, idx, n)
        return self.objective(self.model, batch)

    def loss(self, rows):
        out = self._run(rows)
        if not self.has_logits:
            return out
        logits, targets = out
        losses = token_losses(logits, targets, self.loss_fn)
        count = (targets != IGNORE_INDEX).sum() if not targets.is_floating_point() \
            else torch.tensor(targets.numel())
        return losses.sum() / count.clamp(min=1).to(losses.dtype)

    def token_losses(self, rows):
        logits, targets = self._run(rows)
        return token_losses(logits, targets, self.loss_fn)

    def logits(self, rows):
        return self._run(rows)[0]
