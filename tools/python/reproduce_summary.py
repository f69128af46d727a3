"""Summary, statistics and plots of the reproduction study (scripts/reproduce.sh).

Usage: reproduce_summary.py STUDY_DIR
Reads STUDY_DIR/sweep.csv, the runs under STUDY_DIR/study/s<S>/<OPT>_seed<K>/ (their log.csv)
and ndsprobe's STUDY_DIR/ndsprobe_s<S>_{layer,component}.h5; writes STUDY_DIR/summary.md,
STUDY_DIR/summary.json and STUDY_DIR/plots/*.png, and prints the summary.

Statistics. Seeds are the independent replicates: every interval below is a 95% Student-t
interval over seeds (n − 1 degrees of freedom), and ± is one standard error over seeds. The NDS
of an optimizer in a window of checkpoints is the mean over those checkpoints of its update's NDS
on the balanced probe set; the Adam/Muon ratio of a seed is the ratio of the two means, and the
ratios of the seeds are combined on the log scale (geometric mean, t-interval of the mean log).
The trend with s is the least-squares slope of log ratio against s over every (s, seed). The
probe-batch standard errors of ndsprobe's paired comparisons measure the probe set's noise at one
checkpoint, and are reported beside the seed-level intervals for scale.
"""
import json
import math
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import curvplot  # noqa: E402

OPTIMIZERS = ["adamw", "muon", "normuon"]
LATE_FRACTION = 0.5  # the late window: checkpoints in the second half of training
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(dof):
    """Two-sided 95% Student-t quantile (table; the nearest smaller tabulated dof beyond it)."""
    if dof < 1:
        return float("nan")
    return T95[max(k for k in T95 if k <= dof)]


def mean_se(values):
    v = np.asarray([x for x in values if np.isfinite(x)], dtype=np.float64)
    if len(v) == 0:
        return float("nan"), float("nan"), 0
    se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
    return float(v.mean()), se, len(v)


def log_ratio_interval(numerators, denominators):
    """Geometric mean of the ratios a_k / b_k with the 95% t-interval of their mean log; NaN
    unless every a_k and b_k is positive (a ratio of two negative curvatures is no ratio of
    sharpness)."""
    a = np.asarray(numerators, dtype=np.float64)
    b = np.asarray(denominators, dtype=np.float64)
    if len(a) == 0 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))) or np.any(a <= 0) \
            or np.any(b <= 0):
        return {"ratio": float("nan"), "low": float("nan"), "high": float("nan"), "n": len(a),
                "note": "an NDS is not positive"}
    r = a / b
    logs = np.log(r)
    m = float(logs.mean())
    half = t95(len(r) - 1) * float(logs.std(ddof=1)) / math.sqrt(len(r)) if len(r) > 1 else float("nan")
    return {"ratio": math.exp(m), "low": math.exp(m - half), "high": math.exp(m + half), "n": len(r)}


def slope_interval(x, y):
    """Least-squares slope of y on x with its 95% t-interval (n − 2 dof)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = len(x)
    if n < 3 or np.ptp(x) == 0:
        return {"slope": float("nan"), "low": float("nan"), "high": float("nan"), "n": n}
    xm, ym = x.mean(), y.mean()
    sxx = float(((x - xm) ** 2).sum())
    b = float(((x - xm) * (y - ym)).sum()) / sxx
    resid = y - (ym + b * (x - xm))
    se = math.sqrt(float((resid ** 2).sum()) / (n - 2) / sxx)
    return {"slope": b, "low": b - t95(n - 2) * se, "high": b + t95(n - 2) * se, "n": n}


def fmt(x, digits=3):
    return "nan" if x is None or not np.isfinite(x) else f"{x:.{digits}g}"


def fmt_pm(m, se, digits=3):
    return f"{fmt(m, digits)} ± {fmt(se, 2)}" if np.isfinite(se) else fmt(m, digits)


def fmt_ci(d):
    if not np.isfinite(d["ratio"]):
        return "n/a (an NDS ≤ 0)"
    return f"{fmt(d['ratio'])} [{fmt(d['low'])}, {fmt(d['high'])}]"


def study_layout(study):
    """{s: {opt: [seed, ...]}} from the directory names study/s<S>/<OPT>_seed<K>."""
    layout = {}
    for sdir in sorted(os.listdir(os.path.join(study, "study"))):
        s = float(sdir[1:])
        for run in sorted(os.listdir(os.path.join(study, "study", sdir))):
            m = re.fullmatch(r"([\w-]+?)_seed(\d+)", run)
            if m:
                layout.setdefault(s, {}).setdefault(m.group(1), []).append(int(m.group(2)))
    return layout


def s_name(s):
    return f"{s:g}"


def load(study, layout):
    """Whole-model update rows, block rows and token buckets of every s, tagged with s, opt, seed."""
    totals, blocks, components, buckets, comparisons = [], [], [], [], []

    def tag(df, s):
        parts = df["run"].str.extract(r"([\w-]+?)_seed(\d+)")
        return df.assign(s=s, opt=parts[0], seed=parts[1].astype(int))

    for s in layout:
        layer = os.path.join(study, f"ndsprobe_s{s_name(s)}_layer.h5")
        component = os.path.join(study, f"ndsprobe_s{s_name(s)}_component.h5")
        t = tag(curvplot.taylor(layer), s)
        t = t[t["direction"] == "update"]
        totals.append(t[t["block"] == "total"])
        blocks.append(t[t["block"] != "total"])
        c = tag(curvplot.taylor(component), s)
        c = c[c["direction"] == "update"]
        components.append(c)
        buckets.append(tag(curvplot.read_table(layer, "/token_buckets"), s))
        comparisons.append(curvplot.read_table(layer, "/comparisons").assign(s=s))
    cat = lambda frames: pd.concat(frames, ignore_index=True)  # noqa: E731
    return cat(totals), cat(blocks), cat(components), cat(buckets), cat(comparisons)


def control_totals(study, layout, totals):
    """Whole-model update rows of the fixed-rate control: the study's own AdamW and Muon runs at
    the first s, ndsprobe_control_s<S>.h5 at the others; None when the control was not run."""
    first = min(layout)
    frames = [totals[(totals["s"] == first) & totals["opt"].isin(["adamw", "muon"])]]
    for s in layout:
        if s == first:
            continue
        path = os.path.join(study, f"ndsprobe_control_s{s_name(s)}.h5")
        if not os.path.exists(path):
            return None
        t = curvplot.taylor(path)
        t = t[(t["direction"] == "update") & (t["block"] == "total")]
        parts = t["run"].str.extract(r"(\w+?)_seed(\d+)")
        frames.append(t.assign(s=s, opt=parts[0], seed=parts[1].astype(int)))
    return pd.concat(frames, ignore_index=True)


def windows(steps):
    """The audited checkpoints (step 0, the initialization, left out) and the late half."""
    audited = sorted(x for x in set(steps) if x > 0)
    last = max(audited)
    return audited, [x for x in audited if x >= LATE_FRACTION * last]


def per_seed_mean(df, column, steps):
    """{(s, opt, seed): mean of `column` over the given steps}."""
    d = df[df["step"].isin(steps)]
    return d.groupby(["s", "opt", "seed"])[column].mean().to_dict()


def nds_table(totals, layout, steps, out):
    """Per s: each optimizer's mean NDS over seeds, and the Adam/Muon and Adam/NorMuon ratios."""
    means = per_seed_mean(totals, "nds", steps)
    rows, trend_points = [], {"muon": ([], []), "normuon": ([], [])}
    for s, opts in layout.items():
        row = {"s": s}
        for opt in opts:
            row[opt] = mean_se([means[(s, opt, k)] for k in opts[opt]])
        for other in ("muon", "normuon"):
            if other not in opts or "adamw" not in opts:
                continue
            seeds = sorted(set(opts["adamw"]) & set(opts[other]))
            a = [means[(s, "adamw", k)] for k in seeds]
            b = [means[(s, other, k)] for k in seeds]
            ratios = [x / y for x, y in zip(a, b)]
            row[f"adamw/{other}"] = log_ratio_interval(a, b)
            row[f"adamw/{other}_seeds"] = ratios
            for x, y, r in zip(a, b, ratios):
                if x > 0 and y > 0:
                    trend_points[other][0].append(s)
                    trend_points[other][1].append(math.log(r))
        rows.append(row)
    trend = {other: slope_interval(*pts) for other, pts in trend_points.items()}
    out["trend"] = trend
    out["rows"] = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in r.items()} for r in rows]
    return rows, trend


def sweep_section(study, md, summary):
    """The learning-rate sweep's table (STUDY/sweep.csv) into `md` and `summary`; the sweep."""
    sweep = pd.read_csv(os.path.join(study, "sweep.csv"))
    md.append("## Learning-rate sweep (seed 0, validation loss after the last update)\n")
    md.append("| s | optimizer | learning rate: validation loss | chosen |")
    md.append("|---|---|---|---|")
    for (s, opt), g in sweep.groupby(["s", "optimizer"], sort=False):
        cells = [f"{r.lr:g}: {r.val_loss:.4f}" for r in g.itertuples()]
        chosen = g[g["chosen"] == 1]["lr"].iloc[0]
        md.append(f"| {s:g} | {opt} | " + ", ".join(cells) + f" | {chosen:g} |")
    summary["sweep"] = sweep.to_dict(orient="records")
    return sweep


def main():
    study = sys.argv[1]
    plots = os.path.join(study, "plots")
    os.makedirs(plots, exist_ok=True)
    layout = study_layout(study)
    totals, blocks, components, buckets, comparisons = load(study, layout)
    audited, late = windows(totals["step"])
    summary = {"audited_steps": audited, "late_steps": late, "layout": {s_name(s): v for s, v in layout.items()}}
    md = []

    sweep = sweep_section(study, md, summary)

    # Validation loss per optimizer.
    md.append("\n## Validation loss after the last update (balanced validation set, mean ± SE over seeds)\n")
    md.append("| s | " + " | ".join(OPTIMIZERS) + " | head tokens (adamw / muon) | tail tokens (adamw / muon) |")
    md.append("|---|---|---|---|---|---|")
    fig, axes = plt.subplots(1, len(layout), figsize=(5 * len(layout), 4), squeeze=False)
    summary["val_loss"] = {}
    for ax, (s, opts) in zip(axes[0], layout.items()):
        cells, head, tail = [], [], []
        for opt in OPTIMIZERS:
            finals, heads, tails = [], [], []
            for k in opts.get(opt, []):
                log = curvplot.training_log(os.path.join(study, "study", f"s{s_name(s)}", f"{opt}_seed{k}"))
                finals.append(float(log["val_loss"].iloc[-1]))
                heads.append(float(log["val_head_loss"].iloc[-1]))
                tails.append(float(log["val_tail_loss"].iloc[-1]))
                ax.plot(log["step"], log["val_loss"], color=f"C{OPTIMIZERS.index(opt)}", lw=0.8,
                        label=opt if k == opts[opt][0] else None)
            cells.append(fmt_pm(*mean_se(finals)[:2], digits=4))
            summary["val_loss"][f"{s_name(s)}/{opt}"] = {"final": finals, "head": heads, "tail": tails}
            if opt in ("adamw", "muon"):
                head.append(fmt(mean_se(heads)[0], 4))
                tail.append(fmt(mean_se(tails)[0], 4))
        md.append(f"| {s:g} | " + " | ".join(cells) + f" | {' / '.join(head)} | {' / '.join(tail)} |")
        ax.set_title(f"validation loss, s = {s:g}")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "validation_loss.png"), dpi=100)

    # NDS and the Adam/Muon ratio per s, in both windows.
    for label, steps in (("all audited checkpoints", audited), ("late checkpoints", late)):
        rows, trend = nds_table(totals, layout, steps, summary.setdefault(label, {}))
        md.append(f"\n## NDS of the update, {label} (steps {steps[0]}–{steps[-1]})\n")
        md.append("Mean NDS on the balanced probe set (mean ± SE over seeds); ratios per seed, "
                  "combined as a geometric mean with its 95% t-interval over seeds.\n")
        md.append("| s | NDS adamw | NDS muon | NDS normuon | adamw/muon [95% CI] | adamw/normuon [95% CI] | "
                  "per-seed adamw/muon |")
        md.append("|---|---|---|---|---|---|---|")
        for r in rows:
            md.append(f"| {r['s']:g} | " + " | ".join(fmt_pm(*r[o][:2]) if o in r else "–" for o in OPTIMIZERS)
                      + f" | {fmt_ci(r['adamw/muon'])} | {fmt_ci(r['adamw/normuon'])} | "
                      + ", ".join(fmt(x) for x in r["adamw/muon_seeds"]) + " |")
        base = rows[0]["muon"][0] if "muon" in rows[0] else float("nan")
        md.append("\nNormalised as the paper normalises (by Muon's mean NDS at s = "
                  f"{rows[0]['s']:g}): " + "; ".join(
                      f"s = {r['s']:g}: " + ", ".join(f"{o} {fmt(r[o][0] / base)}" for o in OPTIMIZERS if o in r)
                      for r in rows) + ".")
        summary[label]["normalised_by_muon_at_first_s"] = {
            s_name(r["s"]): {o: r[o][0] / base for o in OPTIMIZERS if o in r} for r in rows}
        for other, t in trend.items():
            md.append(f"\nTrend of log(adamw/{other}) with s: slope {fmt(t['slope'])} "
                      f"[{fmt(t['low'])}, {fmt(t['high'])}] per unit s "
                      f"(the ratio × {fmt(math.exp(t['slope']) if np.isfinite(t['slope']) else float('nan'))}"
                      f" from s = 0 to s = 1; {t['n']} points).")

    # The fixed-rate control: AdamW and Muon at the first s's rates at every s.
    control = control_totals(study, layout, totals)
    if control is not None:
        first = min(layout)
        rates = {o: sweep[(sweep["s"] == first) & (sweep["optimizer"] == o) & (sweep["chosen"] == 1)]["lr"].iloc[0]
                 for o in ("adamw", "muon")}
        control_layout = {s: {o: opts[o] for o in ("adamw", "muon")} for s, opts in layout.items()}
        for label, steps in (("all audited checkpoints", audited), ("late checkpoints", late)):
            rows, trend = nds_table(control, control_layout, steps, summary.setdefault("control " + label, {}))
            md.append(f"\n## Fixed learning rates (control), {label} (steps {steps[0]}–{steps[-1]})\n")
            md.append(f"AdamW at lr {rates['adamw']:g} and Muon at lr {rates['muon']:g} (the rates chosen at "
                      f"s = {first:g}) at every s; statistics as above.\n")
            md.append("| s | NDS adamw | NDS muon | adamw/muon [95% CI] | per-seed adamw/muon |")
            md.append("|---|---|---|---|---|")
            for r in rows:
                md.append(f"| {r['s']:g} | {fmt_pm(*r['adamw'][:2])} | {fmt_pm(*r['muon'][:2])} | "
                          f"{fmt_ci(r['adamw/muon'])} | " + ", ".join(fmt(x) for x in r["adamw/muon_seeds"]) + " |")
            t = trend["muon"]
            md.append(f"\nTrend of log(adamw/muon) with s at fixed rates: slope {fmt(t['slope'])} "
                      f"[{fmt(t['low'])}, {fmt(t['high'])}] per unit s ({t['n']} points).")

    # The Taylor audit: what each update was predicted to gain and what it gained, probe set.
    md.append("\n## Predicted and realized loss change of the update, late checkpoints\n")
    md.append("Mean over the late checkpoints, mean ± SE over seeds, on the balanced probe set: the "
              "first-order term g·u, the curvature penalty ½uᵀHu, the predicted change "
              "g·u + ½uᵀHu and the realized change L(θ+u) − L(θ):\n")
    md.append("| s | optimizer | g·u | ½uᵀHu | predicted | realized | ‖u‖ |")
    md.append("|---|---|---|---|---|---|---|")
    summary["taylor"] = []
    fig, axes = plt.subplots(1, len(layout), figsize=(5 * len(layout), 4), squeeze=False)
    for ax, (s, opts) in zip(axes[0], layout.items()):
        for opt in OPTIMIZERS:
            d = totals[(totals["s"] == s) & (totals["opt"] == opt)]
            d = d.assign(penalty=0.5 * d["curvature"])
            cells, entry = [], {"s": s, "opt": opt}
            for column in ("first_order", "penalty", "predicted", "realized", "update_norm"):
                per = per_seed_mean(d, column, late)
                m, se, _ = mean_se([per[(s, opt, k)] for k in opts.get(opt, [])])
                cells.append(fmt_pm(m, se))
                entry[column] = m
            md.append(f"| {s:g} | {opt} | " + " | ".join(cells) + " |")
            summary["taylor"].append(entry)
            a = d[d["step"].isin(audited)]
            ax.scatter(-a["predicted"], -a["realized"], s=8, color=f"C{OPTIMIZERS.index(opt)}", label=opt)
        lim = max(1e-9, float(max((-totals["predicted"]).max(), (-totals["realized"]).max())))
        ax.plot([0, lim], [0, lim], "k--", lw=0.8)
        ax.set_xlabel("predicted decrease −(g·u + ½uᵀHu)")
        ax.set_ylabel("realized decrease L(θ) − L(θ+u)")
        ax.set_title(f"Taylor audit of the update (probe set), s = {s:g}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "predicted_vs_realized.png"), dpi=100)

    # The probe set's own noise on the paired comparisons.
    comp = comparisons[comparisons["step"].isin(audited)].copy()
    comp["rel_se"] = comp["ratio_stderr"] / comp["ratio"].abs()
    comp["significant"] = (comp["difference"].abs() > 2 * comp["difference_stderr"])
    md.append("\n## Paired comparisons on the probe batches (ndsprobe --compare)\n")
    md.append("Per checkpoint and seed: NDS_adamw − NDS_other with the standard error of the per-batch "
              "differences. The share of checkpoints where AdamW's NDS is the larger by more than two "
              "standard errors, and the median relative standard error of the per-checkpoint ratio:\n")
    md.append("| s | pair | checkpoints | adamw larger (> 2 SE) | other larger (> 2 SE) | median relative SE of the ratio |")
    md.append("|---|---|---|---|---|---|")
    summary["paired"] = []
    for (s, other), g in comp.groupby(["s", comp["run_b"].str.extract(r"(\w+?)_seed")[0]]):
        larger = int(((g["difference"] > 0) & g["significant"]).sum())
        smaller = int(((g["difference"] < 0) & g["significant"]).sum())
        med = float(g["rel_se"].median())
        md.append(f"| {s:g} | adamw/{other} | {len(g)} | {larger} | {smaller} | {fmt(med, 2)} |")
        summary["paired"].append({"s": s, "other": other, "checkpoints": len(g), "adamw_larger": larger,
                                  "other_larger": smaller, "median_relative_se": med})

    # ρ_within over training per optimizer (layer blocks), and its early and late means.
    md.append("\n## Within-layer share ρ_within (layer blocks: embeddings, each layer, head)\n")
    md.append("Mean over seeds ± SE of ρ_within = Σ_l C_ll / uᵀHu, early (first three audited "
              "checkpoints) and late (the late window):\n")
    md.append("| s | optimizer | early | late | late − early [95% CI] |")
    md.append("|---|---|---|---|---|")
    early = audited[:3]
    summary["rho_within"] = []
    fig, axes = plt.subplots(1, len(layout), figsize=(5 * len(layout), 4), squeeze=False)
    for ax, (s, opts) in zip(axes[0], layout.items()):
        for opt in OPTIMIZERS:
            d = totals[(totals["s"] == s) & (totals["opt"] == opt) & totals["step"].isin(audited)]
            by_step = d.groupby("step")["rho_within"].agg(["mean", "std", "count"])
            se = by_step["std"] / np.sqrt(by_step["count"])
            curvplot.errorbar(ax, by_step.index, by_step["mean"], se, marker="o", ms=3, label=opt,
                              color=f"C{OPTIMIZERS.index(opt)}")
            e = per_seed_mean(d, "rho_within", early)
            lt = per_seed_mean(d, "rho_within", late)
            seeds = opts.get(opt, [])
            diffs = [lt[(s, opt, k)] - e[(s, opt, k)] for k in seeds]
            dm, dse, n = mean_se(diffs)
            half = t95(n - 1) * dse if n > 1 else float("nan")
            em, ese, _ = mean_se([e[(s, opt, k)] for k in seeds])
            lm, lse, _ = mean_se([lt[(s, opt, k)] for k in seeds])
            md.append(f"| {s:g} | {opt} | {fmt_pm(em, ese)} | {fmt_pm(lm, lse)} | "
                      f"{fmt(dm)} [{fmt(dm - half)}, {fmt(dm + half)}] |")
            summary["rho_within"].append({"s": s, "opt": opt, "early": em, "early_se": ese, "late": lm,
                                          "late_se": lse, "change": dm, "change_low": dm - half,
                                          "change_high": dm + half})
        ax.set_title(f"ρ_within of the update, s = {s:g}")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "rho_within.png"), dpi=100)

    # Component blocks: where the curvature sits, and the Adam/Muon ratio per component kind.
    md.append("\n## Component blocks, late checkpoints\n")
    md.append("Per component kind (summed over the layers): its NDS Σ C_ll / Σ ‖u_l‖² per optimizer "
              "(mean over seeds), the Adam/Muon ratio [95% CI over seeds], and ρ_within at component "
              "granularity.\n")
    comp_blocks = components[(components["block"] != "total") & components["step"].isin(late)].copy()
    comp_blocks["kind"] = comp_blocks["block"].str.replace(r"^model\.layers\.\d+\.", "", regex=True)
    kinds = list(dict.fromkeys(comp_blocks["kind"]))
    md.append("| s | component | NDS adamw | NDS muon | adamw/muon [95% CI] |")
    md.append("|---|---|---|---|---|")
    summary["components"] = []
    for s, opts in layout.items():
        for kind in kinds:
            d = comp_blocks[(comp_blocks["s"] == s) & (comp_blocks["kind"] == kind)]
            per = d.groupby(["opt", "seed", "step"])[["curvature", "sq_norm"]].sum()
            per = (per["curvature"] / per["sq_norm"]).groupby(["opt", "seed"]).mean()
            if "adamw" not in per or "muon" not in per:
                continue
            seeds = sorted(set(per["adamw"].index) & set(per["muon"].index))
            ratio = log_ratio_interval([per["adamw"][k] for k in seeds], [per["muon"][k] for k in seeds])
            md.append(f"| {s:g} | {kind} | {fmt(per['adamw'].mean())} | {fmt(per['muon'].mean())} | "
                      f"{fmt_ci(ratio)} |")
            summary["components"].append({"s": s, "kind": kind, "adamw": float(per["adamw"].mean()),
                                          "muon": float(per["muon"].mean()), "ratio": ratio})
    ct = components[(components["block"] == "total") & components["step"].isin(late)]
    md.append("\nρ_within with component blocks (late, mean ± SE over seeds): " + "; ".join(
        f"s = {s:g}: " + ", ".join(
            f"{opt} {fmt_pm(*mean_se(list(per_seed_mean(ct[ct['s'] == s], 'rho_within', late)[(s, opt, k)] for k in opts[opt]))[:2])}"
            for opt in OPTIMIZERS if opt in opts) for s, opts in layout.items()) + ".")

    # Head vs tail tokens.
    md.append("\n## Head and tail tokens (training-stream frequencies, half the mass each), late checkpoints\n")
    md.append("NDS of the mean per-token loss of each bucket (`nds_mean`), mean over seeds, and the "
              "Adam/Muon ratio per bucket [95% CI over seeds]:\n")
    md.append("| s | bucket | NDS adamw | NDS muon | NDS normuon | adamw/muon [95% CI] |")
    md.append("|---|---|---|---|---|---|")
    b = buckets[(buckets["direction"] == "update") & buckets["step"].isin(late)]
    summary["buckets"] = []
    fig, axes = plt.subplots(1, len(layout), figsize=(5 * len(layout), 4), squeeze=False)
    for ax, (s, opts) in zip(axes[0], layout.items()):
        for bucket in ("head", "tail"):
            d = b[(b["s"] == s) & (b["bucket"] == bucket)]
            per = d.groupby(["opt", "seed"])["nds_mean"].mean()
            cells = [fmt(per[o].mean()) if o in per else "–" for o in OPTIMIZERS]
            seeds = sorted(set(per["adamw"].index) & set(per["muon"].index))
            ratio = log_ratio_interval([per["adamw"][k] for k in seeds], [per["muon"][k] for k in seeds])
            md.append(f"| {s:g} | {bucket} | " + " | ".join(cells) + f" | {fmt_ci(ratio)} |")
            summary["buckets"].append({"s": s, "bucket": bucket,
                                       **{o: float(per[o].mean()) for o in OPTIMIZERS if o in per},
                                       "ratio": ratio})
            dd = buckets[(buckets["s"] == s) & (buckets["bucket"] == bucket) & buckets["step"].isin(audited)
                         & (buckets["direction"] == "update")]
            for opt in OPTIMIZERS:
                g = dd[dd["opt"] == opt].groupby("step")["nds_mean"].mean()
                ax.plot(g.index, g.values, marker="o" if bucket == "head" else "x", ms=3,
                        ls="-" if bucket == "head" else "--", color=f"C{OPTIMIZERS.index(opt)}",
                        label=f"{opt} {bucket}")
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.set_title(f"NDS per bucket (mean token), s = {s:g}")
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "head_tail_nds.png"), dpi=100)

    # NDS over training and the ratio against s.
    fig, axes = plt.subplots(1, len(layout) + 1, figsize=(5 * (len(layout) + 1), 4), squeeze=False)
    for ax, (s, opts) in zip(axes[0], layout.items()):
        for opt in OPTIMIZERS:
            d = totals[(totals["s"] == s) & (totals["opt"] == opt) & totals["step"].isin(audited)]
            g = d.groupby("step")["nds"].agg(["mean", "std", "count"])
            curvplot.errorbar(ax, g.index, g["mean"], g["std"] / np.sqrt(g["count"]), marker="o", ms=3,
                              label=opt, color=f"C{OPTIMIZERS.index(opt)}")
        ax.set_yscale("log")
        ax.set_title(f"NDS of the update (mean ± SE over seeds), s = {s:g}")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    ax = axes[0][-1]
    for i, other in enumerate(("muon", "normuon")):
        rows = summary["all audited checkpoints"]["rows"]
        xs = [r["s"] + 0.02 * (i - 0.5) for r in rows]
        ys = [r[f"adamw/{other}"]["ratio"] for r in rows]
        lo = [r[f"adamw/{other}"]["ratio"] - r[f"adamw/{other}"]["low"] for r in rows]
        hi = [r[f"adamw/{other}"]["high"] - r[f"adamw/{other}"]["ratio"] for r in rows]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=f"adamw/{other} (95% CI)")
    if "control all audited checkpoints" in summary:
        rows = summary["control all audited checkpoints"]["rows"]
        d = [r["adamw/muon"] for r in rows]
        ax.errorbar([r["s"] + 0.03 for r in rows], [x["ratio"] for x in d],
                    yerr=[[x["ratio"] - x["low"] for x in d], [x["high"] - x["ratio"] for x in d]],
                    marker="s", capsize=3, label="adamw/muon at fixed rates (95% CI)")
    ax.plot([0, 1], [1.63, 2.38 / 1.25], "k--", lw=0.8, label="paper: adamw/muon at s = 0 and 1")
    ax.axhline(1, color="k", lw=0.5)
    ax.set_yscale("log")
    ax.set_xlabel("Zipf exponent s")
    ax.set_title("NDS ratio over all audited checkpoints")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(plots, "nds_ratio.png"), dpi=100)

    write_summary(study, md, summary)


def write_summary(study, md, summary):
    """STUDY/summary.md from the markdown lines `md`, STUDY/summary.json from `summary`; prints
    the markdown."""
    text = "\n".join(md) + "\n"
    with open(os.path.join(study, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(study, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    print(text)


if __name__ == "__main__":
    main()
