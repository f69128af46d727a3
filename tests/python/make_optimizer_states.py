"""Saved optimizer states of the real classes, for the recognition tests.

Usage: make_optimizer_states.py OUT

Runs under any torch from 1.13 (Debian's) on; torch.optim.Muon (torch >= 2.9), Adafactor
(>= 2.5), the decoupled NAdam and RAdam, pytorch-optimizer's SOAP, Shampoo, Kron and AdEMAMix,
Schedule-Free AdamW and Adam-mini only where they exist.

For each case, a tiny two-layer model trained N steps (three unless the case says) by the
optimizer, saved two ways: OUT/<case>/step_N.pt (torch.save of {'model', 'optimizer'}: the pt
layout) and OUT/<case>_hf/checkpoint-N/ (pytorch_model.bin, optimizer.pt, trainer_state.json: a Hugging Face
Trainer folder). Cases whose writer is older than this torch (groups without
decoupled_weight_decay, torch < 2.7) or hand-made (an unknown key) are edited state dicts of the
real classes. OUT/<case>_next_step.safetensors holds, per parameter, a gradient g.<name> and the
step u.<name> the optimizer itself takes from the saved state with it. OUT/nanogpt_muon_adamw/
is a nanoGPT run of torch.optim.Muon with AdamW (torch >= 2.9), with its probe batch and
torch.autograd's audit of its next step. OUT/<case>_native/step_N/ is the same run saved by
tools/python/curv_export.save_checkpoint (libcurv's native layout), for every case it accepts.
OUT/cases.json lists the cases, those saved natively ("native") and the torch version.
"""
import copy
import json
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "python"))
import curv_export  # noqa: E402

from make_torch_fixtures import CONFIG, GPT, muon_groups, nanogpt_ckpt, reference, save_safetensors


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).double()


class AttentionNames(nn.Module):
    """Parameter names Adam-mini sorts into each of its blocks (width 8 in 2 heads of 32 entries
    of its query and key matrices): an embedding and the head (per row), query and key (per
    head), value, output and MLP (per row), biases (Adam) and a norm (one block)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(4, 8)
        self.q_proj = nn.Linear(8, 8, bias=False)
        self.k_proj = nn.Linear(8, 8, bias=False)
        self.v_proj = nn.Linear(8, 8, bias=False)
        self.o_proj = nn.Linear(8, 8, bias=False)
        self.mlp = nn.Linear(8, 8)
        self.norm = nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.lm_head = nn.Linear(8, 2, bias=False)
        self.double()

    def forward(self, x):
        h = torch.tanh(self.embed(x))
        h = h + self.o_proj(torch.tanh(self.q_proj(h) * self.k_proj(h)) * self.v_proj(h))
        h = h + torch.tanh(self.mlp(h))
        return self.lm_head(h * self.norm)


def trained(make_optimizer, steps=3, native=None, prepare=None, make_model=model):
    """The model and its optimizer's state_dict after `steps` steps, and the next step the
    optimizer takes with a fixed gradient: {g.<name>, u.<name>}; `prepare(optimizer)` edits it
    before that step. With `native`, the run is also saved there by curv_export.save_checkpoint
    before that step; whether it could be is returned last."""
    m = make_model()
    made = make_optimizer(m)
    opts = made if isinstance(made, list) else [made]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    y = torch.randn(8, 2, generator=g, dtype=torch.float64)
    for _ in range(steps):
        for opt in opts:
            opt.zero_grad()
        ((m(x) - y) ** 2).mean().backward()
        for opt in opts:
            opt.step()
    # Several optimizers are saved as the list of their state_dicts.
    states = [copy.deepcopy(opt.state_dict()) for opt in opts]
    saved = ({k: v.clone() for k, v in m.state_dict().items()},
             states if isinstance(made, list) else states[0])
    saved_native = False
    if native:
        try:
            curv_export.save_checkpoint(m, made, steps, native)
            saved_native = True
        except ValueError:  # a state libcurv does not rebuild (AMSGrad, ...)
            pass
    step = {}
    for name, p in m.named_parameters():
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        step["g." + name] = p.grad.clone()
    if prepare:
        prepare(made)
    before = {name: p.detach().clone() for name, p in m.named_parameters()}
    for opt in opts:
        opt.step()
    for name, p in m.named_parameters():
        step["u." + name] = p.detach() - before[name]
    return saved[0], saved[1], step, saved_native


def without(key):
    def edit(osd):
        for group in osd["param_groups"]:
            group.pop(key, None)
        return osd
    return edit


def with_key(key, value):
    def edit(osd):
        for group in osd["param_groups"]:
            group[key] = value
        return osd
    return edit


class KellerMuon(torch.optim.Optimizer):
    """Keller Jordan's plain Muon as its groups and state record it (lr, momentum, weight_decay;
    momentum_buffer); the step itself does not matter here."""

    def __init__(self, params, lr=0.02, weight_decay=0.0, momentum=0.95):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - group["momentum"])
                p.add_(buf, alpha=-group["lr"])


def schedule_free(m, **kwargs):
    """Schedule-Free AdamW in train mode, as it must be when it steps (and as it is saved here)."""
    import schedulefree
    opt = schedulefree.AdamWScheduleFree(m.parameters(), **kwargs)
    opt.train()
    return opt


def matrices(m):
    return [p for p in m.parameters() if p.dim() == 2]


def cases():
    out = {
        "adamw": (lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1), None),
        "adam": (lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, weight_decay=0.1), None),
        "adam_no_decay": (lambda m: torch.optim.Adam(m.parameters(), lr=1e-2), None),
        "sgd": (lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), None),
        "amsgrad": (lambda m: torch.optim.AdamW(m.parameters(), amsgrad=True), None),
        "extra_key": (lambda m: torch.optim.AdamW(m.parameters()), with_key("lookahead_k", 5)),
        "legacy_adamw": (lambda m: torch.optim.AdamW(m.parameters(), weight_decay=0.1),
                         without("decoupled_weight_decay")),
        "legacy_adamw_no_decay": (lambda m: torch.optim.AdamW(m.parameters(), weight_decay=0.0),
                                  without("decoupled_weight_decay")),
        "keller_muon": (lambda m: KellerMuon(matrices(m)), None),
    }
    # The rules of the optimizer zoo, each checked against its own next step.
    out["nadam"] = (lambda m: torch.optim.NAdam(m.parameters(), lr=1e-2, weight_decay=0.1), None)
    out["radam"] = (lambda m: torch.optim.RAdam(m.parameters(), lr=1e-2, weight_decay=0.1), None)
    # Eight steps: RAdam's rectification is defined (rho_t > 5) from the seventh on.
    out["radam_rectified"] = (lambda m: torch.optim.RAdam(m.parameters(), lr=1e-2), None, 8)
    if "decoupled_weight_decay" in torch.optim.NAdam.__init__.__code__.co_varnames:
        out["nadamw"] = (lambda m: torch.optim.NAdam(m.parameters(), lr=1e-2, weight_decay=0.1,
                                                     decoupled_weight_decay=True), None)
        out["radamw"] = (lambda m: torch.optim.RAdam(m.parameters(), lr=1e-2, weight_decay=0.1,
                                                     decoupled_weight_decay=True), None, 8)
    if hasattr(torch.optim, "Adafactor"):  # torch >= 2.5
        out["adafactor"] = (lambda m: torch.optim.Adafactor(m.parameters(), lr=1e-2,
                                                            weight_decay=0.1), None)
    if hasattr(torch.optim, "Muon"):  # torch >= 2.9
        out["torch_muon"] = (lambda m: torch.optim.Muon(matrices(m), lr=0.02), None)
        # The pairing torch's documentation recommends: Muon on the matrices, AdamW on the rest.
        out["muon_adamw"] = (lambda m: [
            torch.optim.Muon(matrices(m), lr=0.02, weight_decay=0.05),
            torch.optim.AdamW([p for p in m.parameters() if p.dim() != 2], lr=3e-3,
                              betas=(0.9, 0.95), weight_decay=0.01)], None)
        out["torch_muon_rms"] = (lambda m: torch.optim.Muon(
            matrices(m), lr=0.02, weight_decay=0.05, nesterov=False,
            adjust_lr_fn="match_rms_adamw"), None)
    try:
        import pytorch_optimizer
        # precondition_frequency 1: the eigenbases the next step uses were refreshed by a power
        # iteration and a QR after the last step.
        out["soap"] = (lambda m: pytorch_optimizer.SOAP(m.parameters(), lr=3e-3,
                                                        precondition_frequency=1), None)
        out["soap_options"] = (lambda m: pytorch_optimizer.SOAP(
            m.parameters(), lr=3e-3, betas=(0.9, 0.99), shampoo_beta=0.9, weight_decay=0.1,
            precondition_frequency=2, precondition_1d=True, correct_bias=False,
            normalize_gradient=True), None, 4)
        out["shampoo"] = (lambda m: pytorch_optimizer.Shampoo(
            m.parameters(), lr=1e-2, momentum=0.9, weight_decay=0.1), None)
        out["shampoo_decoupled"] = (lambda m: pytorch_optimizer.Shampoo(
            m.parameters(), lr=1e-2, weight_decay=0.1, weight_decouple=True), None)
        # Its inverse roots every second step: the state does not record that.
        out["shampoo_every2"] = (lambda m: pytorch_optimizer.Shampoo(
            m.parameters(), lr=1e-2, preconditioning_compute_steps=2), None, 4)
        out["adamuon"] = (lambda m: pytorch_optimizer.AdaMuon([
            {"params": matrices(m), "use_muon": True, "lr": 0.02, "weight_decay": 0.05},
            {"params": [p for p in m.parameters() if p.dim() != 2], "use_muon": False,
             "lr": 3e-3, "weight_decay": 0.01}]), None)
        out["adamuon_l2"] = (lambda m: pytorch_optimizer.AdaMuon([
            {"params": matrices(m), "use_muon": True, "weight_decay": 0.05},
            {"params": [p for p in m.parameters() if p.dim() != 2], "use_muon": False}],
            weight_decouple=False, use_adjusted_lr=False), None)
        out["mars"] = (lambda m: pytorch_optimizer.MARS(m.parameters(), lr=1e-2,
                                                        weight_decay=0.05), None)
        out["mars_l2"] = (lambda m: pytorch_optimizer.MARS(
            m.parameters(), lr=1e-2, weight_decay=0.05, weight_decouple=False,
            optimize_1d=True), None)
        out["mars_lion"] = (lambda m: pytorch_optimizer.MARS(m.parameters(), mars_type="lion"),
                            None)
        # Kron fits its factors every 1/p steps: with p = 0.5, at the second and fourth steps,
        # and not at the fifth, whose step is then the reference's own.
        out["kron"] = (lambda m: pytorch_optimizer.Kron(
            m.parameters(), lr=1e-2, weight_decay=0.1, pre_conditioner_update_probability=0.5,
            precondition_dtype=torch.float64), None, 4)
        # The default schedule fits at every step: the next step's fit draws its probe vector
        # from the global generator. Its reference is the step without that fit (p set to 0 for
        # that step), which is what libcurv rebuilds, and says so.
        out["kron_schedule"] = (lambda m: pytorch_optimizer.Kron(
            m.parameters(), lr=1e-2, weight_decay=0.1, weight_decouple=False,
            memory_save_mode="one_diag", precondition_dtype=None), None, 3,
            lambda opt: opt.param_groups[0].update(pre_conditioner_update_probability=0.0))
        # SCION's default oracles (bfloat16 Newton-Schulz on the matrices, bias RMS on vectors)
        # and, by group, its column (transposed, normalized), sign (constrained), row and identity
        # oracles with L2 decay.
        out["scion"] = (lambda m: pytorch_optimizer.SCION(m.parameters(), lr=1e-2,
                                                          weight_decay=0.1), None)
        out["scion_oracles"] = (lambda m: pytorch_optimizer.SCION([
            {"params": [m[0].weight], "norm_type": 6,
             "norm_kwargs": {"normalized": True, "transpose": True}},
            {"params": [m[2].weight], "norm_type": 4, "constraint": True},
            {"params": [m[0].bias], "norm_type": 7},
            {"params": [m[2].bias], "norm_type": 0}],
            lr=1e-2, momentum=0.5, scale=2.0, weight_decay=0.1, weight_decouple=False), None)
        out["ademamix"] = (lambda m: pytorch_optimizer.AdEMAMix(
            m.parameters(), lr=1e-2, weight_decay=0.1, weight_decouple=True,
            t_alpha_beta3=10), None)
        out["ademamix_l2"] = (lambda m: pytorch_optimizer.AdEMAMix(
            m.parameters(), lr=1e-2, weight_decay=0.1), None)
    except ImportError:
        pass
    try:
        import adam_mini
        out["adam_mini"] = (lambda m: adam_mini.Adam_mini(
            m.named_parameters(), lr=1e-2, weight_decay=0.1, dim=8, n_heads=2, verbose=False),
            None, 3, None, AttentionNames)
    except ImportError:
        pass
    try:
        import schedulefree  # noqa: F401
        out["schedulefree"] = (lambda m: schedule_free(m, lr=1e-2, weight_decay=0.1,
                                                       warmup_steps=2), None)
        # Saved in eval mode: its parameters would be the average x.
        out["schedulefree_eval"] = (lambda m: schedule_free(m, lr=1e-2),
                                    with_key("train_mode", False))
    except ImportError:
        pass
    return out


class Optimizers:
    """Several optimizers stepped together, saved as the list of their states."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers

    def zero_grad(self):
        for opt in self.optimizers:
            opt.zero_grad()

    def step(self):
        for opt in self.optimizers:
            opt.step()

    def state_dict(self):
        return [opt.state_dict() for opt in self.optimizers]

    def load_state_dict(self, states):
        for opt, state in zip(self.optimizers, states):
            opt.load_state_dict(state)


def muon_with_adamw(model):
    """torch.optim.Muon on nanoGPT's hidden matrices, AdamW on the rest (its groups' settings)."""
    hidden, rest = muon_groups(model)
    return Optimizers(
        torch.optim.Muon(hidden["params"], lr=hidden["lr"], weight_decay=hidden["weight_decay"]),
        torch.optim.AdamW(rest["params"], lr=rest["lr"], betas=rest["betas"],
                          weight_decay=rest["weight_decay"]))


def nanogpt_muon_adamw(out):
    """A nanoGPT trained two steps by torch.optim.Muon with AdamW, saved as nanoGPT saves
    (ckpt.pt, 'optimizer' the list of both states), a probe batch, and torch.autograd's audit of
    the step the pair takes next from the saved state (reference.json, direction torch_muon)."""
    torch.manual_seed(5)
    model = GPT(CONFIG).double()
    optimizer = muon_with_adamw(model)
    g = torch.Generator().manual_seed(6)
    data = torch.randint(0, CONFIG["vocab_size"], (12, CONFIG["block_size"] + 1), generator=g)
    tx, ty = data[:8, :-1].contiguous(), data[:8, 1:].contiguous()
    x, y = data[8:, :-1].contiguous(), data[8:, 1:].contiguous()
    for _ in range(2):
        optimizer.zero_grad()
        model(tx, ty).backward()
        optimizer.step()
    run = f"{out}/nanogpt_muon_adamw"
    os.makedirs(run, exist_ok=True)
    torch.save(nanogpt_ckpt(model, optimizer, 2), f"{run}/ckpt.pt")
    save_safetensors(f"{out}/nanogpt_probe.safetensors", {"inputs": x, "targets": y})
    reference(f"{run}/ckpt.pt", None, CONFIG, x, y, f"{out}/nanogpt_muon_adamw.json",
              make_optimizer=muon_with_adamw, step_name="torch_muon")


def main():
    out = sys.argv[1]
    written, natives = [], []
    for name, (make, edit, *more) in cases().items():
        steps = more[0] if more else 3
        prepare = more[1] if len(more) > 1 else None
        make_model = more[2] if len(more) > 2 else model
        weights, osd, step, native = trained(make, steps, f"{out}/{name}_native", prepare,
                                             make_model)
        if native:
            natives.append(name)
        if edit:
            osd = edit(osd)
        os.makedirs(f"{out}/{name}", exist_ok=True)
        torch.save({"model": weights, "optimizer": osd}, f"{out}/{name}/step_{steps}.pt")
        save_safetensors(f"{out}/{name}_next_step.safetensors", step)
        written.append(name)
        if isinstance(osd, list):  # a Trainer steps one optimizer
            continue
        hf = f"{out}/{name}_hf/checkpoint-{steps}"
        os.makedirs(hf, exist_ok=True)
        torch.save(weights, f"{hf}/pytorch_model.bin")
        torch.save(osd, f"{hf}/optimizer.pt")
        with open(f"{hf}/trainer_state.json", "w") as f:
            json.dump({"global_step": steps, "log_history": []}, f)
    if hasattr(torch.optim, "Muon"):
        nanogpt_muon_adamw(out)
        written.append("nanogpt_muon_adamw")
    with open(f"{out}/cases.json", "w") as f:
        json.dump({"torch": torch.__version__, "cases": written, "native": natives}, f)


if __name__ == "__main__":
    main()
