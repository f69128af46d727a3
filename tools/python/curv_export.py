"""Export a PyTorch model of any architecture for ndsprobe, and save checkpoints in libcurv's
native layout from a training loop. Needs only torch (Debian's python3-torch is enough).

    import curv_export
    prefix = curv_export.export_model(model, "run/model.pt", loss_fn=my_loss,
                                      example_batch=(x, y))
    for step in ...:
        ...train...
        if step % 100 == 0:
            curv_export.save_checkpoint(model, optimizer, step, "run", prefix=prefix)

    ndsprobe run --model run/model.pt --data probe.safetensors -o run.h5

See docs/checkpoints.md ("Exporting any architecture") for the details.
"""
import json
import os
import struct

import torch
from torch import nn

__all__ = ["export_model", "save_checkpoint", "save_safetensors"]

_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
              torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
              torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}

# torch.optim class -> the libcurv optimizer whose rebuilt step matches it.
_OPTIMIZERS = {"AdamW": "adamw", "SGD": "sgd"}


class _WithLoss(nn.Module):
    """forward(x, y) = loss_fn(model(x), y): the loss mode of ndsprobe's TorchScript models."""

    def __init__(self, model, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, x, y):
        return self.loss_fn(self.model(x), y)


class _CrossEntropy(nn.Module):
    def forward(self, logits, targets):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def export_model(model, path, loss_fn=None, example_batch=None):
    """Writes `model` as TorchScript to `path` for ndsprobe --model.

    loss_fn: None, "cross_entropy", or an nn.Module (or scriptable function) computing the mean
    loss from (model(x), y). With None the file's forward(x) returns the model's output and
    ndsprobe scores it by cross-entropy (--script-mode logits); otherwise forward(x, y) returns
    the loss, and parameter names gain the prefix "model.".
    example_batch: (x, y); when given, the exported loss is checked against the eager one, and a
    model that torch.jit.script cannot compile is traced on it instead.
    Returns the prefix the parameter names carry in the export: pass it to save_checkpoint.
    """
    model = model.eval()
    if loss_fn is None:
        module, prefix = model, ""
    else:
        if loss_fn == "cross_entropy":
            loss_fn = _CrossEntropy()
        module, prefix = _WithLoss(model, loss_fn), "model."
    try:
        scripted = torch.jit.script(module)
    except Exception as error:  # TorchScript cannot compile every Python model
        if example_batch is None:
            raise RuntimeError(f"torch.jit.script failed ({error}); pass example_batch=(x, y) "
                               "to trace the model instead") from error
        inputs = example_batch if loss_fn is not None else (example_batch[0],)
        scripted = torch.jit.trace(module, inputs)
    if example_batch is not None:
        x, y = example_batch
        with torch.no_grad():
            eager = module(x, y) if loss_fn is not None else module(x)
            exported = scripted(x, y) if loss_fn is not None else scripted(x)
        if not torch.allclose(eager, exported, rtol=1e-5, atol=1e-7):
            raise RuntimeError("the exported model disagrees with the eager one on example_batch")
    torch.jit.save(scripted, path)
    return prefix


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} as a safetensors file, atomically (PATH.tmp, then rename)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor '{name}' has dtype {t.dtype}, not storable")
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        data = raw.numpy().tobytes()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _hyper(group):
    hyper = {}
    for key in ("lr", "eps", "weight_decay", "momentum", "dampening"):
        if isinstance(group.get(key), (int, float)):
            hyper[key] = float(group[key])
    if "nesterov" in group:
        hyper["nesterov"] = 1.0 if group["nesterov"] else 0.0
    if "betas" in group:
        hyper["beta1"], hyper["beta2"] = float(group["betas"][0]), float(group["betas"][1])
    return hyper


def save_checkpoint(model, optimizer, step, run_dir, prefix="", model_config=None):
    """Writes run_dir/step_<step>/ in libcurv's native layout: optimizer.safetensors (state by
    parameter name), meta.json (optimizer name, hyper-parameters, step count, parameter groups),
    then model.safetensors last, so an interrupted save is skipped by ndsprobe.

    prefix: the prefix export_model returned. optimizer: a torch.optim.AdamW or SGD, or None.
    model_config: a built-in model config (dict) to record as meta.json's "model".
    """
    folder = os.path.join(run_dir, f"step_{int(step)}")
    os.makedirs(folder, exist_ok=True)
    model_path = os.path.join(folder, "model.safetensors")
    if os.path.exists(model_path):
        os.remove(model_path)  # until the new one is written the folder reads as incomplete
    names = {id(p): prefix + n for n, p in model.named_parameters()}
    meta = {"step": int(step)}
    if model_config is not None:
        meta["model"] = model_config
    if optimizer is not None:
        kind = type(optimizer).__name__
        if kind not in _OPTIMIZERS:
            raise ValueError(f"optimizer {kind}: libcurv rebuilds the steps of "
                             f"{', '.join(_OPTIMIZERS)}; save with optimizer=None")
        state, groups, step_count = {}, [], 0
        for group in optimizer.param_groups:
            groups.append({"params": [names[id(p)] for p in group["params"]],
                           "hyper": _hyper(group)})
            for p in group["params"]:
                for key, value in optimizer.state.get(p, {}).items():
                    if key == "step":
                        step_count = max(step_count, int(value))
                    elif torch.is_tensor(value) and value.shape == p.shape:
                        state[f"{names[id(p)]}.{key}"] = value
        meta["optimizer"] = {"name": _OPTIMIZERS[kind], "hyper": groups[0]["hyper"],
                             "step_count": step_count, "param_groups": groups}
        save_safetensors(os.path.join(folder, "optimizer.safetensors"), state)
    with open(os.path.join(folder, "meta.json.tmp"), "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(os.path.join(folder, "meta.json.tmp"), os.path.join(folder, "meta.json"))
    save_safetensors(model_path, {prefix + n: p for n, p in model.named_parameters()},
                     {"format": "pt"})
