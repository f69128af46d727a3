"""Runs saved by DeepSpeed's ZeRO on 2 CPU ranks, and their float64 references.

Launched by torchrun on 2 CPU ranks (DS_ACCELERATOR=cpu, gloo). The same tiny LLaMA as
make_dcp_runs.py (transformers' LlamaForCausalLM) is trained 4 steps by deepspeed.initialize with
torch.optim.AdamW ("torch_adam": true; two parameter groups, weight decay 0.1 and 0) twice:
- OUT/zero2: ZeRO stage 2 in bfloat16 mixed precision (the module's weights bf16, the fp32 master
  weights and AdamW state partitioned over the ranks);
- OUT/zero3: ZeRO stage 3 in float32 (parameters partitioned too).
engine.save_checkpoint writes OUT/<run>/global_step2 and global_step4 after steps 2 and 4, with
config.json in the run directory.

References come from DeepSpeed's own gather API, not from the files: after each save every rank
calls deepspeed.utils.safe_get_full_fp32_param and safe_get_full_optimizer_state, and rank 0
computes in float64 with transformers' model (tests/python/transformers_reference.py) for the
probe batch OUT/probe.safetensors, at step 2: the delta u = θ4 − θ2 of the fp32 master weights,
and the step torch.optim.AdamW takes from the gathered state on the probe gradient; loss, g·u,
uᵀHu, ‖u‖², L(θ + u) − L(θ) into OUT/reference.json, per run.

usage: DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 make_deepspeed_runs.py OUT
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_dcp_runs import CONFIG, LR, STEPS, T, VOCAB  # noqa: E402
from transformers_reference import audit, load_float64, loss_of  # noqa: E402


def gathered(engine, model):
    """Every rank takes part; rank 0 gets the fp32 masters and AdamW state by name."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    if hasattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state"):
        # ZeRO 1/2 link each parameter to its optimizer-state fragments once, at the first step,
        # before torch's AdamW has made its state; linked again now that it exists.
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()
    params, state = {}, {}
    for name, p in model.named_parameters():
        params[name] = safe_get_full_fp32_param(p).detach().clone().double()
        state[name] = {key: safe_get_full_optimizer_state(p, key).detach().clone()
                       for key in ("exp_avg", "exp_avg_sq")}
    step = engine.optimizer.optimizer.state
    steps = [s["step"] for s in step.values() if "step" in s]
    return params, state, steps[0].clone() if steps else None


def train(out, run, stage, bf16):
    import deepspeed
    torch.manual_seed(0)
    config = LlamaConfig(**CONFIG, attn_implementation="eager")
    model = LlamaForCausalLM(config)
    decay = [p for n, p in model.named_parameters() if "norm" not in n]
    rest = [p for n, p in model.named_parameters() if "norm" in n]
    ds_config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                 "zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16},
                 "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.1,
                                                           "torch_adam": True}}}
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config)
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(1)
    batches = torch.randint(0, VOCAB, (STEPS, 4, T + 1), generator=g)
    saved = {}
    for step in range(1, STEPS + 1):
        batch = batches[step - 1][rank * 2:(rank + 1) * 2]
        loss = loss_of(engine, batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        engine.step()
        if step % 2 == 0:
            engine.save_checkpoint(f"{out}/{run}")
            saved[step] = gathered(engine, model)
    if rank == 0:
        config.save_pretrained(f"{out}/{run}")
    return config, saved


def reference(out, run, config, saved, inputs, targets):
    from safetensors.torch import save_file as save
    folders = {}
    for step, (params, _, _) in saved.items():
        folder = f"{out}/reference/{run}-{step}"
        LlamaForCausalLM(config).to(torch.float64).save_pretrained(folder)
        save({k: v.contiguous() for k, v in params.items()}, f"{folder}/model.safetensors",
             metadata={"format": "pt"})
        folders[step] = folder
    at2, at4 = load_float64(folders[2]), load_float64(folders[4])
    delta = [b.detach() - a.detach() for a, b in zip(at2.parameters(), at4.parameters())]
    ref = {"param_names": [n for n, _ in at2.named_parameters()],
           "delta": audit(at2, inputs, targets, delta)}
    params = dict(at2.named_parameters())
    _, state, step = saved[2]
    decay = [p for n, p in params.items() if "norm" not in n]
    rest = [p for n, p in params.items() if "norm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": rest, "weight_decay": 0.0}], lr=LR, foreach=False)
    for name, p in params.items():
        optimizer.state[p] = {"step": step.clone(),
                              "exp_avg": state[name]["exp_avg"].double(),
                              "exp_avg_sq": state[name]["exp_avg_sq"].double()}
    before = [p.detach().clone() for p in params.values()]
    at2.zero_grad()
    loss_of(at2, inputs, targets).backward()
    optimizer.step()
    u = [p.detach() - b for p, b in zip(params.values(), before)]
    with torch.no_grad():
        for p, b in zip(params.values(), before):
            p.copy_(b)
    ref["adamw"] = audit(at2, inputs, targets, u)
    return ref


def main():
    out = sys.argv[1]
    import deepspeed
    # DeepSpeed's CPU accelerator compiles a shared-memory all-reduce when the process group starts
    # (a minute of g++); gloo runs the same collectives, so the optional op is left out.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    runs = {"zero2": train(out, "zero2", 2, True), "zero3": train(out, "zero3", 3, False)}
    if dist.get_rank() == 0:
        g = torch.Generator().manual_seed(2)
        inputs = torch.randint(0, VOCAB, (3, T), generator=g)
        targets = torch.randint(0, VOCAB, (3, T), generator=g)
        save_file({"inputs": inputs, "targets": targets}, f"{out}/probe.safetensors")
        ref = {"torch": torch.__version__, "deepspeed": deepspeed.__version__}
        for run, (config, saved) in runs.items():
            ref[run] = reference(out, run, config, saved, inputs, targets)
        with open(f"{out}/reference.json", "w") as f:
            json.dump(ref, f, indent=1)
    dist.barrier()


if __name__ == "__main__":
    main()
