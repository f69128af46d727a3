"""tools/python/curv_export.py (curv.export_model, curv.save_checkpoint) on a model with a tied
head: the TorchScript file names the shared tensor twice, the checkpoint once, and ndsprobe reads
both as one parameter. ndsprobe's delta audit matches the package's on the same module."""
import os
import subprocess

import h5py
import pytest
import torch
from transformers import GemmaConfig, GemmaForCausalLM

import curv
from conftest import float64_model, lm_batches

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
NDSPROBE = os.environ.get("CURV_NDSPROBE",
                          os.path.join(ROOT, "build-torch2", "tools", "ndsprobe", "ndsprobe"))


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, x):
        return self.m(input_ids=x).logits


def test_gemma_tied_head_exports_and_probes(tmp_path):
    if not os.path.exists(NDSPROBE):
        pytest.skip(f"no ndsprobe at {NDSPROBE} (set CURV_NDSPROBE)")
    torch.manual_seed(0)
    config = GemmaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                         max_position_embeddings=64, tie_word_embeddings=True)
    model = Logits(float64_model(GemmaForCausalLM(config)))
    ids = lm_batches(count=1, rows=4, length=11, seed=4)[0]["input_ids"]
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    run = tmp_path / "run"
    prefix = curv.export_model(model, str(tmp_path / "model.pt"), example_batch=(x, y))
    curv.save_safetensors(str(tmp_path / "probe.safetensors"), {"inputs": x, "targets": y})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    curv.save_checkpoint(model, optimizer, 1, str(run), prefix=prefix)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    torch.nn.functional.cross_entropy(model(x).reshape(-1, 61), y.reshape(-1)).backward()
    optimizer.step()
    curv.save_checkpoint(model, optimizer, 2, str(run), prefix=prefix)
    out = tmp_path / "out.h5"
    done = subprocess.run([NDSPROBE, str(run), "--model", str(tmp_path / "model.pt"),
                           "--script-mode", "logits", "--data", str(tmp_path / "probe.safetensors"),
                           "--dtype", "float64", "--directions", "delta", "--steps", "1:1",
                           "-o", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    # The same audit by the package on the module at step 1.
    with torch.no_grad():
        u = {n: p.detach() - before[n] for n, p in model.named_parameters()}
        for n, p in model.named_parameters():
            p.copy_(before[n])
    audit = curv.Probe(model, [(x, y)], curv.classifier).audit(u, realized=False)
    with h5py.File(out) as f:
        unit = f["runs/run/step_1/delta"]
        for key, mine in (("first_order", audit.first_order), ("curvature", audit.curvature)):
            theirs = float(unit.attrs[key])
            assert abs(theirs - mine) <= 1e-10 * abs(mine), (key, theirs, mine)
