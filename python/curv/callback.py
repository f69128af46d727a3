"""The update a training run actually takes, probed every N steps: a Hugging Face
TrainerCallback and the same probe for hand-written loops.

Each probe keeps θ_before just before optimizer.step() and takes u = θ_after − θ_before just
after, so u is the real step (after clipping, with the real schedule). g and H are measured on
the user's probe batches at θ_before, with the model in eval mode; then θ_after is put back bit
for bit, and the RNG states too: training is the same with and without the probe.
"""
import sys
import time

import torch

from . import _curv
from ._evaluator import trainable
from .objectives import causal_lm
from .probe import Probe
from .report import Report


def _rank_and_world():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _unwrap(model):
    """The module itself under DDP / accelerate wrappers (their forward may run collectives)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


class UpdateProbe:
    """Probes the update of step t (0-based) when t % every == 0.

    Call before_step(model, t) just before optimizer.step() and after_step(model, t) just after.
    Results: `audits` (curv.Audit, direction "update"), `eigenvalues` ({step: curv.Eigenvalues}
    with lambda_max > 0) and, with `path`, an HDF5 file in ndsprobe's schema, committed after
    every probe and resumed when it exists.
    """

    def __init__(self, batches, objective=causal_lm, *, every=100, path=None, run="run",
                 resume=True, lambda_max=False, coupling=_curv.Coupling.FULL, realized=True,
                 **probe_options):
        self.batches = batches
        self.objective = objective
        self.every = int(every)
        if self.every <= 0:
            raise ValueError(f"every = {every} must be > 0")
        self.path, self.run, self.resume = path, run, resume
        self.lambda_max = lambda_max
        self.coupling, self.realized = coupling, realized
        self.probe_options = probe_options
        self.audits, self.eigenvalues, self.seconds = [], {}, []
        self._probe = self._report = None
        self._before = None
        rank, world = _rank_and_world()
        self.active = rank == 0
        if world > 1 and rank == 0:
            print(f"curv: probing the update on rank 0 of {world}, on its own copy of the "
                  f"parameters and the probe batches given to it", file=sys.stderr)

    def due(self, step):
        return self.active and step % self.every == 0

    def before_step(self, model, step):
        if not self.due(step):
            return
        if self._report is not None and self._report.done(self.run, step, "update"):
            return
        model = _unwrap(model)
        self._before = [p.detach().clone() for _, p in trainable(model)]

    def after_step(self, model, step):
        if self._before is None:
            return
        start = time.perf_counter()
        model = _unwrap(model)
        params = [p for _, p in trainable(model)]
        before, self._before = self._before, None
        after = [p.detach().clone() for p in params]
        u = [a - b for a, b in zip(after, before)]
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        try:
            with torch.no_grad():
                for p, b in zip(params, before):
                    p.copy_(b)
            probe = self._probe_of(model)
            audit = probe.audit(u, coupling=self.coupling, realized=self.realized, run=self.run,
                                step=step, direction="update")
            eig = probe.eigenvalues(1, keep_vectors=False) if self.lambda_max else None
        finally:
            with torch.no_grad():
                for p, a in zip(params, after):
                    p.copy_(a)
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
        self.audits.append(audit)
        if eig is not None:
            self.eigenvalues[step] = eig
        if self._report is not None:
            self._report.add(audit)
            if eig is not None:
                self._report.add_eigenvalues(self.run, step, eig)
            self._report.commit()
        self.seconds.append(time.perf_counter() - start)

    def _probe_of(self, model):
        if self._probe is None or self._probe.model is not model:
            self._probe = Probe(model, self.batches, self.objective, **self.probe_options)
            if self.path is not None and self._report is None:
                self._report = Report(self.path, self._probe, resume=self.resume,
                                      tool="curv.UpdateProbe")
        return self._probe

    def open(self, model):
        """Builds the probe (one no-grad forward per probe batch) and opens the file, so that a
        resumed run skips the steps the file holds."""
        if self.active:
            cpu_rng = torch.get_rng_state()
            try:
                self._probe_of(_unwrap(model))
            finally:
                torch.set_rng_state(cpu_rng)


try:
    from transformers import TrainerCallback as _TrainerCallback
except ImportError:  # transformers is optional: the callback needs it, UpdateProbe does not
    _TrainerCallback = object


class CurvatureCallback(_TrainerCallback):
    """A transformers.TrainerCallback probing the update of every `every`-th optimizer step.

    `Trainer(..., callbacks=[curv.CurvatureCallback(probe_batches, every=50, path="probe.h5")])`;
    the options are UpdateProbe's. Results: `.probe.audits`, and the file.
    """

    def __init__(self, batches, objective=causal_lm, **options):
        if _TrainerCallback is object:
            raise ImportError("CurvatureCallback needs transformers; UpdateProbe does not")
        self.probe = UpdateProbe(batches, objective, **options)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            self.probe.open(model)

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.probe.before_step(model, state.global_step)

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.probe.after_step(model, state.global_step)
