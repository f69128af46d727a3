"""Checks the standard errors and paired comparisons of an ndsprobe file with numpy.

Usage: check_statistics_h5.py FILE
Every *_stderr of the whole-model rows of /taylor is recomputed from the unit's batches group
with the formula of docs/concepts.md, written out here independently of curvplot; every row of
/comparisons is recomputed by curvplot.paired_nds. Exits non-zero on the first mismatch.
"""
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "python"))
import curvplot  # noqa: E402


def fail(msg):
    print(f"check_statistics_h5.py: {msg}")
    sys.exit(1)


def close(a, b, what, rtol=1e-9):
    if np.isnan(a) and np.isnan(b):
        return
    if not abs(a - b) <= rtol * max(1e-12, abs(b)):
        fail(f"{what}: {a} != {b}")


def stderr(x, w):
    mean = sum(wi * xi for wi, xi in zip(w, x))
    total = sum((wi * (xi - mean)) ** 2 for wi, xi in zip(w, x))
    return float(np.sqrt(len(x) / (len(x) - 1) * total)) if len(x) > 1 else float("nan")


def main():
    path = sys.argv[1]
    taylor = curvplot.totals(path)
    checked = 0
    with h5py.File(path, "r") as f:
        if f.attrs["schema"] not in (b"libcurv-probe/2", "libcurv-probe/2"):
            fail(f"schema {f.attrs['schema']}")
        for _, row in taylor.iterrows():
            unit = f"/runs/{row['run']}/step_{row['step']}/{row['direction']}"
            b = f[unit]["batches"]
            w = b["weight"][()]
            if abs(w.sum() - 1.0) > 1e-12:
                fail(f"{unit}: batch weights sum to {w.sum()}")
            u_sq = row["update_norm"] ** 2
            first, curv = b["first_order"][()], b["curvature"][()]
            for column, x in [("loss", b["loss"][()]), ("first_order", first),
                              ("curvature", curv), ("predicted", first + 0.5 * curv),
                              ("realized", b["realized"][()]), ("nds", curv / u_sq)]:
                close(float(np.sum(w * x)), row[column], f"{unit} mean of batch {column}", 1e-8)
                close(row[f"{column}_stderr"], stderr(x, w), f"{unit} {column}_stderr")
                close(f[unit].attrs[f"{column}_stderr"], row[f"{column}_stderr"],
                      f"{unit}@{column}_stderr")
            blocks = f[unit]["blocks"]
            row_sums = b["block_row_sum"][()]
            for l, name in enumerate(blocks["name"][()]):
                close(blocks["row_sum_stderr"][l], stderr(row_sums[:, l], w),
                      f"{unit} block {name} row_sum_stderr")
            checked += 1
        if checked == 0:
            fail("no units with results")
        if "comparisons" in f:
            c = curvplot.read_table(path, "/comparisons")
            if len(c) == 0:
                fail("/comparisons is empty")
            for _, group in c.groupby(["pair", "run_a", "run_b"]):
                if list(group["step"]) != sorted(group["step"]):
                    fail(f"/comparisons lists steps out of order: {list(group['step'])}")
            for _, row in c.iterrows():
                ref = curvplot.paired_nds(path, f"{row['run_a']}/{row['direction_a']}",
                                          unit_b=f"{row['run_b']}/{row['direction_b']}")
                ref = ref[ref["step"] == row["step"]]
                if len(ref) != 1:
                    fail(f"comparison {row['pair']} step {row['step']} not recomputed")
                for column in ["nds_a", "nds_b", "difference", "difference_stderr", "ratio",
                               "ratio_stderr"]:
                    close(row[column], float(ref[column].iloc[0]),
                          f"comparison {row['pair']} step {row['step']} {column}")
    print(f"check_statistics_h5.py: {checked} units and their comparisons agree")


if __name__ == "__main__":
    main()
