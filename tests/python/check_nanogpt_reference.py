"""Compares an ndsprobe file with torch.autograd's numbers for the same checkpoint.

Usage: check_nanogpt_reference.py FILE RUN STEP REFERENCE_JSON [TOL]

REFERENCE_JSON is what make_torch_fixtures.py's reference() writes: the loss, and per direction
first_order, curvature, nds and update_norm. Every direction of the reference that the file holds
must agree within TOL (relative; default 1e-10, float64). Prints the largest error; exits non-zero
naming the first value out of tolerance.
"""
import json
import sys

import h5py


def main():
    path, run, step, reference = sys.argv[1:5]
    tol = float(sys.argv[5]) if len(sys.argv) > 5 else 1e-10
    with open(reference) as f:
        ref = json.load(f)
    worst, compared = 0.0, 0
    with h5py.File(path, "r") as f:
        group = f[f"runs/{run}/step_{step}"]
        checks = [("loss", group.attrs["loss"], ref["loss"])]
        for direction, values in ref.items():
            if direction == "loss" or direction not in group:
                continue
            for key, want in values.items():
                checks.append((f"{direction}/{key}", group[direction].attrs[key], want))
    for what, got, want in checks:
        err = abs(float(got) - want) / max(abs(want), 1e-300)
        worst = max(worst, err)
        compared += 1
        if not err <= tol:
            print(f"{path}: {what} is {float(got)!r}, torch.autograd gives {want!r} "
                  f"(relative error {err:.3g} > {tol:g})")
            sys.exit(1)
    if compared < 2:
        print(f"{path}: no direction of {reference} to compare")
        sys.exit(1)
    print(f"{compared} values within {worst:.2g} of torch.autograd")


if __name__ == "__main__":
    main()
