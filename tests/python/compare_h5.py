"""Checks that two libcurv HDF5 files hold the same results: the same datasets, integer and string
datasets equal, float datasets within a relative tolerance (norm-wise per dataset, NaNs in the
same places). Root attributes that describe the process (command line, world size) may differ.

usage: compare_h5.py A.h5 B.h5 TOLERANCE
"""
import sys

import h5py
import numpy as np


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return out


def main():
    a_path, b_path, tolerance = sys.argv[1], sys.argv[2], float(sys.argv[3])
    a, b = datasets(a_path), datasets(b_path)
    if a.keys() != b.keys():
        sys.exit(f"different datasets: only in A {sorted(a.keys() - b.keys())}, "
                 f"only in B {sorted(b.keys() - a.keys())}")
    worst, checked = 0.0, 0
    for name in sorted(a):
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.shape != y.shape:
            sys.exit(f"{name}: shapes {x.shape} and {y.shape}")
        if x.dtype.kind == "f":
            if not np.array_equal(np.isnan(x), np.isnan(y)):
                sys.exit(f"{name}: NaNs in different places")
            keep = ~np.isnan(x)
            diff = np.linalg.norm((x - y)[keep])
            scale = np.linalg.norm(x[keep])
            relative = diff / scale if scale > 0 else diff
            worst = max(worst, relative)
            checked += 1
            if relative > tolerance:
                sys.exit(f"{name}: relative difference {relative:.3g} > {tolerance:g}")
        elif not np.array_equal(x, y):
            sys.exit(f"{name}: values differ")
    print(f"{len(a)} datasets equal, {checked} float datasets within {worst:.3g}")


if __name__ == "__main__":
    main()
