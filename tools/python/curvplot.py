"""Reading and plotting libcurv's HDF5 results (schema: docs/hdf5-schema.md).

Runs on Debian's system python3 (python3-h5py, python3-pandas, python3-matplotlib). Used by the
demo and by every notebook in notebooks/.
"""
import csv
import os

import h5py
import numpy as np
import pandas as pd


def _decode(values):
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def read_table(path, group):
    """A table group (one dataset per column, attribute 'columns') as a DataFrame."""
    with h5py.File(path, "r") as f:
        g = f[group]
        columns = [c.decode() if isinstance(c, bytes) else c for c in g.attrs["columns"]]
        data = {}
        for c in columns:
            values = g[c][()]
            data[c] = _decode(values) if values.dtype.kind in "OS" else values
    return pd.DataFrame(data, columns=columns)


def taylor(path):
    """The long table /taylor: one row per (run, step, direction, block)."""
    return read_table(path, "/taylor")


def totals(path, direction=None):
    """Whole-model rows of /taylor, optionally for one direction."""
    df = taylor(path)
    df = df[df["block"] == "total"]
    if direction is not None:
        df = df[df["direction"] == direction]
    return df.sort_values(["run", "step"]).reset_index(drop=True)


def block_pivot(blocks, column):
    """Block rows of /taylor (one run and direction) as a block × step table of `column`, blocks
    in the file's order."""
    order = list(dict.fromkeys(blocks["block"]))
    return blocks.pivot_table(index="block", columns="step", values=column, aggfunc="first").reindex(order)


def has_group(path, group):
    """Whether the file holds `group` (a table such as /comparisons or /token_buckets)."""
    with h5py.File(path, "r") as f:
        return group in f


def root_attributes(path):
    with h5py.File(path, "r") as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}


def coupling(path, run, step, direction):
    """The coupling matrix C and its block names at one unit."""
    with h5py.File(path, "r") as f:
        g = f[f"/runs/{run}/step_{step}/{direction}"]
        names = _decode(g["blocks"]["name"][()])
        return g["coupling"][()], names


def within(path, run, step, direction):
    """Within-block results of one unit: {param: {'attrs', 'singular_values', 'modes', 'groups'}}."""
    out = {}
    with h5py.File(path, "r") as f:
        w = f[f"/runs/{run}/step_{step}/{direction}/within"]
        for name in _decode(list(w.attrs["params"])):
            p = w[name]
            out[name] = {
                "attrs": dict(p.attrs),
                "singular_values": p["singular_values"][()],
                "modes": read_table(path, f"{p.name}/modes"),
                "groups": read_table(path, f"{p.name}/groups"),
            }
    return out


def training_log(run_dir):
    """curvtrain's log.csv as a DataFrame."""
    return pd.read_csv(os.path.join(run_dir, "log.csv"))


def optimizer_of(run):
    """'adamw_s1' -> 'adamw'."""
    return run.split("_")[0]


def exponent_of(run):
    """'adamw_s1' -> 1.0 (NaN when the run name carries no _s<value>)."""
    for part in run.split("_")[1:]:
        if part.startswith("s"):
            try:
                return float(part[1:])
            except ValueError:
                pass
    return float("nan")


def nds_ratio(df, numerator="adamw", denominator="muon", statistic="mean", min_step=1):
    """NDS statistic ("mean" or "median") of one optimizer's runs over another's, per exponent s,
    over steps >= min_step: {s: ratio}. Step 0 is the initialization, where every run sees
    negative curvature, so it is left out by default."""
    df = df[df["step"] >= min_step]
    df = df.assign(opt=df["run"].map(optimizer_of), s=df["run"].map(exponent_of))
    out = {}
    for s, group in df.groupby("s"):
        stats = group.groupby("opt")["nds"].agg(statistic)
        if numerator in stats and denominator in stats:
            out[s] = float(stats[numerator] / stats[denominator])
    return out


def batch_stderr(x, weights):
    """Standard error over probe batches of the weighted mean sum(w_b x_b):
    sqrt(B/(B-1) * sum(w_b^2 (x_b - mean)^2)); NaN for a single batch (docs/concepts.md)."""
    x, w = np.asarray(x, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    if len(x) < 2:
        return float("nan")
    mean = float(np.sum(w * x))
    return float(np.sqrt(len(x) / (len(x) - 1) * np.sum((w * (x - mean)) ** 2)))


def ratio_stderr(a, c, weights):
    """Delta-method standard error of the ratio of weighted means sum(w a) / sum(w c)."""
    a, c, w = (np.asarray(v, dtype=np.float64) for v in (a, c, weights))
    c_mean = float(np.sum(w * c))
    if len(a) < 2 or c_mean == 0:
        return float("nan")
    ratio = float(np.sum(w * a)) / c_mean
    return batch_stderr((a - ratio * c) / c_mean, w)


def batch_terms(path, run, step, direction):
    """A unit's per-batch terms (weight, loss, first_order, curvature, realized, within) as a
    DataFrame, plus the column 'nds' = curvature / ||u||^2."""
    df = read_table(path, f"/runs/{run}/step_{step}/{direction}/batches")
    with h5py.File(path, "r") as f:
        u = float(f[f"/runs/{run}/step_{step}/{direction}"].attrs["update_norm"])
    return df.assign(nds=df["curvature"] / (u * u))


def _unit_steps(path, run, direction):
    with h5py.File(path, "r") as f:
        if f"/runs/{run}" not in f:
            return []
        steps = []
        for name, group in f[f"/runs/{run}"].items():
            if name.startswith("step_") and direction in group and "batches" in group[direction]:
                steps.append(int(name[5:]))
        return sorted(steps)


def paired_nds(path_a, unit_a, path_b=None, unit_b=None):
    """Paired NDS comparison of two units ("RUN/DIRECTION") at every step both have, from their
    per-batch terms: one row per step with nds_a, nds_b, difference (a - b), difference_stderr,
    ratio (a / b) and ratio_stderr (delta method). path_b defaults to path_a; two files must have
    been probed on the same probe set (their probe_hash attributes are compared)."""
    path_b = path_b or path_a
    unit_b = unit_b or unit_a
    if path_b != path_a:
        ha, hb = root_attributes(path_a)["probe_hash"], root_attributes(path_b)["probe_hash"]
        if ha != hb:
            raise ValueError(f"{path_a} and {path_b} were probed on different probe sets "
                             f"(probe_hash {ha} vs {hb}): a paired comparison needs the same batches")
    run_a, direction_a = unit_a.split("/", 1)
    run_b, direction_b = unit_b.split("/", 1)
    rows = []
    steps_b = set(_unit_steps(path_b, run_b, direction_b))
    for step in _unit_steps(path_a, run_a, direction_a):
        if step not in steps_b:
            continue
        a = batch_terms(path_a, run_a, step, direction_a)
        b = batch_terms(path_b, run_b, step, direction_b)
        if not np.array_equal(a["weight"].to_numpy(), b["weight"].to_numpy()):
            raise ValueError(f"step {step}: {unit_a} and {unit_b} have different probe batches")
        w = a["weight"].to_numpy()
        na, nb = a["nds"].to_numpy(), b["nds"].to_numpy()
        mean_a, mean_b = float(np.sum(w * na)), float(np.sum(w * nb))
        rows.append({"step": step, "nds_a": mean_a, "nds_b": mean_b,
                     "difference": mean_a - mean_b,
                     "difference_stderr": batch_stderr(na - nb, w),
                     "ratio": mean_a / mean_b, "ratio_stderr": ratio_stderr(na, nb, w)})
    return pd.DataFrame(rows, columns=["step", "nds_a", "nds_b", "difference",
                                       "difference_stderr", "ratio", "ratio_stderr"])


def errorbar(ax, x, y, yerr=None, **kwargs):
    """ax.errorbar where some standard error is finite, else ax.plot: a single probe batch gives
    NaN standard errors, which matplotlib's errorbar cannot draw."""
    if yerr is not None and np.isfinite(np.asarray(yerr, dtype=np.float64)).any():
        return ax.errorbar(x, y, yerr=yerr, capsize=2, **kwargs)
    return ax.plot(x, y, **kwargs)


def plot_over_training(ax, df, column, title, scale="linear", errorbars=True):
    """One line per run of `column` against step, with ±1 standard-error bars where the frame has
    a `<column>_stderr` column (errorbars=False leaves them out). scale: linear, log, or symlog
    (for signed quantities such as NDS, whose negative values a log axis would drop)."""
    stderr = f"{column}_stderr"
    for run, group in df.groupby("run"):
        yerr = group[stderr] if errorbars and stderr in group else None
        errorbar(ax, group["step"], group[column], yerr, marker="o", ms=3, label=run)
    ax.set_title(title)
    ax.set_xlabel("step")
    if scale == "symlog":
        ax.set_yscale("symlog", linthresh=1e-2)
        ax.axhline(0, color="k", lw=0.5)
    elif scale == "log":
        ax.set_yscale("log")
    ax.legend(fontsize=7)


def _checkpoint_groups(f):
    """(run, step, group) for every /runs/<run>/step_<N> group of an open file."""
    for run in f["runs"]:
        for name, group in f[f"runs/{run}"].items():
            if name.startswith("step_"):
                yield run, int(name[len("step_"):]), group


def _per_checkpoint_table(path, table, columns):
    """The table spectrum/<table> of every checkpoint that has one, with run and step columns."""
    with h5py.File(path, "r") as f:
        names = [(run, step, g.name) for run, step, g in _checkpoint_groups(f) if f"spectrum/{table}" in g]
    frames = [read_table(path, f"{name}/spectrum/{table}").assign(run=run, step=step)
              for run, step, name in names]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def eigenvalues(path):
    """Every checkpoint's eigen table (ndsprobe --spectrum) with run and step columns."""
    return _per_checkpoint_table(path, "eigen", ["run", "step", "block", "which", "rank", "eigenvalue", "residual"])


def traces(path):
    """Every checkpoint's trace table (ndsprobe --trace) with run and step columns."""
    return _per_checkpoint_table(path, "trace", ["run", "step", "block", "estimate", "standard_error"])


def density(path, run, step):
    """SLQ spectral density of one checkpoint (ndsprobe --density): grid, density, nodes,
    weights and the group's attributes."""
    with h5py.File(path, "r") as f:
        g = f[f"/runs/{run}/step_{step}/spectrum/density"]
        return {"grid": g["grid"][()], "density": g["density"][()], "nodes": g["nodes"][()],
                "weights": g["weights"][()], "attrs": dict(g.attrs)}


def density_units(path):
    """(run, step) of every checkpoint with a spectral density."""
    with h5py.File(path, "r") as f:
        return [(run, step) for run, step, g in _checkpoint_groups(f) if "spectrum/density" in g]


def preconditioned_sharpness(path):
    """One row per checkpoint with --precond-sharpness: status, sharpness, its adaptive
    edge-of-stability reference (2 + 2β₁)/((1 − β₁)·lr) and the hyper-parameters used."""
    rows = []
    with h5py.File(path, "r") as f:
        for run, step, g in _checkpoint_groups(f):
            if "spectrum/precond" not in g:
                continue
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g["spectrum/precond"].attrs.items()}
            rows.append({"run": run, "step": step, **attrs})
    return pd.DataFrame(rows)


def overlaps(path):
    """One row per unit with --overlap: share of ‖u‖² in the top-k eigenspace and the cosine
    between u and the gradient."""
    rows = []
    with h5py.File(path, "r") as f:
        for run, step, g in _checkpoint_groups(f):
            for direction, unit in g.items():
                if isinstance(unit, h5py.Group) and "overlap" in unit:
                    a = unit["overlap"].attrs
                    rows.append({"run": run, "step": step, "direction": direction,
                                 "eigenspace_share": float(a["eigenspace_share"]),
                                 "gradient_cosine": float(a["gradient_cosine"]), "k": int(a["k"])})
    return pd.DataFrame(rows)
