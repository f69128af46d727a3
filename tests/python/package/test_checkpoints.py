"""curv.probe_checkpoints: ndsprobe's job from Python on a built-in GPT's checkpoints (written by
curvtrain). Its file and its tables in memory are ndsprobe's, number for number; errors name the
package's keywords."""
import os
import subprocess

import h5py
import numpy as np
import pytest
import torch

import curv

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TOOLS = os.path.join(ROOT, "build-torch2", "tools")
NDSPROBE = os.environ.get("CURV_NDSPROBE", os.path.join(TOOLS, "ndsprobe", "ndsprobe"))
CURVTRAIN = os.environ.get("CURV_CURVTRAIN", os.path.join(TOOLS, "curvtrain", "curvtrain"))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    for tool in (NDSPROBE, CURVTRAIN):
        if not os.path.exists(tool):
            pytest.skip(f"no {tool} (set CURV_NDSPROBE and CURV_CURVTRAIN)")
    folder = tmp_path_factory.mktemp("gpt") / "adamw"
    done = subprocess.run([CURVTRAIN, "-o", str(folder), "--steps", "4", "--save-every", "2",
                           "--eval-every", "2", "--probe-sequences", "8", "--quiet"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return folder


def read_tables(path):
    """Every table of an HDF5 file (a group with a "columns" attribute) as {path: {column: array}}."""
    out = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Group) and "columns" in obj.attrs:
            columns = [c.decode() if isinstance(c, bytes) else c for c in obj.attrs["columns"]]
            out["/" + name] = {c: obj[c][()] for c in columns}
    with h5py.File(path) as f:
        f.visititems(visit)
        if "columns" in f.attrs:
            visit("", f)
    return out


def same_column(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind in "OSU" or b.dtype.kind in "OSU":
        decode = np.vectorize(lambda v: v.decode() if isinstance(v, bytes) else v, otypes=[object])
        return list(decode(a)) == list(decode(b))
    return np.array_equal(a, b, equal_nan=True)


def test_probe_checkpoints_writes_and_returns_ndsprobes_tables(run, tmp_path):
    data = str(run / "probe.safetensors")
    cli = tmp_path / "cli.h5"
    done = subprocess.run([NDSPROBE, str(run), "--data", data, "--dtype", "float64",
                           "--batch-size", "4", "--directions", "delta,gradient,adamw",
                           "--within", "--modes", "2", "--token-buckets", "head",
                           "--multipliers", "0.5,2", "--compare", "delta:adamw", "--spectrum",
                           "--eig-top", "1", "--eig-bottom", "0", "--quiet", "-o", str(cli)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    within = curv.WithinOptions()
    within.modes = 2
    buckets = curv.TokenBucketOptions()
    buckets.mode = curv.BucketMode.HEAD_TAIL
    eigen = curv.EigenOptions()
    eigen.top, eigen.bottom = 1, 0
    seen = []
    result = curv.probe_checkpoints(
        str(run), data, output=str(tmp_path / "package.h5"), dtype=torch.float64, batch_size=4,
        directions=("delta", "gradient", "adamw"), within=within, token_buckets=buckets,
        multipliers=(0.5, 2.0), compare=("delta:adamw",), eigenvalues=eigen,
        progress=lambda done, total, label: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1]
    assert result.summary["units"] == seen[-1][1] and result.summary["hvps"] > 0
    cli_tables = read_tables(cli)
    file_tables = read_tables(result.output)
    assert set(result.tables) == set(cli_tables) == set(file_tables)
    for path in ("/taylor", "/token_buckets", "/comparisons", "/runs/adamw/step_2/delta/blocks",
                 "/runs/adamw/step_2/adamw/multipliers", "/runs/adamw/step_0/spectrum/eigen"):
        assert path in result.tables
    timed = ("seconds",)
    for path, frame in result.tables.items():
        assert list(frame.columns) == list(file_tables[path]), path
        for column in frame.columns:
            # In memory exactly what the file holds; ndsprobe's the same numbers, timings aside.
            assert same_column(frame[column].to_numpy(), file_tables[path][column]), (path, column)
            if not any(t in column for t in timed):
                assert same_column(frame[column].to_numpy(), cli_tables[path][column]), \
                    (path, column)
    blocks = result.unit("adamw", 2, "delta")
    assert blocks.equals(result.table("/runs/adamw/step_2/delta/blocks"))
    assert "total" in set(result.taylor["block"])


def test_probe_checkpoints_errors_name_keywords(run, tmp_path):
    data = str(run / "probe.safetensors")
    with pytest.raises(ValueError, match=r"param_order=file:.*absent: no such file"):
        curv.probe_checkpoints(str(run), data, output=str(tmp_path / "x.h5"),
                               param_order=curv.ParamOrder.FILE,
                               param_order_file=str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"comparisons='delta': expected A:B"):
        curv.probe_checkpoints(str(run), data, output=str(tmp_path / "x.h5"), compare=("delta",))
    with pytest.raises(ValueError, match="coupling_samples=1"):
        curv.probe_checkpoints(str(run), data, output=str(tmp_path / "x.h5"),
                               coupling=curv.Coupling.RANDOMIZED, coupling_samples=1)
    assert not (tmp_path / "x.h5").exists()


def test_probe_checkpoints_in_bfloat16_with_a_vector_dtype_is_ndsprobes(run, tmp_path):
    data = str(run / "probe.safetensors")
    cli = tmp_path / "cli.h5"
    done = subprocess.run([NDSPROBE, str(run), "--data", data, "--dtype", "bfloat16",
                           "--vector-dtype", "bfloat16", "--batch-size", "4", "--directions",
                           "delta", "--host-copies", "--quiet", "-o", str(cli)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result = curv.probe_checkpoints(str(run), data, output=str(tmp_path / "package.h5"),
                                    dtype=torch.bfloat16, vector_dtype=torch.bfloat16,
                                    host_copies=True, batch_size=4, directions=("delta",))
    with h5py.File(result.output) as f, h5py.File(cli) as g:
        unit = "runs/adamw/step_2/delta"
        for name in ("dtype", "vector_dtype", "hvp_method"):
            assert f[unit].attrs[name] == g[unit].attrs[name], name
        vectors = f[unit].attrs["vector_dtype"]
        assert (vectors.decode() if isinstance(vectors, bytes) else vectors) == "bfloat16"
        assert f[unit].attrs["nds"] == g[unit].attrs["nds"]
    with pytest.raises(ValueError, match="vector_dtype torch.int32"):
        curv.probe_checkpoints(str(run), data, output=str(tmp_path / "x.h5"),
                               vector_dtype=torch.int32)


def test_probe_checkpoints_layer_by_layer_is_the_whole_graphs(run, tmp_path):
    config = tmp_path / "llama.json"
    config.write_text('{"arch": "llama", "vocab_size": 64, "hidden_size": 16, '
                      '"intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, '
                      '"num_key_value_heads": 2, "max_position_embeddings": 16}')
    folder = tmp_path / "llama"
    done = subprocess.run([CURVTRAIN, "--model", str(config), "-o", str(folder), "--steps", "2",
                           "--save-every", "2", "--eval-every", "2", "--probe-sequences", "6",
                           "--dtype", "float64", "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    data = str(folder / "probe.safetensors")
    nds = {}
    for layered in (False, True):
        result = curv.probe_checkpoints(str(folder), data, output=str(tmp_path / f"{layered}.h5"),
                                        dtype=torch.float64, batch_size=3, micro_batch=2,
                                        directions=("delta", "gradient"), steps="0:0",
                                        recompute_layers=layered,
                                        eigenvalues=curv.EigenOptions())
        with h5py.File(result.output) as f:
            step = f["runs/llama/step_0"]
            nds[layered] = [step[d].attrs["nds"] for d in ("delta", "gradient")]
            nds[layered].extend(step["spectrum/eigen/eigenvalue"][()])
    np.testing.assert_allclose(nds[True], nds[False], rtol=1e-9)
