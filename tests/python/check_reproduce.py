"""Checks a scripts/reproduce.sh output folder against numbers recomputed here from its raw files
(log.csv, sweep.csv, the ndsprobe HDF5 files read with h5py, not through curvplot).

Usage: check_reproduce.py STUDY_DIR
"""
import csv
import json
import math
import os
import sys

import h5py
import numpy as np

LADDERS = {"adamw": ["1e-4", "3e-4", "1e-3", "3e-3", "1e-2", "3e-2"],
           "muon": ["0.002", "0.005", "0.01", "0.02", "0.05", "0.1"],
           "normuon": ["0.002", "0.005", "0.01", "0.02", "0.05", "0.1"]}
FIRST_RUNGS = [1, 2, 3]


def fail(message):
    print("check_reproduce:", message)
    sys.exit(1)


def close(a, b, tol=1e-9):
    return abs(a - b) <= tol * max(1.0, abs(a), abs(b))


def final_val_loss(run_dir):
    with open(os.path.join(run_dir, "log.csv")) as f:
        rows = list(csv.DictReader(f))
    return float(rows[-1]["val_loss"])


def read_table(f, group):
    g = f[group]
    out = {}
    for c in g.attrs["columns"]:
        c = c.decode() if isinstance(c, bytes) else c
        v = g[c][()]
        out[c] = [x.decode() if isinstance(x, bytes) else x for x in v] if v.dtype.kind in "OS" else v
    return out


def main():
    study = sys.argv[1]
    summary = json.load(open(os.path.join(study, "summary.json")))

    # The sweep: every rate's loss is its run's, the choice is the lowest, and it is bracketed.
    with open(os.path.join(study, "sweep.csv")) as f:
        sweep = list(csv.DictReader(f))
    chosen = {}
    for key in sorted({(r["s"], r["optimizer"]) for r in sweep}):
        s, opt = key
        rows = [r for r in sweep if (r["s"], r["optimizer"]) == key]
        tried = [LADDERS[opt].index(r["lr"]) for r in rows]
        if tried != list(range(min(tried), max(tried) + 1)) or not set(FIRST_RUNGS) <= set(tried):
            fail(f"s = {s}, {opt}: the rates tried {[r['lr'] for r in rows]} are not a run of the "
                 "ladder around its middle rungs")
        for r in rows:
            loss = final_val_loss(os.path.join(study, "runs", f"s{s}", f"{opt}_lr{r['lr']}_seed0"))
            if not close(loss, float(r["val_loss"]), 1e-6):
                fail(f"s = {s}, {opt}, lr {r['lr']}: sweep.csv says {r['val_loss']}, log.csv {loss}")
        best = min(rows, key=lambda r: float(r["val_loss"]))
        picked = [r for r in rows if r["chosen"] == "1"]
        if len(picked) != 1 or picked[0]["lr"] != best["lr"]:
            fail(f"s = {s}, {opt}: chose {[r['lr'] for r in picked]}, the lowest loss is at {best['lr']}")
        i = LADDERS[opt].index(best["lr"])
        if (i == min(tried) and i > 0) or (i == max(tried) and i < len(LADDERS[opt]) - 1):
            fail(f"s = {s}, {opt}: the chosen rate {best['lr']} is at an end of those tried")
        chosen[(float(s), opt)] = best["lr"]

    layout = summary["layout"]
    seeds_of = {}
    for s_name, opts in layout.items():
        s = float(s_name)
        for opt, seeds in opts.items():
            seeds_of[(s, opt)] = seeds
            for k in seeds:
                link = os.path.join(study, "study", f"s{s_name}", f"{opt}_seed{k}")
                target = os.path.realpath(link)
                if os.path.basename(target) != f"{opt}_lr{chosen[(s, opt)]}_seed{k}":
                    fail(f"{link} points to {target}, not the chosen rate {chosen[(s, opt)]}")

    # NDS per seed and the Adam/Muon ratios, from /taylor.
    audited = summary["audited_steps"]
    rows = {r["s"]: r for r in summary["all audited checkpoints"]["rows"]}
    late = summary["late_steps"]
    rho = {(r["s"], r["opt"]): r for r in summary["rho_within"]}
    for s_name in layout:
        s = float(s_name)
        with h5py.File(os.path.join(study, f"ndsprobe_s{s_name}_layer.h5"), "r") as f:
            t = read_table(f, "/taylor")
            comparisons = read_table(f, "/comparisons")

        def values(run, column, steps):
            return [t[column][i] for i in range(len(t["run"]))
                    if t["run"][i] == run and t["block"][i] == "total" and t["direction"][i] == "update"
                    and t["step"][i] in steps]

        for other in ("muon", "normuon"):
            mine, positive = [], True
            for k in seeds_of[(s, "adamw")]:
                a = values(f"adamw_seed{k}", "nds", audited)
                b = values(f"{other}_seed{k}", "nds", audited)
                if len(a) != len(audited) or len(b) != len(audited):
                    fail(f"s = {s}: seed {k} lacks audited checkpoints ({len(a)}, {len(b)} of {len(audited)})")
                mine.append(float(np.mean(a) / np.mean(b)))
                positive = positive and np.mean(a) > 0 and np.mean(b) > 0
            theirs = rows[s][f"adamw/{other}_seeds"]
            if len(mine) != len(theirs) or not all(close(x, y) for x, y in zip(mine, theirs)):
                fail(f"s = {s}: adamw/{other} per seed {theirs}, recomputed {mine}")
            ci = rows[s][f"adamw/{other}"]
            # A ratio only where both NDS means are positive: NaN otherwise.
            expected = math.exp(np.mean(np.log(mine))) if positive else float("nan")
            if not (close(ci["ratio"], expected) or (math.isnan(ci["ratio"]) and math.isnan(expected))):
                fail(f"s = {s}: geometric mean adamw/{other} {ci['ratio']}, recomputed {expected}")
            # The paired comparisons cover every seed and audited step, with the units' own NDS.
            for k in seeds_of[(s, "adamw")]:
                pair = f"adamw_seed{k}/update:{other}_seed{k}/update"
                steps = [comparisons["step"][i] for i in range(len(comparisons["pair"]))
                         if comparisons["pair"][i] == pair]
                if not set(audited) <= set(steps):
                    fail(f"s = {s}: /comparisons lacks {pair} at some of {audited} (has {steps})")
                if steps != sorted(steps):
                    fail(f"s = {s}: /comparisons lists {pair}'s steps out of order: {steps}")
        for opt in ("adamw", "muon", "normuon"):
            per_seed = [float(np.mean(values(f"{opt}_seed{k}", "rho_within", late))) for k in seeds_of[(s, opt)]]
            if not close(float(np.mean(per_seed)), rho[(s, opt)]["late"]):
                fail(f"s = {s}, {opt}: late rho_within {rho[(s, opt)]['late']}, recomputed {np.mean(per_seed)}")
    # The fixed-rate control: AdamW and Muon at the first s's rates, ratios from its own files.
    first = min(float(x) for x in layout)
    control_rows = {r["s"]: r for r in summary["control all audited checkpoints"]["rows"]}
    for s_name in layout:
        s = float(s_name)
        path = os.path.join(study, f"ndsprobe_s{s_name}_layer.h5" if s == first else f"ndsprobe_control_s{s_name}.h5")
        with h5py.File(path, "r") as f:
            t = read_table(f, "/taylor")
        mine = []
        for k in seeds_of[(s, "adamw")]:
            means = []
            for opt in ("adamw", "muon"):
                if s != first:
                    target = os.path.realpath(os.path.join(study, "control", f"s{s_name}", f"{opt}_seed{k}"))
                    if os.path.basename(target) != f"{opt}_lr{chosen[(first, opt)]}_seed{k}":
                        fail(f"control at s = {s}: {opt} seed {k} is {target}, not the rate of s = {first}")
                means.append(np.mean([t["nds"][i] for i in range(len(t["run"]))
                                      if t["run"][i] == f"{opt}_seed{k}" and t["block"][i] == "total"
                                      and t["direction"][i] == "update" and t["step"][i] in audited]))
            mine.append(float(means[0] / means[1]))
        theirs = control_rows[s]["adamw/muon_seeds"]
        if not all(close(x, y) for x, y in zip(mine, theirs)) or len(mine) != len(theirs):
            fail(f"control at s = {s}: adamw/muon per seed {theirs}, recomputed {mine}")
    print("check_reproduce: sweep, choices, per-seed ratios, comparisons, rho_within and the control agree")


if __name__ == "__main__":
    main()
