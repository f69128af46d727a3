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

# Optimizer class -> the libcurv rule whose rebuilt step matches it (docs/optimizers.md):
# torch.optim's, pytorch-optimizer's and schedulefree's, by module and class name.
_OPTIMIZERS = {
    ("torch.optim", "AdamW"): "adamw",
    ("torch.optim", "Adam"): "adam",
    ("torch.optim", "SGD"): "sgd",
    ("torch.optim", "NAdam"): "nadam",
    ("torch.optim", "RAdam"): "radam",
    ("torch.optim", "Adafactor"): "adafactor",
    ("torch.optim", "Muon"): "torch-muon",
    ("pytorch_optimizer", "SOAP"): "soap",
    ("pytorch_optimizer", "Shampoo"): "shampoo",
    ("pytorch_optimizer", "Kron"): "kron",
    ("pytorch_optimizer", "SCION"): "scion",
    ("pytorch_optimizer", "AdEMAMix"): "ademamix",
    ("pytorch_optimizer", "AdaMuon"): "adamuon",
    ("pytorch_optimizer", "MARS"): "mars",
    ("schedulefree", "AdamWScheduleFree"): "adamw-schedulefree",
    ("adam_mini", "Adam_mini"): "adam-mini",
}

# param_group keys -> libcurv's field names, where they differ; tuples are split below.
_RENAMED = {"d": "clip_threshold", "decoupled_weight_decay": "decoupled",
            "weight_decouple": "decoupled", "use_adjusted_lr": "rms_scale",
            "pre_conditioner_update_probability": "update_probability", "norm_type": "lmo"}
# SCION's norm_kwargs -> libcurv's field names.
_NORM_KWARGS = {"normalize": "lmo_normalize", "normalized": "lmo_normalize",
                "transpose": "lmo_transpose", "max_scale": "lmo_max_scale", "num_steps": "ns_steps"}
_NUMERIC = ("lr", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening", "nesterov", "ns_steps",
            "momentum_decay", "beta2_decay", "alpha", "t_alpha_beta3", "fixed_decay",
            "shampoo_beta", "precondition_frequency", "max_precondition_dim", "precondition_1d",
            "correct_bias", "normalize_gradient", "matrix_eps", "warmup_steps", "r",
            "weight_lr_power", "weight_sum", "lr_max", "d", "decoupled_weight_decay",
            "weight_decouple", "use_adjusted_lr", "gamma", "optimize_1d", "lr_1d_factor",
            "weight_decay_1d", "pre_conditioner_update_probability", "update_counter",
            "max_size_triangular", "min_ndim_triangular", "precondition_lr",
            "precondition_init_scale", "momentum_into_precondition_update", "norm_type", "scale",
            "constraint")
_ADJUST_LR = {None: 0.0, "original": 0.0, "match_rms_adamw": 1.0, "spectral_unclamped": 2.0}
# Kron's memory_save_mode and precondition_dtype as libcurv's codes.
_MEMORY_SAVE_MODE = {None: 0.0, "one_diag": 1.0, "smart_one_diag": 2.0, "all_diag": 3.0}
_PRECONDITION_DTYPE = {None: 0.0, torch.float32: 32.0, torch.float64: 64.0}


def _rule_of(optimizer):
    cls = type(optimizer)
    package = cls.__module__.split(".")[0]
    top = "torch.optim" if cls.__module__.startswith("torch.optim") else package
    rule = _OPTIMIZERS.get((top, cls.__name__))
    if rule is None:
        known = ", ".join(f"{m}.{c}" for m, c in _OPTIMIZERS)
        raise ValueError(f"optimizer {cls.__module__}.{cls.__name__}: libcurv rebuilds the steps "
                         f"of {known}; save with optimizer=None")
    groups = optimizer.param_groups
    if rule == "adam" and all(g.get("decoupled_weight_decay") for g in groups):
        rule = "adamw"  # torch >= 2.7's Adam(decoupled_weight_decay=True) is AdamW
    if any(g.get("amsgrad") for g in groups) or any(g.get("maximize") for g in groups):
        raise ValueError(f"optimizer {cls.__name__}: amsgrad and maximize steps are not rebuilt")
    if rule == "adamw-schedulefree" and not all(g.get("train_mode") for g in groups):
        raise ValueError("AdamWScheduleFree in eval mode: its parameters are the average x; "
                         "call optimizer.train() before saving")
    if rule == "soap" and any(g.get("merge_dims") for g in groups):
        raise ValueError("SOAP with merge_dims=True is not rebuilt")
    if rule == "kron" and any(g.get("mu_dtype") is not None or callable(
            g.get("pre_conditioner_update_probability")) or g.get("precondition_dtype")
            not in _PRECONDITION_DTYPE for g in groups):
        raise ValueError("Kron is rebuilt with mu_dtype None, a constant (or the default) update "
                         "probability, and precondition_dtype None, float32 or float64")
    if rule == "mars" and any(g.get("mars_type") != "adamw" or g.get("ams_bound")
                              or g.get("cautious") for g in groups):
        raise ValueError("MARS is rebuilt of its adamw type, without ams_bound or cautious")
    return rule


def _hyper(group):
    hyper = {}
    for key in _NUMERIC:
        value = group.get(key)
        if isinstance(value, (bool, int, float)):
            hyper[_RENAMED.get(key, key)] = float(value)
    if "betas" in group:
        for name, beta in zip(("beta1", "beta2", "beta3"), group["betas"]):
            hyper[name] = float(beta)
    if isinstance(group.get("eps"), (tuple, list)):  # Adafactor's (eps1, eps2)
        eps1, eps2 = group["eps"]
        hyper["eps"] = 0.0 if eps1 is None else float(eps1)
        hyper["eps2"] = float(eps2)
    if "ns_coefficients" in group:
        hyper["ns_a"], hyper["ns_b"], hyper["ns_c"] = map(float, group["ns_coefficients"])
    if "betas_1d" in group:
        hyper["beta1_1d"], hyper["beta2_1d"] = map(float, group["betas_1d"])
    if "ns_coeffs" in group:  # pytorch-optimizer's schedule: one tuple is rebuilt
        if len(group["ns_coeffs"]) != 1:
            raise ValueError("a Newton-Schulz schedule of several coefficient tuples is not rebuilt")
        hyper["ns_a"], hyper["ns_b"], hyper["ns_c"] = map(float, group["ns_coeffs"][0])
    if "adjust_lr_fn" in group:
        hyper["adjust_lr"] = _ADJUST_LR[group["adjust_lr_fn"]]
    if "memory_save_mode" in group:
        hyper["memory_save_mode"] = _MEMORY_SAVE_MODE[group["memory_save_mode"]]
    if "norm_kwargs" in group:  # SCION: an option left out takes the oracle's default
        hyper.update({"lmo_normalize": -1.0, "lmo_transpose": 0.0, "lmo_max_scale": 0.0,
                      "ns_steps": 5.0})
        for key, value in (group["norm_kwargs"] or {}).items():
            if key in _NORM_KWARGS:
                hyper[_NORM_KWARGS[key]] = float(value)
    if "precondition_dtype" in group:
        hyper["precondition_dtype"] = _PRECONDITION_DTYPE[group["precondition_dtype"]]
    return hyper


def _adam_part(hyper):
    """An AdamW group's hyper-parameters as the AdamW part of torch-muon reads them."""
    names = {"lr": "adam_lr", "beta1": "adam_beta1", "beta2": "adam_beta2", "eps": "adam_eps",
             "weight_decay": "adam_weight_decay", "decoupled": "decoupled"}
    return {names[k]: v for k, v in hyper.items() if k in names}


def optimizer_record(optimizers, names):
    """meta.json's "optimizer" and the state tensors by "<param>.<key>" of one optimizer, or of
    torch.optim.Muon with AdamW (a list of the two: the rule torch-muon, AdamW its adam_* part)."""
    rules = [_rule_of(opt) for opt in optimizers]
    if len(optimizers) > 1 and sorted(rules) != ["adamw", "torch-muon"]:
        raise ValueError(f"optimizers {rules}: libcurv rebuilds several optimizers only as "
                         "torch.optim.Muon with torch.optim.AdamW")
    state, groups, step_count, muon_names = {}, [], None, []
    for opt, rule in zip(optimizers, rules):
        for group in opt.param_groups:
            hyper = _hyper(group)
            if rule == "adam-mini":  # an attribute of the optimizer, not of its groups
                hyper["head_numel"] = float(opt.head_numel)
            # The AdamW of a Muon rule: torch.optim.AdamW beside torch.optim.Muon, or AdaMuon's
            # groups without use_muon.
            aux = (len(optimizers) > 1 and rule == "adamw") or (
                rule == "adamuon" and not group.get("use_muon"))
            if aux:
                hyper = _adam_part(hyper)
            groups.append({"params": [names[id(p)] for p in group["params"]], "hyper": hyper})
            for key in ("step", "k"):  # pytorch-optimizer's and Schedule-Free's group counts
                if isinstance(group.get(key), int) and (key == "step" or "weight_sum" in group):
                    step_count = max(step_count or 0, group[key])
            for p in group["params"]:
                if rule == "torch-muon" or (rule == "adamuon" and group.get("use_muon")):
                    muon_names.append(names[id(p)])
                for key, value in opt.state.get(p, {}).items():
                    if key == "step":
                        step_count = max(step_count or 0, int(value))
                    elif torch.is_tensor(value):
                        state[f"{names[id(p)]}.{key}"] = value
                    elif isinstance(value, (list, tuple)):  # SOAP's GG and Q: one per dimension
                        for k, item in enumerate(value):
                            if torch.is_tensor(item):
                                state[f"{names[id(p)]}.{key}.{k}"] = item
    hyper = {}
    for group in groups[::-1]:
        hyper.update(group["hyper"])
    meta = {"name": "torch-muon" if "torch-muon" in rules else rules[0], "hyper": hyper,
            "param_groups": groups}
    # An optimizer that counts no steps (SGD) leaves the count to the checkpoint's step.
    if step_count is not None:
        meta["step_count"] = step_count
    if muon_names:
        meta["muon_params"] = "^(" + "|".join(n.replace(".", "\\.") for n in muon_names) + ")$"
    return meta, state


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


def save_checkpoint(model, optimizer, step, run_dir, prefix="", model_config=None):
    """Writes run_dir/step_<step>/ in libcurv's native layout: optimizer.safetensors (state by
    parameter name), meta.json (optimizer name, hyper-parameters, step count, parameter groups),
    then model.safetensors last, so an interrupted save is skipped by ndsprobe.

    prefix: the prefix export_model returned. optimizer: one whose steps libcurv rebuilds
    (torch.optim's AdamW, Adam, SGD, NAdam, RAdam, Adafactor, Muon; pytorch-optimizer's SOAP,
    Shampoo, Kron, SCION, AdaMuon, MARS, AdEMAMix; schedulefree's AdamWScheduleFree in train mode;
    adam-mini's Adam_mini), the list
    [torch.optim.Muon, torch.optim.AdamW] of a run stepping both, or None.
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
        optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
        meta["optimizer"], state = optimizer_record(optimizers, names)
        save_safetensors(os.path.join(folder, "optimizer.safetensors"), state)
    with open(os.path.join(folder, "meta.json.tmp"), "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(os.path.join(folder, "meta.json.tmp"), os.path.join(folder, "meta.json"))
    save_safetensors(model_path, {prefix + n: p for n, p in model.named_parameters()},
                     {"format": "pt"})
