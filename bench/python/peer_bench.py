"""One measurement of bench/peers.sh on a Python peer: curvlinops-for-pytorch or
hessian-eigenthings, run as their documentation shows, on the model and probe batches of
peer_models.py. One operation per process, so that /usr/bin/time -v gives each its peak memory.

  --op hvp      H v for the vector in --vector (safetensors by parameter name); writes H v to
                --hvp-out, times a first and a second product
  --op eig      the --eig-top largest eigenvalues to relative tolerance --eig-tol
                curvlinops: scipy's eigsh (ARPACK) on HessianLinearOperator.to_scipy(), as in
                curvlinops' examples; hessian-eigenthings: its `lanczos` (full
                reorthogonalisation), which runs a fixed number of steps, so the number of steps
                doubles from its default 2k until every pair meets the tolerance
  --op trace    Hutchinson (--trace-method hutchinson) or Hutch++ (hutchpp) at --trace-hvps
  --op density  spectral density by Lanczos quadrature, --slq-runs x --slq-steps
  --op setup    loads the model, the batches and the peer, and stops: the memory baseline

Every Hessian-vector product the peer computes is counted by wrapping its operator. Writes a
JSON object to --out.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_models  # noqa: E402


def main():
    a = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--side", choices=["curvlinops", "eigenthings"], required=True)
    a.add_argument("--op", choices=["setup", "hvp", "eig", "trace", "density"], required=True)
    a.add_argument("--run", required=True)
    a.add_argument("--data", required=True)
    a.add_argument("--batch-size", type=int, default=8)
    a.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    a.add_argument("--device", default="cpu")
    a.add_argument("--threads", type=int, default=2)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--vector")
    a.add_argument("--hvp-out")
    a.add_argument("--eig-top", type=int, default=3)
    a.add_argument("--eig-tol", type=float, default=1e-6)
    a.add_argument("--trace-method", default="hutchinson", choices=["hutchinson", "hutchpp"])
    a.add_argument("--trace-hvps", type=int, default=99)
    a.add_argument("--slq-runs", type=int, default=5)
    a.add_argument("--slq-steps", type=int, default=40)
    a.add_argument("--explicit-layer-norm", action="store_true",
                   help="LayerNorm written out in elementary operations instead of nn.LayerNorm "
                        "(torch's forward-mode derivative of layer_norm's backward is inexact)")
    a.add_argument("--out", required=True)
    o = a.parse_args()

    torch.set_num_threads(o.threads)
    torch.manual_seed(o.seed)
    if o.explicit_layer_norm:
        peer_models.explicit_layer_norm()
    dtype = getattr(torch, o.dtype)
    device = torch.device(o.device)
    t_start = time.perf_counter()
    model, config = peer_models.load(o.run, dtype, device)
    batches = peer_models.probe_batches(o.data, o.batch_size, device)
    sizes = {len(x) for x, _ in batches}
    if len(sizes) != 1:
        # hessian-eigenthings weighs every batch equally; the other sides by size.
        sys.exit("peer_bench.py: the probe set must split into equal batches")
    params = [p for p in model.parameters() if p.requires_grad]
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    out = {"side": o.side, "op": o.op, "parameters": n, "dtype": o.dtype, "device": str(device),
           "threads": torch.get_num_threads(), "torch": torch.__version__}
    count = {"hvps": 0}
    sync = (lambda: torch.cuda.synchronize()) if device.type == "cuda" else (lambda: None)

    if o.side == "curvlinops":
        import curvlinops
        from importlib.metadata import version
        out["peer"] = f"curvlinops-for-pytorch {version('curvlinops-for-pytorch')}"

        class LogitsFlat(torch.nn.Module):
            # CrossEntropyLoss wants (N, classes): the same mean over tokens as the other sides.
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                logits = self.m(x)
                return logits.reshape(-1, logits.size(-1))

        wrapped = LogitsFlat(model)
        data = [(x, y.reshape(-1)) for x, y in batches]
        # check_deterministic off: it would spend HVPs on a self-test at construction.
        H = curvlinops.HessianLinearOperator(
            wrapped, torch.nn.CrossEntropyLoss(), params, data, check_deterministic=False,
            num_data=sum(len(x) for x, _ in batches), batch_size_fn=lambda x: x.shape[0])
        inner = H._matmat

        def counted(M):
            count["hvps"] += M[0].shape[-1]
            return inner(M)
        H._matmat = counted

        def hvp_list(v_list):
            return H @ v_list
    else:
        import hessian_eigenthings as he
        out["peer"] = f"hessian-eigenthings {he.__version__}"

        def loss_fn(m, batch):
            x, y = batch
            return peer_models.mean_cross_entropy(m(x), y)
        H = he.HessianOperator(model, batches, loss_fn)
        inner = H.matvec

        def counted_matvec(v):
            count["hvps"] += 1
            return inner(v)
        H.matvec = counted_matvec

        def hvp_list(v_list):
            flat = H.matvec(torch.cat([v.reshape(-1) for v in v_list]))
            return list(torch.split(flat, [p.numel() for p in params]))
    out["setup_seconds"] = time.perf_counter() - t_start

    if o.op == "setup":
        out["hvps"], out["seconds"] = 0, 0.0
    elif o.op == "hvp":
        from safetensors.torch import load_file, save_file
        vec = load_file(o.vector)
        v = [vec[name].to(device=device, dtype=dtype) for name in names]
        times = []
        for _ in range(2):
            sync()
            t = time.perf_counter()
            hv = hvp_list(v)
            sync()
            times.append(time.perf_counter() - t)
        out["seconds_first"], out["seconds_second"] = times
        out["seconds"] = times[0]
        hv = [h.reshape(p.shape) for h, p in zip(hv, params)]
        save_file({nm: h.detach().cpu().contiguous() for nm, h in zip(names, hv)}, o.hvp_out)
        out["hvps"] = count["hvps"]
    elif o.op == "eig":
        k, tol = o.eig_top, o.eig_tol
        t = time.perf_counter()
        if o.side == "curvlinops":
            from scipy.sparse.linalg import eigsh
            v0 = np.random.default_rng(o.seed).standard_normal(n)
            values = eigsh(H.to_scipy(), k=k, which="LA", tol=tol, v0=v0,
                           return_eigenvectors=False)
            out["eigenvalues"] = sorted((float(x) for x in values), reverse=True)
            out["method"] = f"scipy eigsh (ARPACK), which='LA', tol {tol:g}, ncv default"
            out["converged"] = True  # eigsh raises ArpackNoConvergence otherwise
        else:
            steps, attempts = 2 * k, []
            while True:
                r = he.lanczos(H, k=k, max_iter=steps, tol=tol, which="LA", seed=o.seed,
                               reorthogonalize=True)
                attempts.append(steps)
                if bool(r.converged.all()) or steps >= min(n - 1, 1024):
                    break
                steps = min(2 * steps, n - 1)
            out["eigenvalues"] = [float(x) for x in r.eigenvalues]
            out["residuals"] = [float(x) for x in r.residuals]
            out["converged"] = bool(r.converged.all())
            out["attempts"] = attempts
            out["method"] = (f"lanczos(which='LA', tol {tol:g}, reorthogonalize=True), max_iter "
                             f"{'→'.join(map(str, attempts))}")
        sync()
        out["seconds"] = time.perf_counter() - t
        out["hvps"] = count["hvps"]
    elif o.op == "trace":
        m = o.trace_hvps
        t = time.perf_counter()
        if o.side == "curvlinops":
            if o.trace_method == "hutchinson":
                # hutchinson_trace's own lines (curvlinops/trace/hutchinson.py), keeping the
                # per-sample terms for a standard error, which the function does not return.
                from curvlinops.sampling import random_vector
                G = torch.column_stack([random_vector(n, "rademacher", device, dtype)
                                        for _ in range(m)])
                samples = torch.einsum("ij,ij->j", G, H @ G)
                out["estimate"] = float(samples.mean())
                out["standard_error"] = float(samples.std() / m ** 0.5)
                out["method"] = "hutchinson_trace's estimator (one H @ G of all probes)"
            else:
                out["estimate"] = float(curvlinops.hutchpp_trace(H, m))
                out["standard_error"] = None
                out["method"] = "hutchpp_trace (no standard error returned)"
        else:
            r = he.trace(H, num_matvecs=m, seed=o.seed,
                         method="hutch++" if o.trace_method == "hutchpp" else "hutchinson")
            out["estimate"], out["standard_error"] = r.estimate, r.stderr
            out["method"] = f"trace(method='{'hutch++' if o.trace_method == 'hutchpp' else 'hutchinson'}')"
        sync()
        out["seconds"] = time.perf_counter() - t
        out["hvps"] = count["hvps"]
    else:  # density
        runs, steps = o.slq_runs, o.slq_steps
        t = time.perf_counter()
        if o.side == "curvlinops":
            from curvlinops.papyan2020traces.spectrum import (
                LanczosApproximateSpectrumCached, fast_lanczos)
            # The documented entry point: it first estimates the spectrum's ends with eigsh
            # (tol 1e-2), then runs `runs` Lanczos quadratures of `steps` vectors.
            spec = LanczosApproximateSpectrumCached(H, steps)
            boundary_hvps = count["hvps"]
            grid, density = spec.approximate_spectrum(num_repeats=runs, num_points=1024)
            grid, density = grid.double().cpu(), density.double().cpu()
            mass = float(torch.trapezoid(density, grid))
            out["trace_from_density"] = n * float(torch.trapezoid(grid * density, grid)) / mass
            out["boundary_hvps"] = boundary_hvps
            out["boundaries"] = [float(b) for b in spec._boundaries]
            out["nodes_max"] = out["boundaries"][1]
            out["method"] = (f"LanczosApproximateSpectrumCached(ncv={steps}) "
                             f"num_repeats={runs}, boundaries by eigsh tol 1e-2")
        else:
            r = he.spectral_density(H, num_runs=runs, lanczos_steps=steps, seed=o.seed)
            nodes = r.raw_eigenvalues.double().nan_to_num(0.0)
            weights = r.raw_weights.double()
            per_run = n * (weights * nodes).sum(1)
            out["trace_from_density"] = float(per_run.mean())
            out["trace_standard_error"] = float(per_run.std() / runs ** 0.5)
            out["nodes_max"] = float(r.raw_eigenvalues.nan_to_num(-1e300).max())
            out["method"] = f"spectral_density(num_runs={runs}, lanczos_steps={steps})"
        sync()
        out["seconds"] = time.perf_counter() - t
        out["hvps"] = count["hvps"]
    if device.type == "cuda":
        out["peak_device_bytes"] = torch.cuda.max_memory_allocated(device)
    out["total_seconds"] = time.perf_counter() - t_start
    with open(o.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
