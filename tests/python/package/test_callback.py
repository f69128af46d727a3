"""The update probe inside a real transformers.Trainer run on the CPU: training unchanged bit for
bit, the probed u the step taken, results in memory and in an HDF5 file notebook 1 reads."""
import copy
import os
import shutil
import subprocess

import h5py
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, \
    TrainingArguments

import curv
from conftest import float64_model, lm_batches

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
STEPS, EVERY = 6, 2


def make_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attention_dropout=0.1)  # dropout in training: the probe turns it off
    return float64_model(LlamaForCausalLM(config))


class Steps(TrainerCallback):
    """θ just before and just after each optimizer step, recorded independently."""

    def __init__(self):
        self.before, self.after = {}, {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.before[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.after[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()}


def train(out, callbacks):
    model = make_model()
    data = [{"input_ids": b["input_ids"][0], "labels": b["input_ids"][0]}
            for b in lm_batches(count=16, rows=1, length=12, seed=7)]
    args = TrainingArguments(out, max_steps=STEPS, per_device_train_batch_size=4,
                             learning_rate=3e-3, max_grad_norm=0.5, lr_scheduler_type="linear",
                             logging_steps=1, save_strategy="no", report_to=[], seed=3,
                             use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return model, losses


def test_callback_in_a_trainer(tmp_path):
    probe_batches = lm_batches(count=2, seed=11)
    plain, plain_losses = train(str(tmp_path / "plain"), [])
    recorder = Steps()
    callback = curv.CurvatureCallback(probe_batches, every=EVERY, path=str(tmp_path / "probe.h5"),
                                      run="adamw", lambda_max=True)
    probed, probed_losses = train(str(tmp_path / "probed"), [recorder, callback])
    # Training is unchanged: every parameter and every logged loss, bit for bit.
    assert probed_losses == plain_losses
    for (n, p), (_, q) in zip(plain.named_parameters(), probed.named_parameters()):
        assert torch.equal(p, q), n
    audits = callback.probe.audits
    assert [a.step for a in audits] == list(range(0, STEPS, EVERY))
    for audit in audits:
        before, after = recorder.before[audit.step], recorder.after[audit.step]
        u = {n: after[n] - before[n] for n in before}
        # The probe measured the step taken, at θ_before, on the probe batches, in eval mode.
        reference = make_model()
        with torch.no_grad():
            for n, p in reference.named_parameters():
                p.copy_(before[n])
        want = curv.Probe(reference, probe_batches).audit(u)
        assert audit.update_norm == want.update_norm
        assert audit.first_order == want.first_order and audit.curvature == want.curvature
        assert audit.direction == "update" and audit.run == "adamw"
        assert callback.probe.eigenvalues[audit.step].largest[0] > 0
    with h5py.File(tmp_path / "probe.h5") as f:
        taylor = f["taylor"]
        totals = [i for i, b in enumerate(taylor["block"][:]) if b in (b"total", "total")]
        assert [int(taylor["step"][i]) for i in totals] == [0, 2, 4]
        assert f.attrs["tool"] in (b"curv.UpdateProbe", "curv.UpdateProbe")
        assert "spectrum" in f["runs/adamw/step_2"]


def test_the_file_resumes_and_opens_in_notebook_1(tmp_path):
    path = tmp_path / "probe.h5"
    first = curv.CurvatureCallback(lm_batches(count=2, seed=11), every=EVERY, path=str(path),
                                   run="adamw")
    train(str(tmp_path / "a"), [first])
    again = curv.CurvatureCallback(lm_batches(count=2, seed=11), every=EVERY, path=str(path),
                                   run="adamw")
    train(str(tmp_path / "b"), [again])
    assert again.probe.audits == []  # every due step is in the file already
    python = "/usr/bin/python3"
    if not shutil.which(python):
        pytest.skip("Debian's python3 (nbconvert) is not installed")
    notebook = os.path.join(ROOT, "notebooks", "1_quickstart.ipynb")
    env = dict(os.environ, CURV_H5=str(path), CURV_DEMO_DIR=str(tmp_path / "no-demo"))
    done = subprocess.run([python, "-m", "nbconvert", "--to", "notebook", "--execute",
                           "--ExecutePreprocessor.timeout=300", "--output-dir", str(tmp_path),
                           notebook], cwd=os.path.dirname(notebook), env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
