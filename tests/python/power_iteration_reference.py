"""Largest-magnitude Hessian eigenvalue of a TorchScript fixture by power iteration in Python.

Usage: power_iteration_reference.py DIR

Reads DIR/model_loss.pt and the probe batch (x, y) of DIR/reference.pt (both written by
make_script_fixture.py), runs power iteration with torch.autograd Hessian-vector products until
the Rayleigh quotient changes by less than 1e-14 relative, and writes it to DIR/power_iteration.txt.
"""
import sys

import torch


def main():
    out = sys.argv[1]
    model = torch.jit.load(f"{out}/model_loss.pt")
    ref = torch.load(f"{out}/reference.pt")
    x, y = ref["x"], ref["y"]
    params = [p for p in model.parameters()]
    loss = model(x, y)
    grads = torch.autograd.grad(loss, params, create_graph=True)

    def hvp(v):
        return torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True)

    gen = torch.Generator().manual_seed(0)
    v = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    value = None
    for _ in range(20000):
        norm = torch.sqrt(sum((t * t).sum() for t in v))
        v = [t / norm for t in v]
        hv = hvp(v)
        rayleigh = sum((a * b).sum() for a, b in zip(v, hv)).item()
        v = [t.detach() for t in hv]
        if value is not None and abs(rayleigh - value) <= 1e-14 * abs(value):
            value = rayleigh
            break
        value = rayleigh
    else:
        sys.exit(f"power iteration did not converge: last value {value}")
    with open(f"{out}/power_iteration.txt", "w") as f:
        f.write(repr(value) + "\n")


if __name__ == "__main__":
    main()
