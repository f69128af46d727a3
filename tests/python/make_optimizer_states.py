"""Saved optimizer states of the real classes, for the recognition tests.

Usage: make_optimizer_states.py OUT

Runs under any torch from 1.13 (Debian's) on; torch.optim.Muon (torch >= 2.9), Adafactor
(>= 2.5), the decoupled NAdam and RAdam, pytorch-optimizer's SOAP, Shampoo and AdEMAMix, and
Schedule-Free AdamW only where they exist.

For each case, a tiny two-layer model trained N steps (three unless the case says) by the
optimizer, saved two ways: OUT/<case>/step_N.pt (torch.save of {'model', 'optimizer'}: the pt
layout) and OUT/<case>_hf/checkpoint-N/ (pytorch_model.bin, optimizer.pt, trainer_state.json: a Hugging Face
Trainer folder). Cases whose writer is older than this torch (groups without
decoupled_weight_decay, torch < 2.7) or hand-made (an unknown key) are edited state dicts of the
real classes. OUT/<case>_next_step.safetensors holds, per parameter, a gradient g.<name> and the
step u.<name> the optimizer itself takes from the saved state with it. OUT/cases.json lists the
cases with the torch version.
"""
import copy
import json
import os
import sys

import torch
from torch import nn

from make_torch_fixtures import save_safetensors


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).double()


def trained(make_optimizer, steps=3):
    """The model and its optimizer's state_dict after `steps` steps, and the next step the
    optimizer takes with a fixed gradient: {g.<name>, u.<name>}."""
    m = model()
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
    step = {}
    for name, p in m.named_parameters():
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        step["g." + name] = p.grad.clone()
    before = {name: p.detach().clone() for name, p in m.named_parameters()}
    for opt in opts:
        opt.step()
    for name, p in m.named_parameters():
        step["u." + name] = p.detach() - before[name]
    return saved[0], saved[1], step


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
        out["ademamix"] = (lambda m: pytorch_optimizer.AdEMAMix(
            m.parameters(), lr=1e-2, weight_decay=0.1, weight_decouple=True,
            t_alpha_beta3=10), None)
        out["ademamix_l2"] = (lambda m: pytorch_optimizer.AdEMAMix(
            m.parameters(), lr=1e-2, weight_decay=0.1), None)
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


def main():
    out = sys.argv[1]
    written = []
    for name, (make, edit, *steps) in cases().items():
        steps = steps[0] if steps else 3
        weights, osd, step = trained(make, steps)
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
    with open(f"{out}/cases.json", "w") as f:
        json.dump({"torch": torch.__version__, "cases": written}, f)


if __name__ == "__main__":
    main()
