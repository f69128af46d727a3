#!/usr/bin/python3
"""Writes the seed corpora of the fuzz harnesses (fuzz/fuzz_<name>.cpp), small valid inputs of
every reader, with Debian's torch, numpy and h5py. Deterministic; about 200 KB in all.

Usage: make_seeds.py OUT_DIR     (OUT_DIR/<harness>/ receives the seeds; scripts/fuzz.sh runs it)
"""
import collections
import io
import json
import os
import struct
import sys

import h5py
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def put(out, harness, name, data):
    folder = os.path.join(out, harness)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors_bytes(tensors, metadata=None, dtypes=None):
    """safetensors by hand (Debian has no safetensors package); dtypes overrides a tag."""
    tags = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
            torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
            torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 \
            else t.numpy().tobytes()
        tag = (dtypes or {}).get(name, tags[t.dtype])
        header[name] = {"dtype": tag, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def torch_bytes(obj, protocol=2):
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_protocol=protocol)
    return buf.getvalue()


# nanoGPT's parameter names for n_layer=1, n_embd=4, vocab 5, block 4, no biases.
def nanogpt_state():
    g = torch.Generator().manual_seed(0)
    shapes = collections.OrderedDict([
        ("transformer.wte.weight", (5, 4)), ("transformer.wpe.weight", (4, 4)),
        ("transformer.h.0.ln_1.weight", (4,)), ("transformer.h.0.attn.c_attn.weight", (12, 4)),
        ("transformer.h.0.attn.c_proj.weight", (4, 4)), ("transformer.h.0.ln_2.weight", (4,)),
        ("transformer.h.0.mlp.c_fc.weight", (16, 4)), ("transformer.h.0.mlp.c_proj.weight", (4, 16)),
        ("transformer.ln_f.weight", (4,))])
    sd = collections.OrderedDict((k, torch.randn(s, generator=g)) for k, s in shapes.items())
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    return sd


def optimizer_state(sd):
    params = [torch.nn.Parameter(t.clone()) for k, t in sd.items() if k != "lm_head.weight"]
    decay = [p for p in params if p.dim() >= 2]
    nodecay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": nodecay, "weight_decay": 0.0}], lr=1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    return opt.state_dict()


def main():
    out = sys.argv[1]
    g = torch.Generator().manual_seed(1)

    # safetensors
    put(out, "safetensors", "f32.safetensors",
        safetensors_bytes({"a": torch.randn(2, 3, generator=g), "b": torch.tensor(1.5)},
                          {"format": "pt"}))
    put(out, "safetensors", "mixed.safetensors", safetensors_bytes(collections.OrderedDict([
        ("f64", torch.randn(3, generator=g, dtype=torch.float64)),
        ("bf16", torch.randn(2, 2, generator=g).bfloat16()),
        ("f16", torch.randn(2, generator=g).half()),
        ("i64", torch.arange(4)), ("i32", torch.arange(3, dtype=torch.int32)),
        ("u8", torch.arange(5, dtype=torch.uint8)), ("b", torch.tensor([True, False])),
        ("empty", torch.zeros(0, 3))])))
    # Dtypes LibTorch 1.13 lacks, widened on read.
    put(out, "safetensors", "widened.safetensors", safetensors_bytes(
        collections.OrderedDict([("u16", torch.arange(4, dtype=torch.int16)),
                                 ("u32", torch.arange(2, dtype=torch.int32)),
                                 ("u64", torch.arange(2)),
                                 ("e4m3", torch.arange(4, dtype=torch.uint8)),
                                 ("e5m2", torch.arange(4, dtype=torch.uint8))]),
        dtypes={"u16": "U16", "u32": "U32", "u64": "U64", "e4m3": "F8_E4M3", "e5m2": "F8_E5M2"}))
    put(out, "safetensors", "model.safetensors", safetensors_bytes(nanogpt_state()))

    # torch.save files
    base = torch.arange(12, dtype=torch.float32)
    values = collections.OrderedDict([
        ("f32", torch.randn(2, 3, generator=g)), ("f64", torch.randn(2, dtype=torch.float64)),
        ("f16", torch.ones(2).half()), ("bf16", torch.ones(2).bfloat16()),
        ("i64", torch.arange(3)), ("i32", torch.arange(3, dtype=torch.int32)),
        ("i16", torch.arange(3, dtype=torch.int16)), ("i8", torch.arange(3, dtype=torch.int8)),
        ("u8", torch.arange(3, dtype=torch.uint8)), ("bool", torch.tensor([True, False])),
        ("view", base[2:8].view(2, 3)), ("strided", base.view(3, 4).t()), ("shared", base),
        ("param", torch.nn.Parameter(torch.ones(2))), ("scalar", torch.tensor(2.0)),
        ("nested", {"list": [1, 2.5, "x", None, True], "tuple": (1, (2, 3)), "bytes": b"ab"}),
        ("big", 2 ** 70), ("neg", -5)])
    put(out, "torch_file", "values.pt", torch_bytes(values))
    put(out, "torch_file", "values_p4.pt", torch_bytes(values, protocol=4))
    put(out, "torch_file", "list.pt", torch_bytes([1, 2, 3]))
    sd = nanogpt_state()
    opt = optimizer_state(sd)
    put(out, "torch_file", "optimizer.pt", torch_bytes(opt))

    # torch checkpoints: first byte 0 nanoGPT ckpt.pt, 1 step_<N>.pt, 2 HF optimizer.pt
    model_args = dict(n_layer=1, n_head=1, n_embd=4, block_size=4, bias=False, vocab_size=5,
                      dropout=0.0)
    ckpt = {"model": sd, "optimizer": opt, "model_args": model_args, "iter_num": 5,
            "best_val_loss": torch.tensor(1.25), "config": {"learning_rate": 1e-3}}
    put(out, "torch_checkpoint", "nanogpt.bin", b"\x00" + torch_bytes(ckpt))
    compiled = dict(ckpt, model=collections.OrderedDict(
        ("_orig_mod." + k, v) for k, v in sd.items()))
    put(out, "torch_checkpoint", "compiled.bin", b"\x00" + torch_bytes(compiled))
    put(out, "torch_checkpoint", "step_dict.bin", b"\x01" + torch_bytes({"model": sd,
                                                                          "optimizer": opt}))
    put(out, "torch_checkpoint", "step_state.bin", b"\x01" + torch_bytes(sd))
    put(out, "torch_checkpoint", "hf_optimizer.bin", b"\x02" + torch_bytes(
        optimizer_state(collections.OrderedDict([("transformer.wte.weight", torch.ones(2, 2))]))))

    # JSON configs: built-in model configs, Hugging Face config.json, meta.json
    for name in sorted(os.listdir(os.path.join(ROOT, "examples", "configs"))):
        with open(os.path.join(ROOT, "examples", "configs", name), "rb") as f:
            put(out, "json_config", name, f.read())
    hf_llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32,
                "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                "num_attention_heads": 2, "num_key_value_heads": 1,
                "max_position_embeddings": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32"}
    hf_qwen = dict(hf_llama, model_type="qwen2", use_sliding_window=False, sliding_window=8,
                   max_window_layers=1)
    hf_mistral = dict(hf_llama, model_type="mistral", sliding_window=None)
    hf_gpt2 = {"model_type": "gpt2", "vocab_size": 11, "n_positions": 6, "n_embd": 8,
               "n_layer": 2, "n_head": 2, "activation_function": "gelu_new",
               "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True}
    for name, cfg in [("hf_llama", hf_llama), ("hf_qwen2", hf_qwen), ("hf_mistral", hf_mistral),
                      ("hf_gpt2", hf_gpt2)]:
        put(out, "json_config", name + ".json", json.dumps(cfg, indent=1))
    meta = {"step": 3, "model": {"arch": "gpt", "vocab_size": 11, "block_size": 6, "n_layer": 2,
                                 "n_head": 2, "n_embd": 8, "bias": True, "tied": True},
            "optimizer": {"name": "adamw", "hyper": {"lr": 1e-3, "beta1": 0.9, "beta2": 0.95,
                                                     "eps": 1e-8, "weight_decay": 0.1},
                          "step_count": 3, "muon_params": "hidden",
                          "partition": {"transformer.wte.weight": "adam"},
                          "param_order": "model",
                          "param_groups": [{"params": ["transformer.wte.weight"],
                                            "hyper": {"lr": 1e-3}}]},
            "seed": 0, "extra": [1, 2, {"x": None}]}
    put(out, "json_config", "meta.json", json.dumps(meta, indent=1))

    # Hugging Face folders: config.json \n--\n index.json \n--\n trainer_state.json
    shard = "model-00001-of-00001.safetensors"
    index = {"metadata": {"total_size": 16}, "weight_map": {"transformer.wte.weight": shard}}
    trainer = {"global_step": 7, "epoch": 1.0, "log_history": [{"loss": 2.5, "step": 7}]}
    for name, cfg in [("llama", hf_llama), ("gpt2", hf_gpt2), ("qwen2", hf_qwen)]:
        put(out, "hf_folder", name, "\n--\n".join(
            [json.dumps(cfg, indent=1), json.dumps(index, indent=1), json.dumps(trainer)]))
    put(out, "hf_folder", "no_trainer_state", "\n--\n".join(
        [json.dumps(hf_gpt2), json.dumps(index), ""]))

    # uint16 token files: two parameter bytes (window length, count), then the tokens
    tokens = np.arange(64, dtype="<u2") % 50
    put(out, "token_file", "tokens.bin", bytes([8, 4]) + tokens.tobytes())
    put(out, "token_file", "short.bin", bytes([4, 2]) + tokens[:6].tobytes())

    # HDF5 results files like ndsprobe's (root provenance, tables, digests)
    for name, extra in [("report.h5", True), ("plain.h5", False)]:
        path = os.path.join(out, "h5_resume", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with h5py.File(path, "w", libver="earliest") as f:
            for key, value in [("tool", "ndsprobe"), ("model", "gpt"), ("dtype", "float64"),
                               ("probe_hash", "abc"), ("blocks", "layer"), ("seed", "0"),
                               ("schema", "ndsprobe/3")]:
                f.attrs[key] = value
            f.attrs["threads"] = np.int64(1)
            f.attrs["values"] = np.array([1.0, 2.0])
            f.attrs["names"] = np.array([b"a", b"b"], dtype=h5py.string_dtype())
            t = f.create_group("taylor")
            t.attrs["columns"] = np.array([b"run", b"step", b"nds"], dtype=h5py.string_dtype())
            t["run"] = np.array([b"adamw", b"adamw"], dtype=h5py.string_dtype())
            t["step"] = np.array([2, 3], dtype=np.int64)
            t["nds"] = np.array([0.5, 0.25])
            if extra:
                s = f.create_group("runs/adamw/step_2")
                s.attrs["checkpoint_digest"] = "crc32:01234567 bytes:10"
                s.attrs["loss"] = 2.5
                u = s.create_group("delta")
                u["blocks/nds"] = np.array([[1.0, 2.0], [3.0, 4.0]])
                u["names"] = np.array([b"x"], dtype=h5py.string_dtype())
                u["scalar"] = np.float64(1.0)
                u["i32"] = np.arange(3, dtype=np.int32)


def dcp_seed(out):
    """A DCP folder as fuzz_dcp takes it: .metadata, then the shard. Debian's torch has no
    torch.distributed.checkpoint, so its classes are stood in for by classes of the same module
    and name, which pickle as DCP's do (the tests use the real writer)."""
    import dataclasses
    import pickle
    import types

    def module(name, **classes):
        m = types.ModuleType(name)
        for cls_name, cls in classes.items():
            cls.__module__, cls.__qualname__, cls.__name__ = name, cls_name, cls_name
            setattr(m, cls_name, cls)
        sys.modules[name] = m
        return m

    dc = dataclasses.dataclass
    meta = module("torch.distributed.checkpoint.metadata",
                  ChunkStorageMetadata=dc(type("C", (), {"__annotations__": {
                      "offsets": object, "sizes": object}})),
                  TensorStorageMetadata=dc(type("T", (), {"__annotations__": {
                      "properties": object, "size": object, "chunks": object}})),
                  BytesStorageMetadata=dc(type("B", (), {})),
                  MetadataIndex=dc(frozen=True)(type("I", (), {"__annotations__": {
                      "fqn": str, "offset": object, "index": object}})),
                  Metadata=dc(type("M", (), {"__annotations__": {
                      "state_dict_metadata": object, "planner_data": object,
                      "storage_data": object}})))
    props = type("TensorProperties", (), {
        "__init__": lambda self, dtype: setattr(self, "dtype", dtype),
        "__getstate__": lambda self: (self.dtype, torch.strided, False, 0, False),
    })
    module("torch.distributed.checkpoint.metadata", TensorProperties=props, **{
        k: getattr(meta, k) for k in ("ChunkStorageMetadata", "TensorStorageMetadata",
                                      "BytesStorageMetadata", "MetadataIndex", "Metadata")})
    fs = module("torch.distributed.checkpoint.filesystem",
                _StorageInfo=dc(type("S", (), {"__annotations__": {
                    "relative_path": str, "offset": int, "length": int}})))
    m = sys.modules["torch.distributed.checkpoint.metadata"]
    shard, tensors, storage = b"", {}, {}
    g = torch.Generator().manual_seed(3)
    for name, t, at in [("w", torch.randn(4, 3, generator=g), (0, 0)),
                        ("w", torch.randn(2, 3, generator=g), (4, 0)),
                        ("step", torch.tensor(2.0), ())]:
        record = torch_bytes(t)
        key = m.MetadataIndex(name, torch.Size(at), 0)
        storage[key] = fs._StorageInfo("__0_0.distcp", len(shard), len(record))
        shard += record
        chunk = m.ChunkStorageMetadata(torch.Size(at), t.shape)
        if name in tensors:
            tensors[name].chunks.append(chunk)
        else:
            size = torch.Size((6, 3)) if name == "w" else torch.Size(())
            tensors[name] = m.TensorStorageMetadata(props(t.dtype), size, [chunk])
    record = torch_bytes(1e-3)
    storage[m.MetadataIndex("lr", None, None)] = fs._StorageInfo("__0_0.distcp", len(shard),
                                                                 len(record))
    shard += record
    tensors["lr"] = m.BytesStorageMetadata()
    pickled = pickle.dumps(m.Metadata(tensors, {}, storage), protocol=4)
    put(out, "dcp", "two_chunks", pickled + b"\n--\n" + shard)


if __name__ == "__main__":
    main()
    dcp_seed(sys.argv[1])
