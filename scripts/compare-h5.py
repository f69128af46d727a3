#!/usr/bin/env python3
"""Compares two HDF5 results files, or two directory trees of them, object by object.

Every group, dataset (dtype, shape, values bit for bit, NaN equal to NaN) and attribute must
match, except the attributes that record the time or the host a run took (wall times, peak
memory, the runtime summary). Refactorings of the writer are checked with it: a file written
before and after must be identical in everything else.

    compare-h5.py BEFORE AFTER [--replace OLD=NEW ...]

BEFORE and AFTER are files, or directories whose *.h5 files are compared pairwise by relative
path (both trees must hold the same set). --replace rewrites OLD to NEW in AFTER's strings
first, for paths that differ only by the output directory. Exit status 0 when identical.
"""
import argparse
import os
import sys

import h5py
import numpy as np

# Attributes that measure the run rather than describe its results.
TIMING_ATTRIBUTES = {"seconds", "peak_memory", "runtime", "wall_seconds", "elapsed"}


def normalise(value, replacements):
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        for old, new in replacements:
            value = value.replace(old, new)
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "OSU":
        return [normalise(v, replacements) for v in value.tolist()]
    return value


def same_values(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.kind == "f":
            return np.array_equal(a.view(np.uint8), b.view(np.uint8)) or np.array_equal(
                a, b, equal_nan=True)
        return np.array_equal(a, b)
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (np.isnan(a) and np.isnan(b))
    return type(a) == type(b) and a == b


def compare_attributes(path, a, b, replacements, problems):
    keys_a = set(a.attrs.keys()) - TIMING_ATTRIBUTES
    keys_b = set(b.attrs.keys()) - TIMING_ATTRIBUTES
    for k in sorted(keys_a ^ keys_b):
        problems.append(f"{path}: attribute '{k}' only in {'before' if k in keys_a else 'after'}")
    for k in sorted(keys_a & keys_b):
        va = normalise(a.attrs[k], [])
        vb = normalise(b.attrs[k], replacements)
        if isinstance(va, np.generic):
            va = va.item()
        if isinstance(vb, np.generic):
            vb = vb.item()
        if not same_values(va, vb):
            problems.append(f"{path}: attribute '{k}' differs: {va!r} vs {vb!r}")
        elif a.attrs.get_id(k).dtype != b.attrs.get_id(k).dtype:
            problems.append(f"{path}: attribute '{k}' dtype differs")


def compare_objects(path, a, b, replacements, problems):
    compare_attributes(path, a, b, replacements, problems)
    if isinstance(a, h5py.Dataset) != isinstance(b, h5py.Dataset):
        problems.append(f"{path}: a dataset in one file and a group in the other")
        return
    if isinstance(a, h5py.Dataset):
        if a.dtype != b.dtype or a.shape != b.shape:
            problems.append(f"{path}: dtype/shape {a.dtype}{a.shape} vs {b.dtype}{b.shape}")
            return
        if h5py.check_string_dtype(a.dtype):
            va = normalise(np.asarray(a.asstr()[()], dtype=object), [])
            vb = normalise(np.asarray(b.asstr()[()], dtype=object), replacements)
            if va != vb:
                problems.append(f"{path}: string values differ")
        elif not same_values(a[()], b[()]):
            problems.append(f"{path}: values differ")
        return
    names_a, names_b = list(a.keys()), list(b.keys())
    for n in sorted(set(names_a) ^ set(names_b)):
        problems.append(f"{path}/{n}: only in {'before' if n in names_a else 'after'}")
    if sorted(names_a) == sorted(names_b) and names_a != names_b:
        problems.append(f"{path}: children in another order")
    for n in names_a:
        if n in b:
            compare_objects(f"{path.rstrip('/')}/{n}", a[n], b[n], replacements, problems)


def compare_files(before, after, replacements):
    problems = []
    with h5py.File(before, "r") as a, h5py.File(after, "r") as b:
        compare_objects("/", a, b, replacements, problems)
    return problems


def h5_files(root):
    out = set()
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(".h5"):
                out.add(os.path.relpath(os.path.join(d, f), root))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--replace", action="append", default=[], metavar="OLD=NEW")
    args = parser.parse_args()
    replacements = [tuple(r.split("=", 1)) for r in args.replace]
    if os.path.isdir(args.before):
        files_a, files_b = h5_files(args.before), h5_files(args.after)
        pairs = [(os.path.join(args.before, f), os.path.join(args.after, f))
                 for f in sorted(files_a & files_b)]
        missing = sorted(files_a ^ files_b)
    else:
        pairs, missing = [(args.before, args.after)], []
    failed = bool(missing)
    for m in missing:
        print(f"{m}: in one tree only")
    for before, after in pairs:
        problems = compare_files(before, after, replacements)
        print(f"{before}: {'identical' if not problems else f'{len(problems)} difference(s)'}")
        for p in problems[:50]:
            print("  " + p)
        failed = failed or bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
