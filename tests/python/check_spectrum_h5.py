"""Checks the spectrum results of an ndsprobe HDF5 file with h5py.

Usage: check_spectrum_h5.py FILE RUN STEPS DIRECTIONS TOP BOTTOM ADAM_STEPS
  STEPS, DIRECTIONS and ADAM_STEPS comma-separated; ADAM_STEPS are the checkpoints saved with
  Adam state (the others must record the preconditioned sharpness as unavailable).
Expects --spectrum --spectrum-blocks --trace hutchpp --density --precond-sharpness --overlap.
Exits non-zero with a message on the first violated property.
"""
import sys

import h5py
import numpy as np


def fail(msg):
    print(f"check_spectrum_h5.py: {msg}")
    sys.exit(1)


def strings(ds):
    return [x.decode() if isinstance(x, bytes) else x for x in ds[()]]


def main():
    path, run = sys.argv[1], sys.argv[2]
    steps = [int(s) for s in sys.argv[3].split(",")]
    directions = sys.argv[4].split(",")
    top, bottom = int(sys.argv[5]), int(sys.argv[6])
    adam_steps = {int(s) for s in sys.argv[7].split(",") if s}
    with h5py.File(path, "r") as f:
        block_names = f.attrs["block_names"]
        block_names = (block_names.decode() if isinstance(block_names, bytes) else block_names).split(",")
        for step in steps:
            g = f[f"runs/{run}/step_{step}/spectrum"]
            if g.attrs["hvps"] <= 0:
                fail(f"step {step}: spectrum hvps {g.attrs['hvps']}")
            e = g["eigen"]
            cols = list(e.attrs["columns"])
            cols = [c.decode() if isinstance(c, bytes) else c for c in cols]
            for c in ["block", "which", "rank", "eigenvalue", "residual", "error_bound", "hvps", "converged"]:
                if c not in cols:
                    fail(f"step {step}: eigen column {c} missing")
            block = np.array(strings(e["block"]))
            which = np.array(strings(e["which"]))
            value = e["eigenvalue"][()]
            residual = e["residual"][()]
            if set(block) != set(["total"] + block_names):
                fail(f"step {step}: eigen blocks {sorted(set(block))} != total + {block_names}")
            tot = block == "total"
            lmax = value[tot & (which == "largest")]
            lmin = value[tot & (which == "smallest")]
            if len(lmax) != top or len(lmin) != bottom:
                fail(f"step {step}: {len(lmax)} largest / {len(lmin)} smallest, want {top} / {bottom}")
            if np.any(np.diff(lmax) > 0) or np.any(np.diff(lmin) < 0):
                fail(f"step {step}: eigenvalues out of order {lmax} {lmin}")
            if not np.all(e["converged"][()][tot] == 1):
                fail(f"step {step}: global solve did not converge")
            scale = max(abs(lmax[0]), abs(lmin[0]))
            if np.any(residual[tot] > 1e-4 * scale):
                fail(f"step {step}: residuals {residual[tot]} vs scale {scale}")
            # Cauchy interlacing: a principal sub-matrix's spectrum lies inside H's.
            for b in block_names:
                sel = block == b
                bmax = value[sel & (which == "largest")]
                bmin = value[sel & (which == "smallest")]
                if bmax.size and bmax[0] > lmax[0] + 1e-6 * scale:
                    fail(f"step {step}: block {b} λ_max {bmax[0]} > global {lmax[0]}")
                if bmin.size and bmin[0] < lmin[0] - 1e-6 * scale:
                    fail(f"step {step}: block {b} λ_min {bmin[0]} < global {lmin[0]}")

            t = g["trace"]
            tb = np.array(strings(t["block"]))
            est, se = t["estimate"][()], t["standard_error"][()]
            if not np.all(np.isfinite(se)) or np.any(se < 0):
                fail(f"step {step}: trace standard errors {se}")
            total = est[tb == "total"][0]
            total_se = se[tb == "total"][0]
            parts = est[tb != "total"]
            parts_se = np.sqrt(np.sum(se[tb != "total"] ** 2))
            if abs(parts.sum() - total) > 5 * np.hypot(total_se, parts_se) + 1e-9 * abs(total):
                fail(f"step {step}: block traces sum to {parts.sum()}, total {total} ± {total_se}")

            d = g["density"]
            w = d["weights"][()]
            if w.shape != d["nodes"].shape or not np.allclose(w.sum(axis=1), 1.0, atol=1e-10):
                fail(f"step {step}: SLQ weights {w.sum(axis=1)}")
            grid, dens = d["grid"][()], d["density"][()]
            integral = np.sum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))
            if abs(integral - 1) > 1e-3:
                fail(f"step {step}: density integrates to {integral}")
            if not d.attrs["sigma"] > 0:
                fail(f"step {step}: sigma {d.attrs['sigma']}")
            nodes = d["nodes"][()]
            if nodes.max() > lmax[0] + 1e-6 * scale or nodes.min() < lmin[0] - 1e-6 * scale:
                fail(f"step {step}: SLQ nodes [{nodes.min()}, {nodes.max()}] outside [{lmin[0]}, {lmax[0]}]")
            slq_trace, slq_se = d.attrs["trace"], d.attrs["trace_standard_error"]
            if abs(slq_trace - total) > 5 * np.hypot(slq_se, total_se) + 1e-9 * abs(total):
                fail(f"step {step}: SLQ trace {slq_trace} ± {slq_se} vs Hutch++ {total} ± {total_se}")

            p = g["precond"]
            status = p.attrs["status"]
            status = status.decode() if isinstance(status, bytes) else status
            if step in adam_steps:
                if status != "converged":
                    fail(f"step {step}: precond status {status}: {p.attrs['message']}")
                lr, b1 = p.attrs["lr"], p.attrs["beta1"]
                if abs(p.attrs["edge_of_stability"] - (2 + 2 * b1) / ((1 - b1) * lr)) > 1e-9 * p.attrs["edge_of_stability"]:
                    fail(f"step {step}: edge_of_stability {p.attrs['edge_of_stability']}")
                if not np.isfinite(p.attrs["sharpness"]) or p.attrs["hvps"] <= 0:
                    fail(f"step {step}: sharpness {p.attrs['sharpness']}")
            elif status != "unavailable":
                fail(f"step {step}: precond status {status}, want unavailable")

            for dname in directions:
                u = f[f"runs/{run}/step_{step}/{dname}"]
                if "status" in u.attrs:
                    continue
                o = u["overlap"]
                pv = o["per_vector"][()]
                share = o.attrs["eigenspace_share"]
                if len(pv) != top or o.attrs["k"] != top:
                    fail(f"step {step} {dname}: overlap has {len(pv)} entries, want {top}")
                if not (0 <= share <= 1 + 1e-9) or abs(pv.sum() - share) > 1e-12:
                    fail(f"step {step} {dname}: eigenspace share {share}, per vector {pv}")
                if not abs(o.attrs["gradient_cosine"]) <= 1 + 1e-12:
                    fail(f"step {step} {dname}: gradient cosine {o.attrs['gradient_cosine']}")
                if dname == "gradient" and abs(o.attrs["gradient_cosine"] + 1) > 1e-9:
                    fail(f"step {step}: the gradient direction −g has cosine {o.attrs['gradient_cosine']} with g")


if __name__ == "__main__":
    main()
