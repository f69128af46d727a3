"""Runs torch.optim.AdamW, Adam and SGD for 20 steps on fixed gradients and saves every tensor.

Usage: torch_optim_reference.py OUT.pt DTYPE
Writes a plain dict readable by torch::pickle_load: theta0 (list), grads (list of lists, one per
step), and for each case name: final parameters (list), plus the hyper-parameters used.
"""
import sys

import torch


def run(opt_class, kwargs, theta0, grads):
    params = [torch.nn.Parameter(t.clone()) for t in theta0]
    opt = opt_class(params, **kwargs)
    for step_grads in grads:
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        opt.step()
    return [p.detach().clone() for p in params]


def main():
    out, dtype_name = sys.argv[1], sys.argv[2]
    dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
    torch.manual_seed(0)
    theta0 = [torch.randn(5, 3, dtype=dtype), torch.randn(4, dtype=dtype)]
    grads = [[torch.randn_like(t) for t in theta0] for _ in range(20)]
    cases = {
        "adamw": (torch.optim.AdamW, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)),
        "adam": (torch.optim.Adam, dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)),
        "sgd_nesterov": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
        "sgd_dampened": (torch.optim.SGD, dict(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.0)),
    }
    result = {"theta0": theta0, "grads": grads}
    for name, (cls, kwargs) in cases.items():
        result[name] = run(cls, kwargs, theta0, grads)
    torch.save(result, out)


if __name__ == "__main__":
    main()
