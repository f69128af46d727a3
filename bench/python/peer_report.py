"""The Markdown report of bench/peers.sh from its work folder: one table per measurement, every
row with its HVPs, seconds, peak RSS and accuracy.

usage: peer_report.py WORK MODEL [MODEL ...]
"""
import json
import os
import platform
import sys

import torch
from safetensors.torch import load_file

SIDES = {"libcurv": "libcurv (ndsprobe's engine)", "curvlinops": "curvlinops 3.0.1",
         "eigenthings": "hessian-eigenthings 1.0.0a5"}


def read(d, name):
    p = os.path.join(d, name + ".json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        r = json.load(f)
    with open(os.path.join(d, name + ".mem")) as f:
        wall, rss, _ = f.read().split()
    r["wall"], r["rss_gib"] = float(wall), float(rss) / 2**20
    return r


def rel_diff(a, b):
    num = sum(float(((a[k].double() - b[k].double()) ** 2).sum()) for k in b) ** 0.5
    den = sum(float((b[k].double() ** 2).sum()) for k in b) ** 0.5
    return num / den


def g(x, digits=4):
    return "—" if x is None else f"{x:.{digits}g}"


def main():
    work, models = sys.argv[1], sys.argv[2:]
    first = None
    for model in models:
        d = os.path.join(work, model)
        base = {s: read(d, f"setup_{s}") for s in SIDES}
        first = first or read(d, "hvp_libcurv")
        ref = read(d, "reference")
        lam = ref["eigenvalues"]
        print(f"### {model}: {ref['parameters']:,} parameters\n")
        print(f"Reference eigenvalues (libcurv Lanczos, residual bound, tol 1e-10, "
              f"{ref['hvps']} HVPs, {'converged' if ref['converged'] else 'NOT converged'}): "
              + ", ".join(f"{x:.10g}" for x in lam) + "\n")
        print("Memory baseline (model, probe set and operator built, no pass), peak RSS: "
              + ", ".join(f"{SIDES[s]} {base[s]['rss_gib']:.2f} GiB" for s in SIDES if base[s])
              + "\n")

        def extra(r, side):
            return r["rss_gib"] - base[side.split("_")[0]]["rss_gib"]

        print("| (a) one HVP | HVPs | first HVP (s) | second HVP (s) | process wall (s) | "
              "peak RSS (GiB) | over baseline (GiB) | ‖Hv − Hv_libcurv‖ / ‖Hv_libcurv‖ |")
        print("|---|---|---|---|---|---|---|---|")
        ours = load_file(os.path.join(d, "hv_libcurv.safetensors"))
        for side, label in [("libcurv", SIDES["libcurv"]), ("curvlinops", SIDES["curvlinops"]),
                            ("curvlinops_ln", SIDES["curvlinops"] + ", LayerNorm written out"),
                            ("eigenthings", SIDES["eigenthings"])]:
            r = read(d, f"hvp_{side}")
            if r is None:
                continue
            diff = 0.0 if side == "libcurv" else \
                rel_diff(load_file(os.path.join(d, f"hv_{side}.safetensors")), ours)
            print(f"| {label} | 1 (+1) | {r['seconds_first']:.3f} | {r['seconds_second']:.3f} | "
                  f"{r['wall']:.1f} | {r['rss_gib']:.2f} | {extra(r, side):.2f} | "
                  f"{'—' if side == 'libcurv' else f'{diff:.1e}'} |")
        print()

        tol = os.environ.get("EIG_TOL", "1e-6")  # peers.sh exports what the solvers were given
        print(f"| (b) top-{len(lam)} eigenvalues, tol {tol} | method | HVPs | solver (s) | "
              "process wall (s) | peak RSS (GiB) | over baseline (GiB) | "
              "max rel. error vs reference |")
        print("|---|---|---|---|---|---|---|---|")
        for side, label in [("libcurv", SIDES["libcurv"]),
                            ("libcurv_residual", SIDES["libcurv"]),
                            ("curvlinops", SIDES["curvlinops"]),
                            ("curvlinops_ln", SIDES["curvlinops"] + ", LayerNorm written out"),
                            ("eigenthings", SIDES["eigenthings"])]:
            r = read(d, f"eig_{side}")
            if r is None:
                continue
            vals = r["eigenvalues"]
            err = max(abs(a - b) / abs(b) for a, b in zip(vals, lam))
            note = "" if r.get("converged", True) else " (not converged)"
            print(f"| {label} | {r['method']} | {r['hvps']} | {r['seconds']:.1f} | "
                  f"{r['wall']:.1f} | {r['rss_gib']:.2f} | {extra(r, side):.2f} | "
                  f"{err:.1e}{note} |")
        print()

        print("| (c) trace | method | HVPs | estimate ± standard error | solver (s) | "
              "process wall (s) | peak RSS (GiB) | over baseline (GiB) |")
        print("|---|---|---|---|---|---|---|---|")
        for method in ("hutchinson", "hutchpp"):
            for side in SIDES:
                r = read(d, f"trace_{method}_{side}")
                if r is None:
                    continue
                se = r.get("standard_error")
                print(f"| {SIDES[side]} | {r['method']} | {r['hvps']} | "
                      f"{r['estimate']:.1f} ± {g(se, 3)} | {r['seconds']:.1f} | {r['wall']:.1f} | "
                      f"{r['rss_gib']:.2f} | {extra(r, side):.2f} |")
        print()

        print("| (d) spectral density | method | HVPs | trace from the density | largest node "
              "(rel. error vs λ_max) | solver (s) | process wall (s) | peak RSS (GiB) | "
              "over baseline (GiB) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for side in SIDES:
            r = read(d, f"density_{side}")
            if r is None:
                continue
            se = r.get("trace_standard_error")
            tr = f"{r['trace_from_density']:.1f}" + (f" ± {se:.3g}" if se is not None else "")
            node = r["nodes_max"]
            print(f"| {SIDES[side]} | {r['method']} | {r['hvps']} | {tr} | "
                  f"{node:.6g} ({abs(node - lam[0]) / abs(lam[0]):.1e}) | {r['seconds']:.1f} | "
                  f"{r['wall']:.1f} | {r['rss_gib']:.2f} | {extra(r, side):.2f} |")
        print()
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"Machine: {platform.node()}, {os.cpu_count()} CPUs ({cpu}), {platform.platform()}; "
          f"torch {torch.__version__} for the Python sides, its LibTorch for libcurv "
          f"({first['runtime'] if first else ''}); {first['dtype'] if first else ''}, "
          f"device {first['device'] if first else ''}. Load average at the end: "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}.")


if __name__ == "__main__":
    main()
