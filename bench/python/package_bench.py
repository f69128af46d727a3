#!/usr/bin/env python3
"""The Python package (docs/python.md) on an arbitrary nn.Module, side by side in one invocation:

1. The audit of ndsprobe's `--directions delta` (layer blocks, full coupling, realized change) of
   transformers' LLaMA with eager attention, by curv.Probe.audit and by the same audit written the
   plain way in torch (bench/python/plain_torch_audit.py's algorithm: each probe batch's
   create_graph gradient kept, one second backward per block and batch with the block's direction
   zero-padded over all gradient outputs), on the same model, direction and batches; the numbers
   must agree.
2. The update probe's overhead in a transformers Trainer run: the same training with and without
   curv.CurvatureCallback, seconds per probe and the share of training time.
3. The package driving a built-in architecture: ndsprobe and curv.probe_checkpoints, one after
   the other, on the same built-in GPT run (curvtrain's checkpoints) with the same audit, each on
   the LibTorch 2.x build's kernels; engine seconds from each file's /taylor rows, and wall time.

Prints Markdown tables and writes JSON (--json). usage: package_bench.py [--threads 2] ...
"""
import argparse
import json
import os
import subprocess
import time

import torch
import torch.nn.functional as F


def make_model(args, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.width,
                         intermediate_size=args.mlp, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, max_position_embeddings=args.context,
                         attn_implementation="eager")
    return LlamaForCausalLM(config)


def batches_of(args, count, seed):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, args.vocab, (args.batch, args.context), generator=g)}
            for _ in range(count)]


def layer_blocks(names):
    blocks = {}
    for i, n in enumerate(names):
        parts = n.split(".")
        key = next((".".join(parts[:k + 1]) for k, p in enumerate(parts[:-1]) if p.isdigit()),
                   "embeddings" if "embed" in n else "head")
        blocks.setdefault(key, []).append(i)
    return list(blocks.values())


def plain_audit(model, batches, u):
    """The audit the plain way: g·u, C = [u_lᵀ (H u_m)_l], realized change."""
    import curv
    named = [(n, p) for n, p in model.named_parameters()]
    params = [p for _, p in named]
    uv = [u[n] for n, _ in named]
    blocks = layer_blocks([n for n, _ in named])
    total = sum(b["input_ids"].shape[0] for b in batches)
    model.eval()
    start = time.perf_counter()
    grads, loss, gu = [], 0.0, 0.0
    for b in batches:
        w = b["input_ids"].shape[0] / total
        logits, targets = curv.causal_lm(model, b)
        lb = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        g = torch.autograd.grad(lb, params, create_graph=True)
        grads.append((w, g))
        loss += w * lb.item()
        gu += w * sum((gi * ui).sum().item() for gi, ui in zip(g, uv))
    coupling = torch.zeros(len(blocks), len(blocks), dtype=torch.float64)
    for m, block in enumerate(blocks):
        v = [ui if i in block else torch.zeros_like(ui) for i, ui in enumerate(uv)]
        hv = [torch.zeros_like(p) for p in params]
        for w, g in grads:
            for acc, h in zip(hv, torch.autograd.grad(g, params, grad_outputs=v,
                                                      retain_graph=True)):
                acc.add_(h, alpha=w)
        for l, other in enumerate(blocks):
            coupling[l, m] = sum((uv[i].double() * hv[i].double()).sum() for i in other)
    grads.clear()
    with torch.no_grad():
        for p, ui in zip(params, uv):
            p.add_(ui)
        after = sum(b["input_ids"].shape[0] / total * F.cross_entropy(
            *[t.reshape(-1, t.shape[-1]) if k == 0 else t.reshape(-1)
              for k, t in enumerate(curv.causal_lm(model, b))]).item() for b in batches)
        for p, ui in zip(params, uv):
            p.sub_(ui)
    seconds = time.perf_counter() - start
    return {"loss": loss, "first_order": gu, "curvature": coupling.sum().item(),
            "realized": after - loss, "seconds": seconds}


def audit_side_by_side(args):
    import curv
    model = make_model(args)
    batches = batches_of(args, args.probe // args.batch, 1)
    g = torch.Generator().manual_seed(2)
    u = {n: torch.randn(p.shape, generator=g) * 1e-3 for n, p in model.named_parameters()}
    params = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    probe = curv.Probe(model, batches)
    audit = probe.audit(u)
    package = {"loss": audit.loss, "first_order": audit.first_order,
               "curvature": audit.curvature, "realized": audit.realized,
               "seconds": time.perf_counter() - start, "engine_seconds": audit.seconds}
    plain = plain_audit(model, batches, u)
    worst = max(abs(package[k] - plain[k]) / max(abs(plain[k]), 1e-30)
                for k in ("loss", "first_order", "curvature", "realized"))
    return {"parameters": params, "package": package, "plain": plain, "worst_rel_diff": worst,
            "blocks": len(probe.blocks)}


def train(args, callbacks, out):
    from transformers import Trainer, TrainingArguments
    model = make_model(args, seed=1)
    data = [{"input_ids": b["input_ids"][0], "labels": b["input_ids"][0]}
            for b in batches_of(args, args.train_steps * args.batch, 3)]
    targs = TrainingArguments(out, max_steps=args.train_steps, per_device_train_batch_size=args.batch,
                              learning_rate=1e-3, save_strategy="no", report_to=[],
                              use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
                              logging_steps=args.train_steps)
    start = time.perf_counter()
    Trainer(model=model, args=targs, train_dataset=data, callbacks=callbacks).train()
    return time.perf_counter() - start


def callback_overhead(args, tmp):
    """Training alone, then with the probe at full coupling (one HVP per block) and with
    coupling none (one HVP), each in a fresh results file."""
    import shutil
    import curv
    plain = train(args, [], f"{tmp}/plain")
    out = {"steps": args.train_steps, "every": args.every, "train_seconds": plain}
    for name, coupling in (("full", curv.Coupling.FULL), ("none", curv.Coupling.NONE)):
        shutil.rmtree(f"{tmp}/{name}", ignore_errors=True)
        callback = curv.CurvatureCallback(batches_of(args, args.probe // args.batch, 1),
                                          every=args.every, coupling=coupling,
                                          path=f"{tmp}/{name}/probe.h5")
        probed = train(args, [callback], f"{tmp}/{name}")
        probes = len(callback.probe.audits)
        out[name] = {"probes": probes, "train_with_probe_seconds": probed,
                     "seconds_per_probe": sum(callback.probe.seconds) / probes,
                     "overhead_share": (probed - plain) / plain}
    return out


def audit_seconds(path):
    """The units' audit seconds as the file records them (each unit's `seconds` attribute)."""
    import h5py
    total = []

    def visit(name, obj):
        if isinstance(obj, h5py.Group) and "seconds" in obj.attrs and "nds" in obj.attrs:
            total.append(float(obj.attrs["seconds"]))
    with h5py.File(path) as f:
        f["runs"].visititems(visit)
    return sum(total)


def builtin_side_by_side(args, tmp):
    import curv
    tools = os.path.join(args.build, "tools")
    run = f"{tmp}/gpt/run"
    if not os.path.exists(f"{run}/step_20/model.safetensors"):
        os.makedirs(f"{tmp}/gpt", exist_ok=True)
        with open(f"{tmp}/gpt/model.json", "w") as f:
            json.dump({"arch": "gpt", "vocab_size": args.vocab, "block_size": args.context,
                       "n_layer": args.gpt_layers, "n_head": args.heads, "n_embd": args.width,
                       "bias": True, "tied": True}, f)
        subprocess.run([f"{tools}/curvtrain/curvtrain", "--model", f"{tmp}/gpt/model.json", "-o",
                        run, "--steps", "20", "--save-every", "10", "--eval-every", "20",
                        "--eval-sequences", "16", "--batch-size", "8", "--probe-sequences",
                        str(2 * args.probe), "--train-tokens", "262144", "--threads",
                        str(args.threads), "--quiet"], check=True)
    data = f"{run}/probe.safetensors"
    # The two drivers alternate, each --repeats times; the best of each is compared.
    sides = {"ndsprobe": [], "package": []}
    for _ in range(args.repeats):
        start = time.perf_counter()
        subprocess.run([f"{tools}/ndsprobe/ndsprobe", run, "--data", data, "--directions",
                        "delta", "--batch-size", "16", "--threads", str(args.threads), "--quiet",
                        "-o", f"{tmp}/gpt/ndsprobe.h5"], check=True, capture_output=True)
        sides["ndsprobe"].append((audit_seconds(f"{tmp}/gpt/ndsprobe.h5"),
                                  time.perf_counter() - start))
        start = time.perf_counter()
        result = curv.probe_checkpoints(run, data, directions=("delta",), batch_size=16,
                                        output=f"{tmp}/gpt/package.h5")
        sides["package"].append((audit_seconds(result.output), time.perf_counter() - start))
    out = {side: {"engine_seconds": min(e for e, _ in runs), "wall_seconds": min(w for _, w in runs),
                  "runs": runs} for side, runs in sides.items()}
    return {**out, "units": int(result.summary["units"]), "probe": 2 * args.probe}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--mlp", type=int, default=688)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--probe", type=int, default=32, help="probe sequences")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--train-steps", type=int, default=100)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--gpt-layers", type=int, default=6, help="layers of the built-in GPT")
    p.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                   "build-torch2"),
                   help="the LibTorch 2.x build whose ndsprobe and curvtrain run beside it")
    p.add_argument("--repeats", type=int, default=3, help="runs of each built-in driver")
    p.add_argument("--skip", nargs="*", default=[], choices=["audit", "callback", "builtin"])
    p.add_argument("--tmp", default="/tmp/curv_package_bench")
    p.add_argument("--json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import curv
    # Every side of every comparison under the allocator settings the package sets up (the plain
    # torch audit and the training without the callback included).
    curv.init_runtime()
    result = {"runtime": curv.runtime_summary(), "torch": torch.__version__}
    for name, run in (("audit", lambda: audit_side_by_side(args)),
                      ("callback", lambda: callback_overhead(args, args.tmp)),
                      ("builtin", lambda: builtin_side_by_side(args, args.tmp))):
        if name not in args.skip:
            result[name] = run()
    report(args, result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def report(args, result):
    if "builtin" in result:
        b = result["builtin"]
        print(f"Built-in GPT ({args.gpt_layers} layers, width {args.width}, {b['probe']} probe "
              f"sequences of {args.context}), --directions delta, {b['units']} units, "
              f"{args.threads} threads ({result['runtime']})")
        print(f"\nbest of {args.repeats}, alternating\n\n| driver | engine seconds | wall seconds | "
              "engine vs ndsprobe |\n|---|---|---|---|")
        for side in ("ndsprobe", "package"):
            print(f"| {side} | {b[side]['engine_seconds']:.2f} | {b[side]['wall_seconds']:.2f} | "
                  f"{b[side]['engine_seconds'] / b['ndsprobe']['engine_seconds']:.3f}x |")
    if "audit" in result:
        report_audit(args, result)
    if "callback" in result:
        report_callback(result["callback"])


def report_audit(args, result):
    a = result["audit"]
    print(f"LLaMA of {a['parameters'] / 1e6:.2f}M parameters, {args.probe} x {args.context} "
          f"tokens, {a['blocks']} blocks, {args.threads} threads ({result['runtime']})")
    print("\n| audit | seconds | vs plain torch |\n|---|---|---|")
    for side in ("package", "plain"):
        print(f"| {side} | {a[side]['seconds']:.2f} | "
              f"{a[side]['seconds'] / a['plain']['seconds']:.2f}x |")
    print(f"\nworst relative difference {a['worst_rel_diff']:.1e}")
    for k in ("loss", "first_order", "curvature", "realized"):
        print(f"{k}: package {a['package'][k]:.9g}, plain {a['plain'][k]:.9g}")


def report_callback(c):
    print("\n| training | seconds | probes | seconds per probe | overhead |\n|---|---|---|---|---|")
    print(f"| {c['steps']} steps | {c['train_seconds']:.1f} | 0 | | |")
    for name in ("full", "none"):
        r = c[name]
        print(f"| {c['steps']} steps, probe every {c['every']}, coupling {name} | "
              f"{r['train_with_probe_seconds']:.1f} | {r['probes']} | "
              f"{r['seconds_per_probe']:.2f} | {100 * r['overhead_share']:.1f}% |")


if __name__ == "__main__":
    main()
