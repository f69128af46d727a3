"""The demo-sized probe's numbers against committed reference values.

  demo_reference.py write PROBE.h5 REFERENCE.json   records every dataset and unit attribute
  demo_reference.py check PROBE.h5 REFERENCE.json   fails on any difference beyond rounding

The reference was written by the release before the library was split into areas, so the check
says that restructuring changed no number. The run is float64 on one thread: across CPUs only
BLAS rounding differs, far below the tolerance.
"""
import json
import math
import sys

import h5py
import numpy as np

RTOL = 1e-9   # relative, float64 numbers of a float64 run
ATOL = 1e-12  # absolute floor for values that are zero up to rounding
TIMINGS = {"seconds"}


def read(path):
    """Every dataset of the file (the /taylor and /within tables and each unit's groups), and
    the numeric attributes of each unit, by path; timings excluded."""
    out = {}

    def values_of(values):
        values = np.asarray(values)
        if values.dtype.kind in "SOU":
            return [v.decode() if isinstance(v, bytes) else str(v) for v in values.ravel()]
        return [None if not math.isfinite(float(v)) else float(v)
                for v in values.astype(np.float64).ravel()]

    def visit(name, item):
        if isinstance(item, h5py.Dataset):
            out[name] = values_of(item[()])
        if name.startswith("runs/"):
            for key, value in item.attrs.items():
                if key not in TIMINGS and np.asarray(value).dtype.kind in "fiu":
                    out[f"{name}@{key}"] = values_of(value)

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def check(actual, expected):
    problems = []
    for key in sorted(set(actual) | set(expected)):
        if key not in actual or key not in expected:
            problems.append(f"{key}: only in {'the run' if key in actual else 'the reference'}")
            continue
        a, e = actual[key], expected[key]
        if len(a) != len(e):
            problems.append(f"{key}: {len(a)} rows, reference {len(e)}")
            continue
        for i, (x, y) in enumerate(zip(a, e)):
            if isinstance(y, str) or x is None or y is None:
                ok = x == y
            else:
                ok = abs(x - y) <= ATOL + RTOL * abs(y)
            if not ok:
                problems.append(f"{key}[{i}]: {x!r}, reference {y!r}")
                break
    return problems


def main():
    mode, probe, reference = sys.argv[1:4]
    values = read(probe)
    if mode == "write":
        with open(reference, "w") as f:
            json.dump(values, f, indent=0, sort_keys=True)
        print(f"wrote {len(values)} datasets to {reference}")
        return
    with open(reference) as f:
        expected = json.load(f)
    problems = check(values, expected)
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"{len(values)} datasets equal to the reference")


if __name__ == "__main__":
    main()
