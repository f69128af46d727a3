"""ndsprobe from Python: saved checkpoint directories (every layout ndsprobe reads), a built-in or
exported model, a probe data file; the same engine, the same HDF5 file, and every table of it
returned in memory as DataFrames."""
import shlex
import sys
from dataclasses import dataclass
from typing import Dict

import pandas as pd
import torch

from . import _curv
from ._dtypes import DTYPES as _DTYPES, vector_dtype_name as _vector_dtype_name
from ._runtime import init_runtime



@dataclass
class CheckpointResults:
    """What probe_checkpoints wrote: the output file, the run's summary (units, engine seconds,
    HVPs, ...) and every table of the file by its path ("/taylor", "/runs/<run>/step_<N>/
    <direction>/blocks", ...), with the file's columns, order and units (docs/hdf5-schema.md)."""
    output: str
    summary: Dict[str, float]
    tables: Dict[str, pd.DataFrame]

    @property
    def taylor(self):
        """The long table /taylor: one row per unit and block ("total" first)."""
        return self.table("/taylor")

    def table(self, path):
        if path not in self.tables:
            raise KeyError(f"{self.output}: no table {path} in the results")
        return self.tables[path]

    def unit(self, run, step, direction, name="blocks"):
        """A unit's table: "blocks", "batches", "multipliers", "within/<param>/modes", ..."""
        return self.table(f"/runs/{run}/step_{step}/{direction}/{name}")


def _taylor_options(coupling, coupling_samples, realized, multipliers, ggn, ggn_blocks, seed):
    o = _curv.TaylorOptions()
    o.coupling, o.coupling_samples, o.realized = coupling, coupling_samples, realized
    o.step_multipliers, o.ggn, o.ggn_blocks, o.seed = list(multipliers), ggn, ggn_blocks, seed
    return o


def _engine_options(hvp, micro_batch, max_memory, max_kept_graphs, reuse_graph, vector_dtype,
                    host_copies, recompute_layers):
    o = _curv.SessionOptions()
    o.hvp, o.micro_batch, o.max_memory = hvp, micro_batch, max_memory
    o.max_kept_graphs, o.reuse_graph = max_kept_graphs, reuse_graph
    o.vector_dtype, o.host_copies = _vector_dtype_name(vector_dtype), host_copies
    o.recompute_layers = recompute_layers
    return o


def _spectrum(job, eigenvalues, trace, density, per_block, precond_sharpness, overlap):
    job.set_spectrum(eigenvalues is not None, per_block, trace is not None, density is not None,
                     precond_sharpness, overlap, eigenvalues or _curv.EigenOptions(),
                     trace or _curv.TraceOptions(), density or _curv.DensityOptions())


def probe_checkpoints(runs, data, *, output="ndsprobe.h5", resume=False, model="",
                      directions=("delta", "gradient", "random"), steps="", stride=1,
                      layout="auto", param_order=_curv.ParamOrder.AUTO, param_order_file="",
                      optimizer="", whatif_fallback=False, allow_extra=False, batch_size=32,
                      examples=0, block_size=0, dtype=torch.float32, device="cpu", seed=0,
                      blocks=_curv.BlockRule.LAYER, coupling=_curv.Coupling.FULL,
                      coupling_samples=32, realized=True, multipliers=(), ggn=False,
                      ggn_blocks=False, within=None, token_buckets=None, compare=(),
                      eigenvalues=None, trace=None, density=None, per_block=False,
                      precond_sharpness=False, overlap=False, hvp=_curv.HvpMethod.EXACT,
                      micro_batch=0, max_memory=0, max_kept_graphs=0, reuse_graph=True,
                      vector_dtype=None, host_copies=False, recompute_layers=False,
                      prefetch=True, progress=None):
    """Probes every checkpoint of each run directory along `directions`, as ndsprobe does
    (docs/cli.md names each option's flag), writes `output` and returns its tables.

    runs: checkpoint directories, one run each. data: the probe data file (safetensors with
    inputs and targets, or a uint16 .bin with block_size and examples). model: a built-in .json
    config or a TorchScript file; "" takes the checkpoints' recorded config. blocks: a
    BlockRule or {name: regex}. within: a WithinOptions (None: off). token_buckets: a
    TokenBucketOptions (None: off). eigenvalues, trace, density: EigenOptions, TraceOptions,
    DensityOptions per checkpoint (None: off). dtype: the model's (float32, float64, bfloat16,
    float16). vector_dtype: the directions', gradients' and HVPs' (None: the model's, float32
    for a 16-bit model). recompute_layers: hold one layer's graph at a time (--recompute-layers;
    the built-in LLaMA family). progress: (done, total, label) after each unit;
    Ctrl-C stops after the unit in progress, everything before it kept (resume=True goes on).
    """
    init_runtime()
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype}: expected torch.float32, torch.float64, torch.bfloat16 "
                         "or torch.float16")
    job = _curv.ProbeJob()
    job.runs = [str(r) for r in ([runs] if isinstance(runs, str) else runs)]
    job.directions = list(directions)
    job.optimizer, job.whatif_fallback, job.allow_extra = optimizer, whatif_fallback, allow_extra
    job.seed, job.prefetch = seed, prefetch
    job.set_steps(steps, stride)
    job.set_layout(layout)
    job.set_param_order(param_order, str(param_order_file))
    job.taylor = _taylor_options(coupling, coupling_samples, realized, multipliers, ggn,
                                 ggn_blocks, seed)
    job.within = within is not None
    if within is not None:
        job.within_options = within
    if token_buckets is not None:
        job.token_buckets = token_buckets
    for pair in compare:
        job.add_comparison(pair)
    _spectrum(job, eigenvalues, trace, density, per_block, precond_sharpness, overlap)
    job.set_model(str(model), _DTYPES[dtype], device, seed)
    job.set_data(str(data), batch_size, examples, block_size, seed)
    if isinstance(blocks, dict):
        job.set_blocks(_curv.BlockRule.LAYER, list(blocks.items()))
    else:
        job.set_blocks(blocks, [])
    job.set_engine(_engine_options(hvp, micro_batch, max_memory, max_kept_graphs, reuse_graph,
                                   vector_dtype, host_copies, recompute_layers))
    job.set_output(str(output), resume, " ".join(shlex.quote(a) for a in sys.argv),
                   _DTYPES[dtype], seed, torch.get_num_threads())
    summary, path, tables = _curv.run_probe_job(job, progress)
    return CheckpointResults(path, summary, {k: pd.DataFrame(v) for k, v in tables.items()})
