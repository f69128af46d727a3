"""Update directions from a live optimizer: measured around a real step, or rebuilt from its
state by libcurv's rules without stepping."""
import contextlib
import json

from . import _curv
from . import _export
from ._evaluator import trainable
from .results import MeasuredUpdate, RebuiltUpdate


def update_direction(optimizer, model, grads=None):
    """The step `optimizer` would take next, rebuilt by libcurv's rule from its live state,
    without stepping it: a RebuiltUpdate (u = θ' − θ by parameter name, the rule, a note).

    optimizer: any optimizer curv_export.save_checkpoint saves (docs/optimizers.md), or the list
        [torch.optim.Muon, torch.optim.AdamW] of a run stepping both.
    grads: {name: tensor}, or None for the parameters' .grad.
    """
    named = trainable(model)
    names = [n for n, _ in named]
    if grads is None:
        missing = [n for n, p in named if p.grad is None]
        if missing:
            raise ValueError(f"parameters without .grad (pass grads=): {missing[:3]}")
        grads = {n: p.grad for n, p in named}
    theta = [p.detach() for _, p in named]
    try:
        g = [grads[n].detach().to(device=p.device, dtype=p.dtype) for n, p in named]
    except KeyError as e:
        raise ValueError(f"grads has no tensor for parameter {e}") from None
    # The state as curv_export saves it (every state tensor by name, the rule and its groups),
    # handed to libcurv in memory: the record and the rules ndsprobe reads from a saved one.
    ids = {id(p): n for n, p in model.named_parameters()}
    optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    record, state = _export.optimizer_record(optimizers, ids)
    u, rule, note = _curv.rebuild_update(
        json.dumps({"step": 1, "optimizer": record}),
        [(k, v.detach().cpu()) for k, v in state.items()], names,
        [t.cpu() for t in theta], [t.cpu() for t in g])
    return RebuiltUpdate({n: t.to(p.device) for (n, p), t in zip(named, u)}, rule, note)


@contextlib.contextmanager
def measured_update(model):
    """u = θ_after − θ_before around whatever runs inside (a real optimizer.step(), clipping,
    schedulers): `with curv.measured_update(model) as m: optimizer.step()`, then m.u."""
    named = trainable(model)
    result = MeasuredUpdate({n: p.detach().clone() for n, p in named})
    yield result
    result.u = {n: p.detach() - result.theta_before[n] for n, p in named}
