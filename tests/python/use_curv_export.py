"""Uses tools/python/curv_export.py as a user would: a custom architecture with a custom loss,
exported to TorchScript, trained with AdamW (two parameter groups) and saved in the native layout;
writes the probe data and torch.autograd's numbers for the delta direction at step 1. The model
is also exported without its loss (logits.pt) and saved without optimizer at step 2 (run_logits/).

Usage: use_curv_export.py REPO_ROOT OUT_DIR
"""
import json
import math
import sys

import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(5, 8)
        self.norm = nn.LayerNorm(8)
        self.hidden = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = h + torch.nn.functional.gelu(self.hidden(self.norm(h)))
        return self.out(h)


class SmoothedCrossEntropy(nn.Module):
    def forward(self, logits, targets):
        return nn.functional.cross_entropy(logits, targets, label_smoothing=0.1)


def main():
    root, out = sys.argv[1], sys.argv[2]
    sys.path.insert(0, f"{root}/tools/python")
    import curv_export

    torch.manual_seed(0)
    model = Residual().double()
    loss_fn = SmoothedCrossEntropy()
    x = torch.randn(12, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (12,))
    prefix = curv_export.export_model(model, f"{out}/model.pt", loss_fn=loss_fn,
                                      example_batch=(x, y))
    curv_export.save_safetensors(f"{out}/probe.safetensors", {"inputs": x, "targets": y})
    params = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": 0.05},
         {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0}],
        lr=0.02, betas=(0.8, 0.9))
    train_x = torch.randn(16, 5, dtype=torch.float64)
    train_y = torch.randint(0, 3, (16,))
    snapshots = {}
    for step in range(1, 3):
        optimizer.zero_grad()
        loss_fn(model(train_x), train_y).backward()
        optimizer.step()
        curv_export.save_checkpoint(model, optimizer, step, f"{out}/run", prefix=prefix)
        snapshots[step] = [p.detach().clone() for p in model.parameters()]

    # The same model exported without its loss: forward(x) returns logits, names unprefixed.
    assert curv_export.export_model(model, f"{out}/logits.pt", example_batch=(x, y)) == ""
    curv_export.save_checkpoint(model, None, 2, f"{out}/run_logits")
    with torch.no_grad():
        logits_loss = nn.functional.cross_entropy(model(x), y).item()

    # torch.autograd at step 1 along the delta to step 2.
    with torch.no_grad():
        for p, v in zip(model.parameters(), snapshots[1]):
            p.copy_(v)
    ps = list(model.parameters())
    loss = loss_fn(model(x), y)
    grads = torch.autograd.grad(loss, ps, create_graph=True)
    u = [b - a for a, b in zip(snapshots[1], snapshots[2])]
    gu = sum((g * v).sum() for g, v in zip(grads, u))
    hu = torch.autograd.grad(gu, ps)
    uhu = sum((h * v).sum() for h, v in zip(hu, u)).item()
    norm2 = sum((v * v).sum() for v in u).item()
    with open(f"{out}/reference.json", "w") as f:
        json.dump({"prefix": prefix, "loss": loss.item(), "logits_loss": logits_loss, "first_order": gu.item(),
                   "curvature": uhu, "nds": uhu / norm2, "update_norm": math.sqrt(norm2)}, f)


if __name__ == "__main__":
    main()
