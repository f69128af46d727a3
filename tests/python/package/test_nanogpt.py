"""nanoGPT's own model.py (github.com/karpathy/nanoGPT) as an nn.Module: the package's audit
against torch.autograd in float64 (≤ 1e-10) with flash attention turned off, and its
scaled_dot_product_attention path either right or refused by name.

nanoGPT is not a package: set CURV_NANOGPT_MODEL to the path of its model.py (a clone of the
repository) to run these tests; without it they are skipped."""
import importlib.util
import os

import pytest
import torch

import curv
from conftest import autograd_reference, random_direction, rel
from test_audit import check_against_autograd

MODEL_PY = os.environ.get("CURV_NANOGPT_MODEL", "")


@pytest.fixture(scope="module")
def nanogpt():
    if not os.path.isfile(MODEL_PY):
        pytest.skip("set CURV_NANOGPT_MODEL to nanoGPT's model.py")
    spec = importlib.util.spec_from_file_location("nanogpt_model", MODEL_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_gpt(nanogpt, flash):
    torch.manual_seed(0)
    config = nanogpt.GPTConfig(block_size=16, vocab_size=61, n_layer=2, n_head=2, n_embd=16,
                               dropout=0.0, bias=True)
    model = nanogpt.GPT(config).double()
    if not flash:
        # model.py's own slow path: the causal mask it registers when SDPA is missing.
        for block in model.transformer.h:
            block.attn.flash = False
            mask = torch.tril(torch.ones(16, 16)).view(1, 1, 16, 16)
            block.attn.register_buffer("bias", mask)
    return model.eval()


def batches(count=2, rows=3, length=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.randint(0, 61, (rows, length + 1), generator=g)
        out.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
    return out


def objective(model, batch):
    """nanoGPT's forward with targets: logits at every position, scored by cross-entropy."""
    x, y = batch
    logits, _ = model(x, y)
    return logits, y


def test_nanogpt_model_py_against_autograd(nanogpt):
    model = make_gpt(nanogpt, flash=False)
    data = batches()
    probe = curv.Probe(model, data, objective)
    # nanoGPT ties the head to the embedding: one parameter, in the embeddings' block.
    assert "lm_head.weight" not in probe.names
    assert probe.blocks[:2] == ["embeddings", "transformer.h.0"]
    assert probe.roles["transformer.h.0.attn.c_attn.weight"] == "fused_qkv"
    check_against_autograd(probe, model, objective, data, random_direction(model))


def test_nanogpt_flash_attention_is_right_or_named(nanogpt):
    model = make_gpt(nanogpt, flash=True)
    data = batches()
    u = random_direction(model)
    try:
        audit = curv.Probe(model, data, objective).audit(u)
    except curv.AttentionDoubleBackwardError as e:
        assert "transformer.h.0.attn" in str(e)
    else:  # this torch's kernel has a double backward here: then it must be right
        reference = autograd_reference(make_gpt(nanogpt, flash=False), objective, data, u)
        assert rel(audit.curvature, reference["uhu"]) < 1e-10
