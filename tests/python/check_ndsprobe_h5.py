"""Checks an ndsprobe HDF5 file with h5py against the definitions in DESIGN.md.

Usage: check_ndsprobe_h5.py FILE RUN STEPS DIRECTIONS [--within]
  STEPS and DIRECTIONS comma-separated; the last step has no delta (status "unavailable").
Exits non-zero with a message on the first violated property.
"""
import sys

import h5py
import numpy as np


def fail(msg):
    print(f"check_ndsprobe_h5.py: {msg}")
    sys.exit(1)


def close(a, b, tol, what):
    if not abs(a - b) <= tol * max(1.0, abs(b)):
        fail(f"{what}: {a} != {b} (tol {tol})")


def main():
    path, run, steps, directions = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    within = "--within" in sys.argv
    steps = [int(s) for s in steps.split(",")]
    directions = directions.split(",")
    with h5py.File(path, "r") as f:
        for key in ["tool", "version", "model", "dtype", "probe_hash", "probe_examples", "blocks"]:
            if key not in f.attrs:
                fail(f"root attribute {key} missing")
        taylor = {k: f["taylor"][k][()] for k in f["taylor"].keys()}
        block = np.array([b.decode() for b in taylor["block"]])
        direction = np.array([d.decode() for d in taylor["direction"]])
        for step in steps:
            sg = f[f"runs/{run}/step_{step}"]
            for d in directions:
                g = sg[d]
                if d == "delta" and step == steps[-1]:
                    if g.attrs["status"] != "unavailable":
                        fail("delta at the last step should be unavailable")
                    continue
                a = g.attrs
                close(a["nds"], a["curvature"] / a["update_norm"] ** 2, 1e-10, f"{step}/{d} NDS")
                close(a["predicted"], a["first_order"] + 0.5 * a["curvature"], 1e-12, "predicted")
                close(a["s_within"] + a["s_cross"], a["nds"], 1e-8, "S_within + S_cross")
                c = g["coupling"][()]
                if not np.allclose(c, c.T, rtol=1e-6, atol=1e-12 * abs(c).max()):
                    fail(f"{step}/{d}: coupling not symmetric")
                close(c.sum(), a["curvature"], 1e-6, f"{step}/{d}: sum of C")
                blocks = g["blocks"]
                close(float(np.sum(blocks["sq_norm"][()])), a["update_norm"] ** 2, 1e-10, "block norms")
                np.testing.assert_allclose(blocks["curvature"][()], np.diag(c), rtol=1e-12)
                if not np.isfinite(a["realized"]):
                    fail(f"{step}/{d}: realized change not finite")
                rows = (taylor["step"] == step) & (direction == d)
                if rows.sum() != len(blocks["name"]) + 1:
                    fail(f"{step}/{d}: {rows.sum()} long-table rows for {len(blocks['name'])} blocks")
                total = rows & (block == "total")
                close(float(taylor["nds"][total][0]), a["nds"], 1e-12, "long-table NDS")
                parts = rows & (block != "total")
                close(float(taylor["predicted"][parts].sum()), a["predicted"], 1e-8,
                      "block predicted shares")
                if within:
                    w = g["within"]
                    if len(w.attrs["params"]) == 0:
                        fail(f"{step}/{d}: --within analysed no parameter")
                    for name in w.attrs["params"]:
                        p = w[name]
                        sv = p["singular_values"][()]
                        close(float((sv ** 2).sum()), p.attrs["sq_norm"], 1e-8, "singular values")
                        if len(p["modes"]["curvature"][()]) == 0:
                            fail(f"{name}: no modes")
    print("ok")


if __name__ == "__main__":
    main()
