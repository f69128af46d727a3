"""modded-nanogpt's optimizers as train_gpt_simple.py builds and steps them, and their next step.

Usage: modded_optim_reference.py OUT_DIR

The optimizers of modded-nanogpt's optimization track
(records/track_3_optimization/train_gpt_simple.py), re-implemented here in float64 on the tiny
modded GPT of modded_reference.py (vocabulary 29, 2 layers, width 16, head_dim 8): the script's
torch.compile'd Muon needs torch >= 2 and CUDA, so its step is spelled out as the script writes it
(one rank), and AdamW is torch.optim.AdamW with the script's groups and hyper-parameters.

  optimizer1 = AdamW([dict(params=[embed.weight], lr=0.7), dict(params=[proj.weight], lr=0.004),
                      dict(params=[p for p in model.parameters() if p.ndim < 2], lr=0.015)],
                     betas=(0.8, 0.95), eps=1e-10, weight_decay=0.001)
  optimizer2 = Muon([p for p in model.blocks.parameters() if p.ndim >= 2], lr=0.025,
                    weight_decay=0.05)   # params sorted by size, largest first; mu=0.95

Ten training steps (the script's set_hparams schedule with train_steps=3250: lr factor 1) on
random batches with the script's sum-reduced loss, then writes, in OUT_DIR:

  run/state_step000010.pt      dict(step, code, model, optimizers) as the speedrun saves it; code
                               carries the script's zeropower_via_newtonschulz5 (2, -1.5, 0.5; 12)
  coeffs/state_step000010.pt   the same with code whose Newton-Schulz is (3.4445, -4.7750, 2.0315)
                               over 5 steps
  nocode/state_step000010.pt   code without zeropower_via_newtonschulz5 (the script's defaults)
  sharded/state_step000010.pt  Muon state as rank 0 of 2 ranks holds it (every 2nd parameter)
  misfit/state_step000010.pt   one Muon momentum transposed (shape that fits no parameter)
  reference.json               the probe batch (inputs, targets), parameter names, the order of
                               each optimizer's indices, and by name the step u = θ11 − θ10 the
                               script takes next with the probe batch's gradient (mean loss per
                               token, libcurv's), for run (u), coeffs (u_coeffs); u_bf16: run's step
                               with the script's bfloat16 Newton-Schulz.
"""
import copy
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from modded_reference import CODE as MODEL_CODE, small_model  # noqa: E402

DTYPE = torch.float64

ZEROPOWER = '''
def zeropower_via_newtonschulz5(G: Tensor) -> Tensor:
    assert G.ndim >= 2
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT

    # Ensure spectral norm is at most 1
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    # Perform the NS iterations, not optimizing for wallclock speed
    a, b, c = {a}, {b}, {c}
    for _ in range({steps}):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X

    if G.size(-2) > G.size(-1):
        X = X.mT
    return X

@torch.compile
def muon_update(grad, momentum, mu=0.95, nesterov=True):
    ...
'''
SCRIPT_NS = (2, -1.5, 0.5, 12)
OTHER_NS = (3.4445, -4.7750, 2.0315, 5)


def code_with(ns):
    return MODEL_CODE + ZEROPOWER.format(a=ns[0], b=ns[1], c=ns[2], steps=ns[3])


def zeropower(G, ns, dtype):
    """The script's zeropower_via_newtonschulz5, in `dtype` (the script: bfloat16)."""
    a, b, c, steps = ns
    X = G.to(dtype)
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def muon_update(grad, momentum, mu, ns, dtype):
    momentum.lerp_(grad, 1 - mu)
    update = grad.lerp_(momentum, mu)  # nesterov=True
    update = zeropower(update, ns, dtype).to(grad.dtype)
    update *= max(1, grad.size(-2) / grad.size(-1)) ** 0.5
    return update


class Muon(torch.optim.Optimizer):
    """The script's Muon on one rank (world_size 1: every parameter stepped by this rank)."""

    def __init__(self, params, lr=0.02, weight_decay=0, mu=0.95, ns=SCRIPT_NS, ns_dtype=DTYPE):
        params = sorted(params, key=lambda x: x.size(), reverse=True)
        defaults = dict(lr=lr, weight_decay=weight_decay, mu=mu)
        super().__init__(params, defaults)
        self.ns, self.ns_dtype = ns, ns_dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    state["momentum"] = torch.zeros_like(p)
                update = muon_update(p.grad.clone(), state["momentum"], group["mu"], self.ns,
                                     self.ns_dtype)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"])


def make_optimizers(model):
    optimizer1 = torch.optim.AdamW([dict(params=[model.embed.weight], lr=0.7),
                                    dict(params=[model.proj.weight], lr=0.004),
                                    dict(params=[p for p in model.parameters() if p.ndim < 2],
                                         lr=0.015)],
                                   betas=(0.8, 0.95), eps=1e-10, weight_decay=0.001,
                                   foreach=False)
    optimizer2 = Muon([p for p in model.blocks.parameters() if p.ndim >= 2], lr=0.025,
                      weight_decay=0.05)
    optimizers = [optimizer1, optimizer2]
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    return optimizers


def set_hparams(optimizers, step, train_steps=3250, cooldown_frac=0.7):
    progress = step / train_steps
    eta = 1.0 if progress < 1 - cooldown_frac else (1 - progress) / cooldown_frac
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * eta


def next_step(model, optimizers, grads, step, ns, ns_dtype):
    """u = θ_{step+1} − θ_step: the script's next step with `grads`, on copies."""
    model, optimizers = copy.deepcopy((model, optimizers))
    optimizers[1].ns, optimizers[1].ns_dtype = ns, ns_dtype
    before = [p.detach().clone() for p in model.parameters()]
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    set_hparams(optimizers, step)
    for opt in optimizers:
        opt.step()
    return [p.detach() - b for p, b in zip(model.parameters(), before)]


def save(out, sub, step, model, optimizers, code, edit=None):
    state = {"_orig_mod." + k: v.clone() for k, v in model.state_dict().items()}
    opt_states = copy.deepcopy([opt.state_dict() for opt in optimizers])
    if edit:
        edit(opt_states)
    os.makedirs(f"{out}/{sub}", exist_ok=True)
    torch.save(dict(step=step, code=code, model=state, optimizers=opt_states),
               f"{out}/{sub}/state_step{step:06d}.pt")


def main():
    out = sys.argv[1]
    vocab = 29
    model = small_model(vocab)
    optimizers = make_optimizers(model)
    names = {p: n for n, p in model.named_parameters()}
    steps = 10
    for step in range(steps):
        tokens = torch.randint(0, vocab, (4, 9))
        model(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()).backward()
        set_hparams(optimizers, step)
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)

    save(out, "run", steps, model, optimizers, code_with(SCRIPT_NS))
    save(out, "coeffs", steps, model, optimizers, code_with(OTHER_NS))
    save(out, "nocode", steps, model, optimizers, MODEL_CODE)

    def shard(states):  # rank 0 of 2: Muon's params[0], params[2], ...
        states[1]["state"] = {k: v for k, v in states[1]["state"].items() if k % 2 == 0}

    def misfit(states):
        states[1]["state"][0]["momentum"] = states[1]["state"][0]["momentum"].t().contiguous()

    save(out, "sharded", steps, model, optimizers, code_with(SCRIPT_NS), shard)
    save(out, "misfit", steps, model, optimizers, code_with(SCRIPT_NS), misfit)

    # The probe batch and its gradient of the mean loss per token at θ10.
    tokens = torch.randint(0, vocab, (3, 9))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    loss = model(inputs, targets) / targets.numel()
    grads = torch.autograd.grad(loss, list(model.parameters()))
    param_names = [n for n, _ in model.named_parameters()]
    flat = lambda ts: {n: t.reshape(-1).tolist() for n, t in zip(param_names, ts)}
    u = next_step(model, optimizers, grads, steps, SCRIPT_NS, DTYPE)
    u_coeffs = next_step(model, optimizers, grads, steps, OTHER_NS, DTYPE)
    u_bf16 = next_step(model, optimizers, grads, steps, SCRIPT_NS, torch.bfloat16)
    reference = {
        "inputs": inputs.tolist(),
        "targets": targets.tolist(),
        "param_names": param_names,
        "adamw_order": [[names[p] for p in g["params"]] for g in optimizers[0].param_groups],
        "muon_order": [names[p] for p in optimizers[1].param_groups[0]["params"]],
        "step_count": steps,
        "u": flat(u),
        "u_coeffs": flat(u_coeffs),
        "u_bf16": flat(u_bf16),
    }
    with open(f"{out}/reference.json", "w") as f:
        json.dump(reference, f)


if __name__ == "__main__":
    main()
