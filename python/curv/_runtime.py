"""The process set-up ndsprobe makes before it computes (libcurv's init_runtime), made once by the
package before its first analysis: TorchScript's plain graph executor (the optimizing one returns
wrong float32 double-backward values) and glibc malloc's thresholds (tensors up to 32 MiB served
from the heap, freed memory kept mapped: no page faults on every pass; docs/performance.md). The
thread count stays torch's."""
import torch

from . import _curv

_done = False


def init_runtime(tune_allocator=True):
    """Sets up the process as ndsprobe does; later calls do nothing. tune_allocator=False, or
    malloc tunables in GLIBC_TUNABLES, leaves glibc malloc's defaults."""
    global _done
    if not _done:
        _curv.init_runtime(torch.get_num_threads(), tune_allocator)
        _done = True
