"""Summary, statistics and plots of the optimizer comparison study (scripts/optimizers.sh).

Usage: optimizers_summary.py STUDY_DIR
Reads STUDY_DIR/sweep.csv, the runs under STUDY_DIR/study/s<S>/<OPT>_seed<K>/ (their log.csv) and
ndsprobe's STUDY_DIR/ndsprobe_s<S>_layer.h5; writes STUDY_DIR/summary.md, STUDY_DIR/summary.json
and STUDY_DIR/plots/{nds,validation_loss,rho_within}.png, and prints the summary.

Statistics as in reproduce_summary.py: seeds are the replicates, ± is one standard error over
seeds and intervals are 95% Student-t intervals over seeds. An optimizer's NDS in a window is the
mean over those checkpoints of the NDS of its own update (the step rebuilt from its saved state);
its ratio to AdamW's is taken per seed and combined on the log scale. Over training, each point's
error bar is the larger of the standard error over seeds and the median probe-batch standard error
ndsprobe reports for that point, so that a single seed still shows the probe set's noise.
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import curvplot  # noqa: E402
from reproduce_summary import (fmt, fmt_ci, fmt_pm, log_ratio_interval, mean_se,  # noqa: E402
                               per_seed_mean, s_name, study_layout, sweep_section, windows,
                               write_summary)


def load(study, layout):
    """Whole-model update rows of every s from the layer-block files, tagged with s, opt, seed."""
    frames = []
    for s in layout:
        t = curvplot.taylor(os.path.join(study, f"ndsprobe_s{s_name(s)}_layer.h5"))
        t = t[(t["direction"] == "update") & (t["block"] == "total")]
        parts = t["run"].str.extract(r"([\w-]+?)_seed(\d+)")
        frames.append(t.assign(s=s, opt=parts[0], seed=parts[1].astype(int)))
    return pd.concat(frames, ignore_index=True)


def optimizer_order(layout):
    """The optimizers in the study's order: AdamW, the baseline, first."""
    names = sorted({opt for opts in layout.values() for opt in opts})
    return ["adamw"] + [n for n in names if n != "adamw"]


def run_dir(study, s, opt, seed):
    return os.path.join(study, "study", f"s{s_name(s)}", f"{opt}_seed{seed}")


def final_losses(study, layout, order, plots, summary):
    """{(s, opt): [final validation loss per seed]}, and the validation-loss plot."""
    out = {}
    fig, axes = plt.subplots(1, len(layout), figsize=(5 * len(layout), 4), squeeze=False)
    for ax, (s, opts) in zip(axes[0], layout.items()):
        for opt in order:
            for k in opts.get(opt, []):
                log = curvplot.training_log(run_dir(study, s, opt, k))
                out.setdefault((s, opt), []).append(float(log["val_loss"].iloc[-1]))
                ax.plot(log["step"], log["val_loss"], color=f"C{order.index(opt)}", lw=0.8,
                        label=opt if k == opts[opt][0] else None)
        ax.set_title(f"validation loss, s = {s:g}")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "validation_loss.png"), dpi=100)
    summary["val_loss"] = {f"{s_name(s)}/{opt}": v for (s, opt), v in out.items()}
    return out


def over_training(totals, layout, order, column, title, path, log_scale):
    """Each optimizer's `column` at every audited checkpoint, mean over seeds with error bars."""
    fig, axes = plt.subplots(1, len(layout), figsize=(5 * len(layout), 4), squeeze=False)
    for ax, s in zip(axes[0], layout):
        for opt in order:
            d = totals[(totals["s"] == s) & (totals["opt"] == opt) & (totals["step"] > 0)]
            if d.empty:
                continue
            g = d.groupby("step")
            mean = g[column].mean()
            se = (g[column].std() / np.sqrt(g[column].count())).fillna(0.0)
            if column == "nds" and "nds_stderr" in d:
                se = np.maximum(se, g["nds_stderr"].median().fillna(0.0))
            curvplot.errorbar(ax, mean.index, mean.values, se.values, marker="o", ms=3, label=opt,
                              color=f"C{order.index(opt)}")
        if log_scale:
            ax.set_yscale("log")
        ax.set_title(f"{title}, s = {s:g}")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def comparison_table(totals, layout, order, losses, audited, late, md, summary):
    md.append("\n## Each optimizer's own steps\n")
    md.append(f"NDS of the update on the balanced probe set, mean over the audited checkpoints "
              f"(steps {audited[0]}–{audited[-1]}) and over the late half ({late[0]}–{late[-1]}), "
              "mean ± SE over seeds; its ratio to AdamW's (geometric mean over seeds [95% CI]); "
              "ρ_within of the update over the late half; validation loss after the last update.\n")
    md.append("| s | optimizer | NDS, all | NDS, late | adamw / it, all [95% CI] | ρ_within, late | "
              "validation loss |")
    md.append("|---|---|---|---|---|---|---|")
    every = per_seed_mean(totals, "nds", audited)
    latter = per_seed_mean(totals, "nds", late)
    rho = per_seed_mean(totals, "rho_within", late)
    rows = []
    for s, opts in layout.items():
        for opt in order:
            seeds = opts.get(opt, [])
            if not seeds:
                continue
            row = {"s": s, "opt": opt,
                   "nds_all": mean_se([every.get((s, opt, k), np.nan) for k in seeds])[:2],
                   "nds_late": mean_se([latter.get((s, opt, k), np.nan) for k in seeds])[:2],
                   "rho_within_late": mean_se([rho.get((s, opt, k), np.nan) for k in seeds])[:2],
                   "val_loss": mean_se(losses.get((s, opt), []))[:2]}
            ratio = "–"
            if opt != "adamw":
                paired = sorted(set(seeds) & set(opts.get("adamw", [])))
                d = log_ratio_interval([every[(s, "adamw", k)] for k in paired],
                                       [every[(s, opt, k)] for k in paired])
                row["adamw_over"] = d
                ratio = fmt_ci(d)
            md.append(f"| {s:g} | {opt} | {fmt_pm(*row['nds_all'])} | {fmt_pm(*row['nds_late'])} | "
                      f"{ratio} | {fmt_pm(*row['rho_within_late'])} | "
                      f"{fmt_pm(*row['val_loss'], digits=4)} |")
            rows.append(row)
    summary["optimizers"] = rows


def main():
    study = sys.argv[1]
    plots = os.path.join(study, "plots")
    os.makedirs(plots, exist_ok=True)
    layout = study_layout(study)
    order = optimizer_order(layout)
    totals = load(study, layout)
    audited, late = windows(totals["step"])
    summary = {"audited_steps": audited, "late_steps": late,
               "layout": {s_name(s): v for s, v in layout.items()}}
    md = []
    sweep_section(study, md, summary)
    losses = final_losses(study, layout, order, plots, summary)
    comparison_table(totals, layout, order, losses, audited, late, md, summary)
    over_training(totals, layout, order, "nds", "NDS of each optimizer's update",
                  os.path.join(plots, "nds.png"), log_scale=True)
    over_training(totals, layout, order, "rho_within", "ρ_within of the update",
                  os.path.join(plots, "rho_within.png"), log_scale=False)
    write_summary(study, md, summary)


if __name__ == "__main__":
    main()
