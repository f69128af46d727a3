"""Plots and summary of the Adam-vs-Muon demo (scripts/demo.sh).

Usage: plot_demo.py DEMO_DIR
Reads DEMO_DIR/ndsprobe.h5 (ndsprobe on every run's checkpoints, balanced probe set),
DEMO_DIR/train_probe.h5 (curvtrain's in-training probe on the training batches) and
DEMO_DIR/runs/*/log.csv; writes DEMO_DIR/plots/*.png and DEMO_DIR/summary.json, prints a summary.
With DEMO_DIR/model_problems/ (memory_* and quadratic_* runs, quadratic.h5) it also summarises
the model problems: head vs tail loss of the associative memory, and the quadratic's update NDS
beside the closed form α·w_H + (1 − α)·w_L of the exact Muon step.
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import curvplot  # noqa: E402


def main():
    demo = sys.argv[1]
    plots = os.path.join(demo, "plots")
    os.makedirs(plots, exist_ok=True)
    train = curvplot.totals(os.path.join(demo, "train_probe.h5"), "update")
    probe = curvplot.totals(os.path.join(demo, "ndsprobe.h5"), "update")

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    curvplot.plot_over_training(axes[0, 0], train, "nds", "NDS of the update (training batch)", "symlog")
    curvplot.plot_over_training(axes[0, 1], probe, "nds", "NDS of the update (balanced probe set)", "symlog")
    curvplot.plot_over_training(axes[1, 0], train, "update_norm", "update norm ‖u‖", "log")
    curvplot.plot_over_training(axes[1, 1], probe, "rho_within", "ρ_within (balanced probe set)")
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "nds_over_training.png"), dpi=110)

    fig, ax = plt.subplots(figsize=(6, 5))
    for run, g in train.groupby("run"):
        ax.scatter(-g["predicted"], -g["realized"], s=12, label=run)
    lim = max(1e-9, float(max((-train["predicted"]).max(), (-train["realized"]).max())))
    ax.plot([0, lim], [0, lim], "k--", lw=0.8)
    ax.set_xlabel("predicted decrease −(g·u + ½uᵀHu)")
    ax.set_ylabel("realized decrease L(θ) − L(θ+u)")
    ax.set_title("Taylor audit of each update (training batch)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "predicted_vs_realized.png"), dpi=110)

    fig, ax = plt.subplots(figsize=(6, 4))
    runs_dir = os.path.join(demo, "runs")
    losses = {}
    for run in sorted(os.listdir(runs_dir)):
        log = curvplot.training_log(os.path.join(runs_dir, run))
        ax.plot(log["step"], log["val_loss"], label=run)
        last = log.iloc[-1]
        losses[run] = {"val_loss": float(last["val_loss"]), "head": float(last["val_head_loss"]),
                       "tail": float(last["val_tail_loss"]), "train_loss": float(last["train_loss"])}
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (s = 0)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "validation_loss.png"), dpi=110)

    later = train[train["step"] > 0]
    later_probe = probe[probe["step"] > 0]
    summary = {
        "note": "NDS statistics over steps > 0: step 0 is the initialization, where every run "
                "sees negative curvature along its first update",
        "nds_ratio_adam_over_muon_training_batch": curvplot.nds_ratio(train),
        "nds_median_ratio_adam_over_muon_training_batch": curvplot.nds_ratio(train, statistic="median"),
        "nds_ratio_adam_over_muon_probe_set": curvplot.nds_ratio(probe),
        "nds_median_ratio_adam_over_muon_probe_set": curvplot.nds_ratio(probe, statistic="median"),
        "mean_nds_training_batch": later.groupby("run")["nds"].mean().to_dict(),
        "median_nds_training_batch": later.groupby("run")["nds"].median().to_dict(),
        "negative_nds_fraction_training_batch": later.groupby("run")["nds"].apply(lambda x: float((x < 0).mean())).to_dict(),
        "mean_rho_within_probe_set": later_probe.groupby("run")["rho_within"].mean().to_dict(),
        "losses": losses,
    }
    with open(os.path.join(demo, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)

    print("\n== Adam vs Muon on Zipf-PCFG: curvature along each optimizer's updates")
    print("   (NDS on the training batch of each probed update, steps > 0)")
    print(f"{'run':<12} {'mean NDS':>10} {'median NDS':>11} {'NDS < 0':>8} {'ρ_within':>9} "
          f"{'val loss':>9} {'head':>7} {'tail':>7}")
    for run in sorted(losses):
        get = lambda key: summary[key].get(run, float("nan"))  # noqa: E731
        l = losses[run]
        print(f"{run:<12} {get('mean_nds_training_batch'):>10.4g} "
              f"{get('median_nds_training_batch'):>11.4g} "
              f"{100 * get('negative_nds_fraction_training_batch'):>7.0f}% "
              f"{100 * get('mean_rho_within_probe_set'):>8.1f}% {l['val_loss']:>9.4f} "
              f"{l['head']:>7.4f} {l['tail']:>7.4f}")
    for stat in ["", "median_"]:
        for key, label in [(f"nds_{stat}ratio_adam_over_muon_training_batch", "training batch"),
                           (f"nds_{stat}ratio_adam_over_muon_probe_set", "balanced probe set")]:
            for s, ratio in sorted(summary[key].items()):
                print(f"{stat.rstrip('_') or 'mean'} NDS ratio Adam/Muon at s = {s:g} ({label}): "
                      f"{ratio:.3f}")
    model_problems = os.path.join(demo, "model_problems")
    if os.path.isdir(model_problems):
        summary["model_problems"] = summarize_model_problems(model_problems)
        with open(os.path.join(demo, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
    print(f"plots in {plots}, numbers in {os.path.join(demo, 'summary.json')}")


def summarize_model_problems(directory):
    out = {"memory": {}, "quadratic": {}}
    print("\n== Associative memory: validation loss per class bucket (every class once)")
    print(f"{'run':<20} {'val loss':>9} {'head':>7} {'tail':>7}")
    for run in sorted(r for r in os.listdir(directory) if r.startswith("memory_")):
        last = curvplot.training_log(os.path.join(directory, run)).iloc[-1]
        out["memory"][run] = {k: float(last[c]) for k, c in
                              [("val_loss", "val_loss"), ("head", "val_head_loss"), ("tail", "val_tail_loss")]}
        print(f"{run:<20} {last['val_loss']:>9.4f} {last['val_head_loss']:>7.4f} {last['val_tail_loss']:>7.4f}")
    h5 = os.path.join(directory, "quadratic.h5")
    if os.path.exists(h5):
        with open(os.path.join(directory, "quadratic_muon", "step_0", "meta.json")) as f:
            q = json.load(f)["model"]
        muon_nds = q["alpha"] * q["w_high"] + (1 - q["alpha"]) * q["w_low"]
        out["quadratic"]["closed_form_exact_muon_nds"] = muon_nds
        print(f"\n== Structured quadratic: NDS of each run's updates; exact Muon step in closed form "
              f"α·w_H + (1 − α)·w_L = {muon_nds:g}")
        df = curvplot.totals(h5)
        for (run, direction), g in df.groupby(["run", "direction"]):
            out["quadratic"].setdefault(run, {})[direction] = {
                "mean_nds": float(g["nds"].mean()), "min_nds": float(g["nds"].min()),
                "max_nds": float(g["nds"].max())}
            print(f"{run:<20} {direction:<9} NDS mean {g['nds'].mean():8.4g}  range "
                  f"[{g['nds'].min():.4g}, {g['nds'].max():.4g}]")
    return out


if __name__ == "__main__":
    main()
