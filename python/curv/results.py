"""Typed results: dataclasses with the headline numbers, and pandas DataFrames with the columns,
order and units of the HDF5 tables (docs/hdf5-schema.md), built by the same layouts."""
from dataclasses import dataclass, field
from typing import Any, List, Optional

import numpy as np
import pandas as pd

from . import _curv


def _frame(columns):
    return pd.DataFrame(columns)


@dataclass
class Audit:
    """The second-order Taylor audit of one direction u at θ."""
    run: str
    step: int
    direction: str
    status: str
    loss: float          # L(θ)
    first_order: float   # g·u
    curvature: float     # uᵀHu
    predicted: float     # g·u + ½ uᵀHu
    realized: float      # L(θ+u) − L(θ) (NaN when not evaluated)
    nds: float           # uᵀHu / ‖u‖²
    nds_stderr: float
    eta_star: float
    update_norm: float
    s_within: float
    s_cross: float
    rho_within: float
    ggn_nds: float
    residual_nds: float
    hvps: int
    seconds: float
    table: pd.DataFrame        # the unit's rows of /taylor: "total", then one per block
    blocks: pd.DataFrame       # <unit>/blocks
    coupling: pd.DataFrame     # C_lm, blocks × blocks (empty unless Coupling.FULL)
    batches: pd.DataFrame      # <unit>/batches
    multipliers: pd.DataFrame  # <unit>/multipliers
    native: Any = field(repr=False, default=None)  # _curv.TaylorResult, for Report

    @classmethod
    def of(cls, r, run, step, direction):
        names = [b.name for b in r.blocks]
        coupling = pd.DataFrame(np.asarray(r.coupling), index=names, columns=names) \
            if np.asarray(r.coupling).size else pd.DataFrame()
        return cls(run=run, step=step, direction=direction, status=r.status, loss=r.loss,
                   first_order=r.first_order, curvature=r.curvature, predicted=r.predicted,
                   realized=r.realized, nds=r.nds, nds_stderr=r.nds_stderr, eta_star=r.eta_star,
                   update_norm=r.update_norm, s_within=r.s_within, s_cross=r.s_cross,
                   rho_within=r.rho_within, ggn_nds=r.ggn_nds, residual_nds=r.residual_nds,
                   hvps=r.hvps, seconds=r.seconds,
                   table=_frame(_curv.taylor_rows(run, step, direction, r)),
                   blocks=_frame(_curv.blocks_table(r)), coupling=coupling,
                   batches=_frame(_curv.batches_table(r.batches)),
                   multipliers=_frame(_curv.multipliers_table(r)), native=r)

    def brief(self):
        return self.native.brief() if self.native is not None else f"NDS {self.nds:.6g}"


@dataclass
class WithinParameter:
    name: str
    shape: List[int]
    sq_norm: float
    svd_entropy: float
    effective_rank: float
    top_k_energy: float
    singular_values: List[float]
    modes: pd.DataFrame   # <unit>/within/<param>/modes
    groups: pd.DataFrame  # <unit>/within/<param>/groups (heads, q/k/v slices, row chunks)


@dataclass
class Within:
    """The within-layer breakdown of a direction: singular modes and head groups per matrix."""
    params: List[WithinParameter]
    skipped: List[str]
    hvps: int
    native: Any = field(repr=False, default=None)

    @classmethod
    def of(cls, w):
        params = [WithinParameter(p.name, list(p.shape), p.sq_norm, p.svd_entropy,
                                  p.effective_rank, p.top_k_energy, list(p.singular_values),
                                  _frame(_curv.modes_table(p)), _frame(_curv.groups_table(p)))
                  for p in w.params]
        return cls(params, list(w.skipped), w.hvps, w)

    def summary(self):
        """One row per parameter."""
        return pd.DataFrame([{"name": p.name, "sq_norm": p.sq_norm, "svd_entropy": p.svd_entropy,
                              "effective_rank": p.effective_rank,
                              "top_k_energy": p.top_k_energy} for p in self.params])


@dataclass
class BucketAudit:
    """Audits of one direction per bucket of target tokens by frequency."""
    table: pd.DataFrame  # the unit's rows of /token_buckets
    native: Any = field(repr=False, default=None)


@dataclass
class Eigenvalues:
    status: str
    message: str
    largest: List[float]
    smallest: List[float]
    dominant: List[float]
    vectors: List[Any]     # 1-D float64 tensors, aligned with largest (then smallest, dominant)
    hvps: int
    seconds: float
    table: pd.DataFrame    # step_<N>/spectrum/eigen (block "total")
    native: Any = field(repr=False, default=None)
    options: Any = field(repr=False, default=None)  # the solver's _curv.EigenOptions

    @classmethod
    def of(cls, e, options):
        pairs = list(e.largest) + list(e.smallest) + list(e.dominant)
        return cls(e.status, e.message, [p.value for p in e.largest],
                   [p.value for p in e.smallest], [p.value for p in e.dominant],
                   [p.vector for p in pairs], e.hvps, e.seconds,
                   _frame(_curv.eigen_table(e)), e, options)


@dataclass
class Trace:
    estimate: float
    standard_error: float
    matvecs: int
    seconds: float
    table: pd.DataFrame
    native: Any = field(repr=False, default=None)


@dataclass
class Density:
    grid: np.ndarray
    density: np.ndarray
    sigma: float
    trace: float
    trace_standard_error: float
    hvps: int
    seconds: float
    native: Any = field(repr=False, default=None)


@dataclass
class RebuiltUpdate:
    """An optimizer's next step rebuilt by libcurv's rule from its live state."""
    u: dict       # name -> tensor, θ' − θ
    rule: str     # the libcurv rule, e.g. "adamw", "torch-muon"
    note: str


@dataclass
class MeasuredUpdate:
    """u = θ_after − θ_before around a real optimizer step."""
    theta_before: dict
    u: Optional[dict] = None
