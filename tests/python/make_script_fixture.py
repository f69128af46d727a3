"""Writes a TorchScript model and reference HVPs computed by Python torch.autograd.

Usage: make_script_fixture.py OUT_DIR DTYPE   (DTYPE: float32 | float64)

OUT_DIR/model_loss.pt     forward(x, y) -> mean cross-entropy loss
OUT_DIR/model_logits.pt   forward(x) -> logits (same weights)
OUT_DIR/reference.pt      plain dict: x, y, names, loss, v0..v4, hv0..hv4 (lists in
                          named_parameters order), readable by torch::pickle_load
"""
import sys

import torch
from torch import nn
from torch.nn.utils import stateless


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 4)

    def logits(self, x):
        return self.fc2(torch.tanh(self.norm(torch.nn.functional.gelu(self.fc1(x)))))


class LossNet(Net):
    def forward(self, x, y):
        return nn.functional.cross_entropy(self.logits(x), y)


class LogitsNet(Net):
    def forward(self, x):
        return self.logits(x)


def main():
    out, dtype_name = sys.argv[1], sys.argv[2]
    dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
    torch.manual_seed(0)
    model = LossNet().to(dtype)
    logits_model = LogitsNet().to(dtype)
    logits_model.load_state_dict(model.state_dict())
    torch.jit.save(torch.jit.script(model), f"{out}/model_loss.pt")
    torch.jit.save(torch.jit.script(logits_model), f"{out}/model_logits.pt")

    x = torch.randn(16, 6, dtype=dtype)
    y = torch.randint(0, 4, (16,))
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach() for _, p in model.named_parameters())

    def loss_fn(*values):
        return stateless.functional_call(model, dict(zip(names, values)), (x, y))

    ref = {"x": x, "y": y, "names": names, "loss": loss_fn(*params).detach()}
    for k in range(5):
        v = tuple(torch.randn_like(p) for p in params)
        _, hv = torch.autograd.functional.hvp(loss_fn, params, v)
        ref[f"v{k}"] = list(v)
        ref[f"hv{k}"] = [h.detach() for h in hv]
    torch.save(ref, f"{out}/reference.pt")


if __name__ == "__main__":
    main()
