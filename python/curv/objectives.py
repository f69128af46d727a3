"""Ready-made objectives: callables (model, batch) -> (logits, targets) or a scalar loss."""
import torch


def causal_lm(model, batch):
    """A causal language model (Hugging Face's or any returning logits [B, T, V]): the logits of
    positions 0..T-2 against the tokens 1..T-1. `batch` is a dict with "input_ids" and, when
    given, "labels" (-100 positions are left out, as transformers leaves them) and
    "attention_mask"; or a LongTensor of token ids."""
    if torch.is_tensor(batch):
        ids, labels, mask = batch, batch, None
    else:
        ids = batch["input_ids"]
        labels = batch.get("labels", ids)
        mask = batch.get("attention_mask")
    out = model(input_ids=ids, attention_mask=mask) if mask is not None else model(ids)
    logits = out.logits if hasattr(out, "logits") else (out[0] if isinstance(out, tuple) else out)
    return logits[:, :-1], labels[:, 1:]


def classifier(model, batch):
    """A classifier on (inputs, class ids): model(inputs) -> logits [B, C]."""
    inputs, targets = batch
    return model(inputs), targets
