"""Results written to an HDF5 file in ndsprobe's schema (docs/hdf5-schema.md): the notebooks
and tools/python/curvplot.py read it as they read ndsprobe's."""
import os
import sys

from . import _curv


class Report:
    """A results file for the audits of one Probe. With `resume`, an existing file is kept (its
    identity, the model, dtype, probe set and blocks, must match) and `done` tells which units
    it already holds; without, an existing file is replaced at the first commit."""

    def __init__(self, path, probe, *, resume=False, tool="curv", seed=0, extra=None):
        provenance = _curv.Provenance(tool, " ".join(sys.argv), probe.dtype, seed,
                                      int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
        provenance.model = probe.describe()
        provenance.probe_hash, provenance.probe_examples, provenance.probe_batches = \
            probe.probe_identity()
        provenance.blocks = probe.block_spec
        provenance.hvp_method = probe.hvp_method
        fields = {"block_names": ",".join(probe.blocks)}
        fields.update(extra or {})
        provenance.extra = fields
        self._report = _curv.Report(os.fspath(path), provenance, resume)

    @property
    def path(self):
        return self._report.path

    def done(self, run, step, direction):
        return self._report.done(run, step, direction)

    def add(self, audit, *, grad_norm=None):
        """An Audit (its run, step and direction) and the checkpoint's loss and gradient norm."""
        self._report.add_checkpoint(audit.run, audit.step, audit.loss, grad_norm)
        self._report.add_taylor(audit.run, audit.step, audit.direction, audit.native)

    def add_eigenvalues(self, run, step, eigenvalues):
        """Eigenvalues of H at a step: its spectrum/eigen table, as ndsprobe --spectrum writes."""
        self._report.add_eigen(run, step, eigenvalues.native, eigenvalues.options)

    def add_within(self, audit, within):
        self._report.add_within(audit.run, audit.step, audit.direction, within.native)

    def add_token_buckets(self, audit, buckets):
        self._report.add_token_buckets(audit.run, audit.step, audit.direction, buckets.native)

    def set_run_attribute(self, run, key, value):
        self._report.set_run_attribute(run, key, value)

    def commit(self):
        """Rewrites the file atomically with everything added."""
        self._report.commit()

    def commit_if_due(self):
        self._report.commit_if_due()
