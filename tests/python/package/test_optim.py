"""Directions from a live optimizer: rebuilt by libcurv's rules without stepping, against a real
optimizer.step() on a deep copy; and measured around a step."""
import copy

import pytest
import torch

import curv
from conftest import lm_batches


def loss_on(model, batch):
    logits, targets = curv.causal_lm(model, batch)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             targets.reshape(-1))


def train(model, optimizer, steps=3):
    steppers = optimizer if isinstance(optimizer, list) else [optimizer]
    for batch in lm_batches(count=steps, seed=5):
        for o in steppers:
            o.zero_grad()
        loss_on(model, batch).backward()
        for o in steppers:
            o.step()


def hidden_and_rest(model):
    matrices = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n
                and "lm_head" not in n]
    ids = {id(p) for p in matrices}
    return matrices, [p for p in model.parameters() if id(p) not in ids]


def make(name, model):
    if name == "adamw":
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        rest = [p for n, p in model.named_parameters() if p.dim() < 2]
        return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                  {"params": rest, "weight_decay": 0.0}], lr=1e-3)
    if name == "torch-muon":
        matrices, rest = hidden_and_rest(model)
        return [torch.optim.Muon(matrices, lr=0.02, weight_decay=0.01),
                torch.optim.AdamW(rest, lr=1e-3)]
    if name == "nadam":
        return torch.optim.NAdam(model.parameters(), lr=1e-3, weight_decay=0.01)
    if name == "adafactor":
        return torch.optim.Adafactor(model.parameters(), lr=1e-2)
    if name == "soap":
        from pytorch_optimizer import SOAP
        return SOAP(model.parameters(), lr=1e-3, precondition_frequency=2)
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["adamw", "torch-muon", "nadam", "adafactor", "soap"])
def test_rebuilt_update_is_the_optimizers_own_next_step(llama, name):
    optimizer = make(name, llama)
    train(llama, optimizer)
    batch = lm_batches(count=1, seed=9)[0]
    grads = torch.autograd.grad(loss_on(llama, batch), list(llama.parameters()))
    named_grads = {n: g for (n, _), g in zip(llama.named_parameters(), grads)}
    # The copy's optimizer takes the live one's state as it is: a deep copy of the object would
    # drop what some classes keep outside their state (SOAP's `maximize`), and load_state_dict
    # casts state to the parameters' dtype (NAdam's float32 mu_product).
    model_copy = copy.deepcopy(llama)
    optimizer_copy = make(name, model_copy)
    pairs = zip(optimizer_copy, optimizer) if isinstance(optimizer, list) else \
        [(optimizer_copy, optimizer)]
    to_copy = dict(zip(llama.parameters(), model_copy.parameters()))
    for mine, theirs in pairs:
        for p, state in theirs.state.items():
            mine.state[to_copy[p]] = copy.deepcopy(state)
        for g_mine, g_theirs in zip(mine.param_groups, theirs.param_groups):
            g_mine.update({k: copy.deepcopy(v) for k, v in g_theirs.items() if k != "params"})
    for p, g in zip(model_copy.parameters(), grads):
        p.grad = g.clone()
    before = {n: p.detach().clone() for n, p in llama.named_parameters()}
    for o in optimizer_copy if isinstance(optimizer_copy, list) else [optimizer_copy]:
        o.step()
    want = {n: p.detach() - before[n] for n, p in model_copy.named_parameters()}
    rebuilt = curv.update_direction(optimizer, llama, named_grads)
    assert rebuilt.rule == name and "rebuilt from saved" in rebuilt.note
    diff = sum((rebuilt.u[n] - want[n]).pow(2).sum() for n in want).sqrt()
    ref = sum(w.pow(2).sum() for w in want.values()).sqrt()
    assert (diff / ref).item() < 1e-12, (name, (diff / ref).item())
    # Stepping nothing: the live model and optimizer are untouched.
    for n, p in llama.named_parameters():
        assert torch.equal(p, before[n])


def test_an_optimizer_no_rule_reads_is_refused(llama):
    optimizer = torch.optim.Adam(llama.parameters(), amsgrad=True)
    train(llama, optimizer, steps=1)
    with pytest.raises(ValueError, match="AMSGrad|amsgrad"):
        curv.update_direction(optimizer, llama)


def test_measured_update_is_the_step_taken(llama):
    optimizer = torch.optim.SGD(llama.parameters(), lr=0.1)
    loss_on(llama, lm_batches(count=1)[0]).backward()
    grads = {n: p.grad.clone() for n, p in llama.named_parameters()}
    with curv.measured_update(llama) as step:
        torch.nn.utils.clip_grad_norm_(llama.parameters(), 0.5)
        optimizer.step()
    norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
    scale = min(1.0, 0.5 / (norm.item() + 1e-6))
    for n, g in grads.items():
        assert torch.allclose(step.u[n], -0.1 * scale * g, rtol=1e-9, atol=1e-15)
    audit = curv.Probe(llama, lm_batches()).audit(
        {n: -u for n, u in step.u.items()})  # back at θ_after, along −u: a valid audit
    assert audit.status == "complete"
