"""Checks a scripts/optimizers.sh output folder against numbers recomputed here from its raw files
(sweep.csv, log.csv, the ndsprobe HDF5 files read with h5py, not through curvplot): every
optimizer was probed along its own rebuilt update at every checkpoint, and the summary's NDS,
ρ_within and validation losses are those files' means.

Usage: check_optimizers_study.py STUDY_DIR OPTIMIZER...
"""
import csv
import json
import math
import os
import sys

import h5py
import numpy as np

from check_reproduce import close, fail, final_val_loss, read_table


def main():
    study, optimizers = sys.argv[1], sys.argv[2:]
    summary = json.load(open(os.path.join(study, "summary.json")))
    with open(os.path.join(study, "sweep.csv")) as f:
        sweep = list(csv.DictReader(f))
    if sorted({r["optimizer"] for r in sweep}) != sorted(optimizers):
        fail(f"the sweep tried {sorted({r['optimizer'] for r in sweep})}, expected {optimizers}")
    rows = {(r["s"], r["opt"]): r for r in summary["optimizers"]}
    audited, late = summary["audited_steps"], summary["late_steps"]
    for s, layout in summary["layout"].items():
        with h5py.File(os.path.join(study, f"ndsprobe_s{s}_layer.h5"), "r") as f:
            t = read_table(f, "/taylor")
            rules = {(run, int(step[len("step_"):])): f["runs"][run][step]["update"].attrs.get(
                "optimizer_rule") for run in f["runs"] for step in f["runs"][run]
                if step.startswith("step_") and "update" in f["runs"][run][step]}
        for opt in optimizers:
            seeds = layout.get(opt)
            if not seeds:
                fail(f"s = {s}: no runs of {opt}")
            row = rows.get((float(s), opt))
            if row is None:
                fail(f"s = {s}: {opt} is missing from summary.json")
            nds_all, nds_late, rho_late, losses = [], [], [], []
            for k in seeds:
                run = f"{opt}_seed{k}"
                pick = [i for i in range(len(t["run"])) if t["run"][i] == run and
                        t["direction"][i] == "update" and t["block"][i] == "total"]
                steps = sorted(int(t["step"][i]) for i in pick)
                if steps[1:] != audited or steps[0] != 0:
                    fail(f"s = {s}, {run}: update audited at steps {steps}, expected 0 and {audited}")
                by_step = {int(t["step"][i]): i for i in pick}
                for x in steps:
                    rule = rules.get((run, x))
                    rule = rule.decode() if isinstance(rule, bytes) else rule
                    if rule != opt:
                        fail(f"s = {s}, {run}, step {x}: update rebuilt by '{rule}', not {opt}")
                nds_all.append(np.mean([t["nds"][by_step[x]] for x in audited]))
                nds_late.append(np.mean([t["nds"][by_step[x]] for x in late]))
                rho_late.append(np.mean([t["rho_within"][by_step[x]] for x in late]))
                losses.append(final_val_loss(os.path.join(study, "study", f"s{s}", run)))
            for key, values in (("nds_all", nds_all), ("nds_late", nds_late),
                                ("rho_within_late", rho_late), ("val_loss", losses)):
                if not all(math.isfinite(v) for v in values):
                    fail(f"s = {s}, {opt}: {key} per seed {values} is not finite")
                if not close(row[key][0], float(np.mean(values))):
                    fail(f"s = {s}, {opt}: summary {key} {row[key][0]} != {np.mean(values)} "
                         "from the files")
    print(f"check_optimizers_study: {len(optimizers)} optimizers, {len(summary['layout'])} "
          "exponents, every summary number recomputed from the files")


if __name__ == "__main__":
    main()
