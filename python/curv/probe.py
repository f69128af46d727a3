"""Probe: libcurv's analyses on a live nn.Module and a fixed set of probe batches."""
import contextlib
import json

import numpy as np
import pandas as pd

from . import _curv
from ._dtypes import vector_dtype_name as _vector_dtype_name
from ._runtime import init_runtime
from ._evaluator import Evaluator, trainable
from .attention import explain
from .objectives import causal_lm
from .results import Audit, BucketAudit, Density, Eigenvalues, Trace, Within


def _head_counts(model):
    """n_head, n_kv_head and head_dim from a Hugging Face config (or nanoGPT's), 0 if unknown."""
    config = getattr(model, "config", None)
    if config is None:
        return 0, 0, 0
    config = getattr(config, "text_config", None) or config
    n_head = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None) or 0
    n_kv = getattr(config, "num_key_value_heads", None) or n_head
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or 0
    head_dim = getattr(config, "head_dim", None) or (hidden // n_head if n_head else 0)
    return int(n_head), int(n_kv), int(head_dim)


def _structure_json(model, roles, heads):
    """The mapping ModelStructure::from_mapping takes: head counts and the user's role rules over
    libcurv's name rules (the same table the built-in architectures use)."""
    n_head, n_kv, head_dim = heads if heads is not None else _head_counts(model)
    mapping = {}
    if n_head:
        mapping.update(n_head=n_head, n_kv_head=n_kv or n_head, head_dim=head_dim)
    if roles:
        known = _curv.role_names()
        for pattern, role in dict(roles).items():
            if role not in known:
                raise ValueError(f"roles[{pattern!r}]: unknown parameter role {role!r}; roles: "
                                 f"{', '.join(known)}")
        mapping["roles"] = dict(roles)
    return json.dumps(mapping) if mapping else ""


class Probe:
    """The curvature of `objective` on `batches` at the module's current parameters.

    objective: (model, batch) -> (logits, targets), scored by cross-entropy (or `loss_fn`, a
        per-token loss (logits, targets) -> losses shaped like targets), or -> a scalar loss.
    batches: the probe batches (any structure; the examples along the first dimension).
    blocks: a BlockRule, or {name: regex} groups (unmatched parameters go to "rest").
    roles: {regex: role} over the name rules; heads: (n_head, n_kv_head, head_dim) over the
        model config's.
    The module runs in eval mode during each call (dropout off) and its mode is restored after.
    """

    def __init__(self, model, batches, objective=causal_lm, *, loss_fn=None,
                 blocks=_curv.BlockRule.LAYER, roles=None, heads=None,
                 hvp=_curv.HvpMethod.EXACT, fd_step=0.0, micro_batch=0, reuse_graph=True,
                 max_kept_graphs=0, max_memory=0, vector_dtype=None, host_copies=False,
                 eval_mode=True, description=None):
        init_runtime()
        self.model = model
        self.eval_mode = eval_mode
        named = trainable(model)
        if not named:
            raise ValueError("the model has no parameter that requires grad")
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self._evaluator = Evaluator(model, objective, batches, loss_fn)
        options = _curv.SessionOptions()
        options.hvp = hvp
        options.fd_step = fd_step
        options.micro_batch = micro_batch
        options.reuse_graph = reuse_graph
        options.max_kept_graphs = max_kept_graphs
        options.max_memory = max_memory
        options.vector_dtype = _vector_dtype_name(vector_dtype)
        options.host_copies = host_copies
        if isinstance(blocks, dict):
            options.block_groups = list(blocks.items())
            self.block_spec = "groups:" + ";".join(f"{k}={v}" for k, v in blocks.items())
        else:
            options.block_rule = blocks
            self.block_spec = blocks.name.lower()
        with self._mode():
            targets = self._evaluator.targets()
        self.has_logits = self._evaluator.has_logits
        self.description = description or f"{type(model).__name__} (Python objective)"
        self.dtype = str(self.params[0].dtype).replace("torch.", "")
        self.hvp_method = hvp
        self._session = _curv.Session(self._evaluator, self.names, self.params, targets,
                                      self.has_logits, self.description,
                                      _structure_json(model, roles, heads), options)

    @contextlib.contextmanager
    def _mode(self):
        training = self.model.training
        if self.eval_mode:
            self.model.eval()
        try:
            yield
        finally:
            self.model.train(training)

    def _call(self, method, *args):
        with self._mode():
            try:
                return getattr(self._session, method)(*args)
            except RuntimeError as e:
                better = explain(e, self.model)
                if better is not None:
                    raise better from e
                raise

    def _vector(self, u, what="u"):
        """A direction as the engine's tensors: a {name: tensor} dict or a list in name order."""
        if isinstance(u, dict):
            known = set(self.names)
            missing = [n for n in self.names if n not in u]
            extra = [n for n in u if n not in known]
            if missing or extra:
                raise ValueError(f"{what}: missing {missing[:3]}, not parameters {extra[:3]}")
            u = [u[n] for n in self.names]
        if len(u) != len(self.names):
            raise ValueError(f"{what}: {len(u)} tensors for {len(self.names)} parameters")
        out = []
        for n, p, t in zip(self.names, self.params, u):
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"{what}['{n}']: shape {tuple(t.shape)}, the parameter's is "
                                 f"{tuple(p.shape)}")
            out.append(t.detach().to(device=p.device, dtype=p.dtype))
        return out

    def _named(self, tensors):
        return dict(zip(self.names, tensors))

    # The blocks and what each parameter is for.
    @property
    def blocks(self):
        return list(self._session.block_names())

    @property
    def roles(self):
        return {n: r for n, (r, _) in zip(self.names, self._session.roles())}

    def describe(self):
        return self._session.describe()

    def loss(self):
        """L(θ) over the probe set (the examples' weighted mean over batches)."""
        return self._call("loss")

    def gradient(self):
        return self._named(self._call("gradient"))

    def hvp(self, v):
        return self._named(self._call("hvp", self._vector(v, "v")))

    def audit(self, u, *, coupling=_curv.Coupling.FULL, coupling_samples=32, realized=True,
              multipliers=(), ggn=False, ggn_blocks=False, seed=0, run="run", step=0,
              direction="u"):
        """The Taylor audit of u: g·u, uᵀHu, NDS, per-block coupling, standard errors."""
        if (ggn or ggn_blocks) and not self.has_logits:
            raise ValueError("the Gauss-Newton split needs an objective returning logits and "
                             "targets; this one returns a scalar loss")
        o = _curv.TaylorOptions()
        o.coupling, o.coupling_samples, o.realized = coupling, coupling_samples, realized
        o.step_multipliers, o.ggn, o.ggn_blocks, o.seed = list(multipliers), ggn, ggn_blocks, seed
        o.validate()
        return Audit.of(self._call("audit", self._vector(u), o), run, step, direction)

    def within(self, u, *, modes=4, param_regex="", n_head=0, row_chunks=0, max_hvps=0,
               top_k_energy=4):
        """Within-layer modes of u: singular modes' curvature and head groups per matrix."""
        o = _curv.WithinOptions()
        o.modes, o.param_regex, o.n_head, o.row_chunks = modes, param_regex, n_head, row_chunks
        o.max_hvps, o.top_k_energy = max_hvps, top_k_energy
        return Within.of(self._call("within", self._vector(u), o))

    def token_buckets(self, u, *, mode=_curv.BucketMode.HEAD_TAIL, head_mass=0.5, quantiles=4,
                      counts_path="", coupling=_curv.Coupling.NONE, realized=True, run="run",
                      step=0, direction="u"):
        """Audits of u per bucket of target tokens by frequency (head/tail or quantiles)."""
        if not self.has_logits:
            raise ValueError("token buckets need per-token losses: an objective returning logits "
                             "and targets; this one returns a scalar loss")
        b = _curv.TokenBucketOptions()
        b.mode, b.head_mass, b.quantiles, b.counts_path = mode, head_mass, quantiles, counts_path
        o = _curv.TaylorOptions()
        o.coupling, o.realized = coupling, realized
        r = self._call("token_buckets", self._vector(u), b, o)
        return BucketAudit(pd.DataFrame(_curv.token_bucket_rows(run, step, direction, r)), r)

    def eigenvalues(self, top=1, bottom=0, *, method=_curv.EigenMethod.LANCZOS, tol=1e-6,
                    max_hvps=300, seed=0, keep_vectors=True):
        o = _curv.EigenOptions()
        o.top, o.bottom, o.method, o.tol, o.max_hvps, o.seed = top, bottom, method, tol, \
            max_hvps, seed
        o.keep_vectors = keep_vectors
        return Eigenvalues.of(self._call("eigenvalues", o), o)

    def trace(self, *, method=_curv.TraceMethod.HUTCHPP, matvecs=99, seed=0):
        o = _curv.TraceOptions()
        o.method, o.matvecs, o.seed = method, matvecs, seed
        t = self._call("trace", o)
        return Trace(t.estimate, t.standard_error, t.matvecs, t.seconds,
                     pd.DataFrame(_curv.trace_table(t)), t)

    def density(self, *, runs=10, steps=80, sigma=0.0, grid=1024, seed=0):
        o = _curv.DensityOptions()
        o.runs, o.steps, o.sigma, o.grid, o.seed = runs, steps, sigma, grid, seed
        d = self._call("density", o)
        return Density(np.asarray(d.grid), np.asarray(d.density), d.sigma, d.trace,
                       d.trace_standard_error, d.hvps, d.seconds, d)

    def counters(self):
        return self._session.counters()

    def probe_identity(self):
        """(hash, examples, batches) of the probe set, as results files record it."""
        return (self._session.probe_hash(), self._session.probe_examples(),
                self._session.probe_batches())
