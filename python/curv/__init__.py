"""curv: the curvature of a loss along update directions, from Python.

The engine is libcurv's (C++): Hessian-vector products by double backward through torch's own
autograd graph of your nn.Module, Taylor audits, NDS, per-layer coupling, within-layer modes,
spectra. See docs/python.md.
"""
import torch  # noqa: F401  (loads LibTorch before the extension links against it)

from ._curv import (  # noqa: F401
    BlockRule,
    BucketMode,
    Coupling,
    CurvError,
    DensityOptions,
    EigenMethod,
    EigenOptions,
    ErrorBound,
    FormatError,
    HvpMethod,
    InvalidArgument,
    ModelError,
    NumericalError,
    OutOfMemory,
    ParamOrder,
    TokenBucketOptions,
    TraceMethod,
    TraceOptions,
    WithinOptions,
    __version__,
    runtime_summary,
)
from ._runtime import init_runtime  # noqa: F401
from .checkpoints import CheckpointResults, probe_checkpoints  # noqa: F401
from .attention import AttentionDoubleBackwardError  # noqa: F401
from .objectives import causal_lm, classifier  # noqa: F401
from .optim import measured_update, update_direction  # noqa: F401
from .probe import Probe  # noqa: F401
from .report import Report  # noqa: F401
from .results import (  # noqa: F401
    Audit,
    BucketAudit,
    Density,
    Eigenvalues,
    Trace,
    Within,
)
from .callback import CurvatureCallback, UpdateProbe  # noqa: F401
from ._export import export_model, save_checkpoint, save_safetensors  # noqa: F401
