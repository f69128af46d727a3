"""Runs saved by torch.distributed.checkpoint (DCP) under FSDP2, and their float64 references.

Launched by torchrun on 2 CPU ranks (gloo). A tiny LLaMA (transformers' LlamaForCausalLM, float64,
eager attention) is sharded with fully_shard (each decoder layer, then the root) and trained 4
steps with torch.optim.AdamW (constant learning rate, weight decay 0.1; torch >= 2.7 records
decoupled_weight_decay in its param_groups). After steps 2 and 4 the sharded state is saved by
dcp.save itself, three ways:

- OUT/accelerate/checkpoint-N/pytorch_model_fsdp_0 and optimizer_0, written by Accelerate's own
  save_fsdp_model and save_fsdp_optimizer (the pinned accelerate; FSDP2, SHARDED_STATE_DICT, an
  Accelerator on the CPU ranks), as its save_state and the Trainer under FSDP write them, with
  config.json in the run directory;
- OUT/titan/step-N/: torchtitan's checkpoint: the model's keys at the top level in torchtitan's
  LLaMA-3 names, the optimizer flattened (flatten_optimizer_state_dict) under "optimizer", and
  train_state as bytes. torchtitan's rotary embedding rotates interleaved pairs, so its wq and wk
  hold the rows of transformers' halved convention permuted within each head (the inverse of
  transformers' convert_llama_weights_to_hf permutation); the same function of the input;
- OUT/titan_safetensors/step-N/: the same with FileSystemWriter(serialization_format=SAFETENSORS).

Rank 0 then gathers the full state and writes the references with transformers' own float64 model
(tests/python/transformers_reference.py's load_float64 and audit): for the probe batch
OUT/probe.safetensors, at step 2, the delta u = θ4 − θ2 and the step torch.optim.AdamW takes from
the saved state on the probe gradient: loss, g·u, uᵀHu, ‖u‖², L(θ + u) − L(θ), into
OUT/reference.json.

OUT/torchtitan/checkpoint/step-N/: the same model trained again from the same start by torchtitan's
own OptimizersContainer (torch.optim.AdamW, one group, for-loop) under a constant
LRSchedulersContainer, and saved by torchtitan's own CheckpointManager (the pinned torchtitan
0.3.0) every 2 steps: its keys are the model's own names (transformers'), at the top level, with
the optimizer flattened. Its references are in OUT/reference.json under "torchtitan".

OUT/forged/KIND/step-2 are copies of OUT/titan/step-2 damaged one way each, for the errors:
overlap, gap and outside (tok_embeddings.weight's second chunk moved or shrunk in .metadata),
missing (a shard deleted) and truncated (a shard cut in half).

usage: torchrun --nproc_per_node 2 make_dcp_runs.py OUT
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from transformers_reference import audit, load_float64, loss_of  # noqa: E402

VOCAB, T, STEPS, LR = 61, 12, 4, 3e-3
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def titan_name(name):
    """transformers' LLaMA parameter name → torchtitan's LLaMA-3 name."""
    parts = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.weight",
             "lm_head.weight": "output.weight"}
    if name in parts:
        return parts[name]
    renames = [("model.layers.", "layers."), ("self_attn.q_proj", "attention.wq"),
               ("self_attn.k_proj", "attention.wk"), ("self_attn.v_proj", "attention.wv"),
               ("self_attn.o_proj", "attention.wo"), ("mlp.gate_proj", "feed_forward.w1"),
               ("mlp.down_proj", "feed_forward.w2"), ("mlp.up_proj", "feed_forward.w3"),
               ("input_layernorm", "attention_norm"), ("post_attention_layernorm", "ffn_norm")]
    for old, new in renames:
        name = name.replace(old, new)
    return name


def interleave_rows(name, t, config):
    """wq / wk rows from transformers' halved rotary order into torchtitan's interleaved order:
    within each head, row j of the first half goes to 2j, of the second half to 2j + 1."""
    heads = {"self_attn.q_proj": config.num_attention_heads,
             "self_attn.k_proj": config.num_key_value_heads}
    n = next((h for key, h in heads.items() if key in name), None)
    if n is None:
        return t
    d = t.shape[0] // n
    return t.reshape(n, 2, d // 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


def permuted(name, t, config):
    """`t` (a sharded DTensor or a tensor) with interleave_rows applied, sharded as before."""
    if not isinstance(t, DTensor) or t.dim() == 0:
        return interleave_rows(name, t, config) if t.dim() > 0 else t
    full = interleave_rows(name, t.full_tensor(), config)
    return distribute_tensor(full, t.device_mesh, t.placements)


def titan_state(model, optimizer, config, step):
    state = {}
    for name, t in get_model_state_dict(model).items():
        state[titan_name(name)] = permuted(name, t, config)
    flat = get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(flatten_optimizer_state_dict=True))
    for key, value in flat.items():
        # state.<fqn>.<key> and param_groups.<fqn>.<key>
        kind, rest = key.split(".", 1)
        fqn, field = rest.rsplit(".", 1)
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            value = permuted(fqn, value, config)
        state[f"optimizer.{kind}.{titan_name(fqn)}.{field}"] = value
    state["train_state"] = {"step": step}
    return state


def save(model, optimizer, config, out, step):
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import save_fsdp_model, save_fsdp_optimizer
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(cpu=True)
    folder = f"{out}/accelerate/checkpoint-{step}"
    save_fsdp_model(plugin, accelerator, model, folder)
    save_fsdp_optimizer(plugin, accelerator, optimizer, model, folder)
    dcp.save(titan_state(model, optimizer, config, step),
             storage_writer=dcp.FileSystemWriter(f"{out}/titan/step-{step}"))
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    dcp.save(titan_state(model, optimizer, config, step),
             storage_writer=dcp.FileSystemWriter(f"{out}/titan_safetensors/step-{step}",
                                                 serialization_format=SerializationFormat.SAFETENSORS))
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
    optim = get_optimizer_state_dict(model, optimizer,
                                     options=StateDictOptions(full_state_dict=True,
                                                              cpu_offload=True))
    # Copies: a CPU tensor the state dict returns may be the live one (the unsharded 'step'),
    # which later steps update in place.
    import copy
    return ({k: v.detach().clone() for k, v in full.items()}, copy.deepcopy(optim))


def forge(out):
    """Damaged copies of titan/step-2 (see the module's docstring)."""
    import copy
    import pickle
    import shutil
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
    source = f"{out}/titan/step-2"
    key = "tok_embeddings.weight"
    moves = {"overlap": ((20, 0), (30, 32)), "gap": ((31, 0), (29, 32)),
             "outside": ((40, 0), (30, 32))}
    for kind in ("overlap", "gap", "outside", "missing", "truncated"):
        folder = f"{out}/forged/{kind}/step-2"
        shutil.copytree(source, folder)
        if kind == "missing":
            os.remove(f"{folder}/__1_0.distcp")
        elif kind == "truncated":
            path = f"{folder}/__1_0.distcp"
            os.truncate(path, os.path.getsize(path) // 2)
        else:
            with open(f"{folder}/.metadata", "rb") as f:
                metadata = pickle.load(f)
            tensor = metadata.state_dict_metadata[key]
            old = tensor.chunks[1]
            offsets, sizes = moves[kind]
            tensor.chunks[1] = ChunkStorageMetadata(offsets=torch.Size(offsets),
                                                    sizes=torch.Size(sizes))
            old_index = MetadataIndex(key, old.offsets, 0)
            info = next(v for k, v in metadata.storage_data.items()
                        if k.fqn == key and tuple(k.offset) == tuple(old.offsets))
            metadata.storage_data = {k: v for k, v in metadata.storage_data.items()
                                     if not (k.fqn == key and tuple(k.offset) == tuple(old.offsets))}
            metadata.storage_data[MetadataIndex(key, torch.Size(offsets), 0)] = copy.copy(info)
            del old_index
            with open(f"{folder}/.metadata", "wb") as f:
                pickle.dump(metadata, f)
        for name in ("config.json",):
            shutil.copy(f"{out}/titan/{name}", f"{out}/forged/{kind}/{name}")


def adamw_step(folder, optim_state, inputs, targets):
    """The step torch.optim.AdamW takes from the gathered state on the probe gradient."""
    model = load_float64(folder)
    params = dict(model.named_parameters())
    group = {k: v for k, v in optim_state["param_groups"][0].items() if k != "params"}
    optimizer = torch.optim.AdamW(list(params.values()), **{
        k: group[k] for k in ("lr", "betas", "eps", "weight_decay", "amsgrad")}, foreach=False)
    for name, p in params.items():
        optimizer.state[p] = {k: v.clone() for k, v in optim_state["state"][name].items()}
    before = [p.detach().clone() for p in params.values()]
    model.zero_grad()
    loss_of(model, inputs, targets).backward()
    optimizer.step()
    return [p.detach() - b for p, b in zip(params.values(), before)]


def torchtitan_run(out, config, batches, rank):
    """The model trained and saved by torchtitan's own optimizer container and checkpointer."""
    from torchtitan.components.checkpointer.dcp import CheckpointManager
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float64)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizers = OptimizersContainer(
        OptimizersContainer.Config(
            param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                           optimizer_kwargs={"lr": LR, "weight_decay": 0.1})],
            implementation="for-loop"),
        model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=0, decay_ratio=0.0).build(
        optimizers=optimizers, training_steps=STEPS)
    checkpointer = CheckpointManager(
        CheckpointManager.Config(enable=True, folder="checkpoint", interval=2, keep_latest_k=0,
                                 last_save_model_only=False),
        dataloader=None, model_parts=[model], optimizers=optimizers, lr_schedulers=schedulers,
        states={}, sd_adapter=None, base_folder=f"{out}/torchtitan")
    saved = {}
    for step in range(1, STEPS + 1):
        batch = batches[step - 1][rank * 2:(rank + 1) * 2]
        optimizers.zero_grad()
        loss_of(model, batch[:, :-1], batch[:, 1:]).backward()
        optimizers.step()
        schedulers.step()
        checkpointer.save(step, last_step=step == STEPS)
        if step % 2 == 0:
            import copy
            full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                        cpu_offload=True))
            optim = get_optimizer_state_dict(model, optimizers.optimizers[0],
                                             options=StateDictOptions(full_state_dict=True,
                                                                      cpu_offload=True))
            saved[step] = ({k: v.detach().clone() for k, v in full.items()}, copy.deepcopy(optim))
    checkpointer.close()
    return saved


def references(out, run, config, saved, inputs, targets):
    """The float64 audits of the delta and the AdamW step at step 2 of `saved`."""
    for step, (full, _) in saved.items():
        folder = f"{out}/reference/{run}-{step}"
        LlamaForCausalLM(config).to(torch.float64).save_pretrained(folder)
        save_file({k: v.contiguous() for k, v in full.items()}, f"{folder}/model.safetensors",
                  metadata={"format": "pt"})
    at2 = load_float64(f"{out}/reference/{run}-2")
    at4 = load_float64(f"{out}/reference/{run}-4")
    delta = [b.detach() - a.detach() for a, b in zip(at2.parameters(), at4.parameters())]
    ref = {"param_names": [n for n, _ in at2.named_parameters()],
           "delta": audit(at2, inputs, targets, delta)}
    step_u = adamw_step(f"{out}/reference/{run}-2", saved[2][1], inputs, targets)
    ref["adamw"] = audit(at2, inputs, targets, step_u)
    return ref


def main():
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    config = LlamaConfig(**CONFIG, attn_implementation="eager")
    model = LlamaForCausalLM(config).to(torch.float64)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1, foreach=False)
    g = torch.Generator().manual_seed(1)
    batches = torch.randint(0, VOCAB, (STEPS, 4, T + 1), generator=g)
    saved = {}
    for step in range(1, STEPS + 1):
        batch = batches[step - 1][rank * 2:(rank + 1) * 2]
        loss = loss_of(model, batch[:, :-1], batch[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 2 == 0:
            saved[step] = save(model, optimizer, config, out, step)
    titan_saved = torchtitan_run(out, config, batches, rank)
    if rank == 0:
        os.makedirs(f"{out}/reference", exist_ok=True)
        for run in ("accelerate", "titan", "titan_safetensors", "torchtitan/checkpoint"):
            config.save_pretrained(f"{out}/{run}")
        inputs = torch.randint(0, VOCAB, (3, T), generator=g)
        targets = torch.randint(0, VOCAB, (3, T), generator=g)
        save_file({"inputs": inputs, "targets": targets}, f"{out}/probe.safetensors")
        ref = {"torch": torch.__version__,
               **references(out, "fsdp", config, saved, inputs, targets),
               "torchtitan": references(out, "torchtitan", config, titan_saved, inputs, targets)}
        with open(f"{out}/reference.json", "w") as f:
            json.dump(ref, f, indent=1)
        forge(out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Every file is written and closed here. The interpreter's own teardown can abort a rank
    # ("terminate called without an active exception": a C++ thread destroyed while still
    # joinable; one run in three here), failing a fixture that is complete; leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
