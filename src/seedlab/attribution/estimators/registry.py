"""The estimators by name: :data:`ESTIMATORS`, :func:`get_estimator`, :func:`run`, :func:`estimate`;
user plug-ins (:func:`plugin`); and the estimators of the run's own rows (:data:`ROW_ESTIMATORS`,
:func:`get_row_estimator`, training-rows plug-ins :func:`row_plugin`; computed by rowscores.py). What each computes: :mod:`seedlab.attribution.estimators.builtin`.
The table reads without torch (the report needs its names, labels, units and summaries); each
estimator's implementation, and torch with it, is imported when it first runs.

Options (keyword arguments of :func:`run` / :func:`estimate`; each estimator reads its own):

- ``lr`` — sgd, tracin, adam, adam-linear: the injected update's rate, ``lr_at(s)`` (lm/schedule.py);
- ``grad_clip`` — sgd, adam, adam-linear: the trainer's global-norm clip (None: no clipping);
- ``optimizer`` — adam, adam-linear, adam-cosine: the torch AdamW *before* step s, bound to
  ``model``'s parameters (the trainer at the fork point: ``trainer.opt`` with ``trainer.model``,
  ``trainer.step == s``);
- ``include_v`` — adam-linear: keep the second-moment term of the first-order update (default True);
- ``checkpoints`` — tracin-cp: [(state_dict, lr), ...];
- ``trainer``, ``horizon`` — unroll (and metagrad, its reverse mode): the twin's :class:`~seedlab.lm.trainer.Trainer` at the fork point
  (``step == s``, the model's weights; it is not changed) and the horizon h (updates completed, > s);
- ``window`` — metagrad-trunc: W, the most updates from s to a horizon that still gets metagrad's value (default
  ``attribute.metagrad_window``'s, 10);
- ``influence`` — ekfac, kfac, trak: :class:`~seedlab.attribution.estimators.influence.InfluenceOptions`;
- ``seed`` — random: its generator's seed (default 0);
- ``micro_batch`` — rows per forward/backward for the full-batch gradient (memory only);
- ``step``, ``twin`` — horizon-aware plug-ins: the injection step s and the twin's weights by step
  (``bank.dir.twin(seed).weights``; with ``horizon``, ``seed``, ``lr``, ``grad_clip``, ``optimizer``).

Plug-in estimators. ``seedlab attribution attribute DIR --estimator package.module:function``
(or that name in ``attribute.estimators``, or :func:`run` / :func:`estimate`) runs a function of
yours beside the built-ins, in one of two forms told apart by its signature
(:mod:`seedlab.attribution.estimators.plugins`, whose Protocols document them)::

    function(model, case, grads) -> array [len(case.candidates), len(case.queries)]   # at θ_s
    function(ctx) -> array [len(case.candidates), len(case.queries)]                  # per horizon

- ``model`` — a copy of the GPT at θ_s, the weights before the injected update, made for the
  plug-in (eval mode is yours to set; what it changes there no other estimator sees);
- ``case`` — the :class:`~seedlab.attribution.estimators.builtin.Case`: the ordinary batch ``x, y``
  [B, T], the replaced ``row``, ``candidates`` and ``queries`` ({name: token ids}, in the output's
  row and column order), ``pad_id``; ``case.candidate_row(name)`` / ``case.ordinary_row()`` give
  (x, y, mask) [1, T] of the row with and without the candidate;
- ``grads`` — the shared gradients at θ_s (:class:`~seedlab.attribution.estimators.plugins.SharedGradients`:
  flat float64, cached for every estimator): ``grads.query(q)`` = ∇L_q, ``grads.swap(c)`` =
  ∇ℓ_c − ∇ℓ_r, ``grads.row()``, ``grads.batch()`` (the twin's full-batch gradient); changing one
  in place is a one-line error;
- ``ctx`` — the horizon-aware form's :class:`~seedlab.attribution.estimators.plugins.Context` (the one
  parameter must be named ``ctx``): ``seed``, ``step`` (s), ``horizon`` (h, updates completed),
  ``lr`` and ``grad_clip`` of step s, ``case``, ``grads``, and on request ``ctx.model`` (a copy of
  θ_s), ``ctx.adam()`` (a copy of the AdamW state before step s), ``ctx.weights(step=h)`` and
  ``ctx.model_at(step=h)`` (the twin's saved weights). It is called once per horizon of the bank
  and its result may differ by horizon; the at-θ_s form is called once and its number set beside
  every horizon. Through :func:`run` it needs the options ``step`` and ``horizon`` and reads
  ``seed``, ``lr``, ``grad_clip``, ``optimizer`` and ``twin`` (a function step -> state dict).

It returns the predicted Δ L_query = L_query(run with c) − L_query(twin) (or any score with that
sign: larger means the candidate raises the query's loss more); a numpy array or tensor of that
shape. The function may declare ``unit`` ("nats/token": a predicted Δ L_query, included in the
report's calibration; "score", the default) and ``horizons`` (those the bank must have, in the
config's terms), as attributes or with :func:`seedlab.attribution.estimators.plugins.declare`. The name is the
``package.module:function`` string itself (its rows in attribution.parquet, label ``plug-in``, its
unit). The module is imported with the current folder first on ``sys.path`` (as ``python -m``
does); one that does not import, a missing function, a signature that fits neither form, an unknown
unit or horizons not of that shape is a one-line error before anything runs (a horizon the bank
lacks: attribution/estimators/attribute.py, before any work too); a result of another shape, after it ran.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from seedlab.attribution.estimators import plugins
from seedlab.errors import SeedlabError

if TYPE_CHECKING:
    import torch

    from seedlab.attribution.estimators.builtin import Case, Gradients, Texts
    from seedlab.lm.model import GPT

INSTALL_HINT = "install seedlab[attribution] (pip install -e '.[attribution]'; pip install --no-deps kronfluence==1.0.1)"
HINTS = {"kronfluence": INSTALL_HINT, "trak": "pip install traker==0.3.2 (it keeps the installed torch)"}


@dataclass(frozen=True)
class Estimator:
    """An estimator: ``fn(grads, **options) -> [candidates × queries]`` (a plug-in's ``fn`` calls
    the user's function in its form: attribution/estimators/plugins.py)."""

    name: str
    summary: str
    horizon: str  # which Δ L_query it predicts
    unit: str  # "nats/token" (a predicted Δ L_query), "cosine" or "score" (baselines, plug-ins)
    fn: Callable[..., np.ndarray]
    needs: tuple[str, ...] = ()  # options that must be given
    accepts: tuple[str, ...] = ()  # options it reads (needs included)
    library: str | None = None  # optional import it needs
    label: str = "estimator"  # "estimator" (as its paper defines it), "variant", "reference", "baseline" or "plug-in"
    per_horizon: bool = False  # a horizon-aware plug-in: evaluated once per horizon (``horizon`` and ``step`` options)
    wants: tuple[int | str, ...] = ()  # the horizons a plug-in asks the bank for (config terms: s + n, "mid", "end")


def _lazy(name: str) -> Callable[..., np.ndarray]:
    """attribution/estimators/builtin.py's ``name``, imported at its first call: the table (names, labels,
    units, summaries) reads without torch, the implementations load it when one runs."""
    def fn(grads: Gradients, **options: Any) -> np.ndarray:
        from seedlab.attribution.estimators import builtin as estimators

        return getattr(estimators, name)(grads, **options)

    fn.__name__ = fn.__qualname__ = name
    return fn


def _influence(strategy: str) -> Callable[..., np.ndarray]:
    def fn(grads: Gradients, *, influence: Any = None) -> np.ndarray:
        from seedlab.attribution.estimators.influence import influence as run_influence

        return run_influence(grads.model, grads.case, strategy=strategy, options=influence)

    return fn


def _unroll(output: str) -> Callable[..., np.ndarray]:
    def fn(grads: Gradients, *, trainer: Any, horizon: int) -> np.ndarray:
        from seedlab.attribution.estimators.unroll import responses

        return responses(grads, trainer, [horizon], outputs=(output,))[output][horizon]

    fn.__name__ = fn.__qualname__ = output
    return fn


def _metagrad(grads: Gradients, *, trainer: Any, horizon: int) -> np.ndarray:
    from seedlab.attribution.estimators.metagrad import metagrad

    return metagrad(grads, trainer, [horizon])[horizon]


def _metagrad_trunc(grads: Gradients, *, trainer: Any, horizon: int, window: int | None = None) -> np.ndarray:
    from seedlab.attribution.bank.config import AttributeConfig
    from seedlab.attribution.estimators.metagrad import metagrad

    W = AttributeConfig.model_fields["metagrad_window"].default if window is None else window
    return metagrad(grads, trainer, [horizon], window=W)[horizon]


def _trak(grads: Gradients, *, influence: Any = None) -> np.ndarray:
    from seedlab.attribution.estimators.influence import trak

    return trak(grads.model, grads.case, options=influence)


_SGD, _ADAM = ("lr", "grad_clip"), ("lr", "optimizer", "grad_clip")
ESTIMATORS: dict[str, Estimator] = {
    e.name: e
    for e in (
        Estimator("sgd", "one plain-SGD step: −lr·⟨∇L_q, clip'(δ_c)⟩", "step s+1", "nats/token", _lazy("sgd_one_step"),
                  ("lr",), _SGD),
        Estimator("adam", "one AdamW step, exact update: ⟨∇L_q, u(g + δ_c) − u(g)⟩", "step s+1", "nats/token",
                  _lazy("adam_one_step"), ("lr", "optimizer"), _ADAM),
        Estimator("adam-linear", "one AdamW step, first order in δ_c (preconditioner and second moment)", "step s+1",
                  "nats/token", _lazy("adam_linear"), ("lr", "optimizer"), (*_ADAM, "include_v"), label="variant"),
        Estimator("tracin", "TracIn, the candidate's one visit: −lr_s·⟨∇L_q, ∇ℓ_c − ∇ℓ_r⟩/N at θ_s", "step s+1",
                  "nats/token", _lazy("tracin"), ("lr",), ("lr",)),
        Estimator("tracin-cp", "TracIn-CP over the twin's later checkpoints: −Σ_k lr_k·⟨∇L_q, ∇ℓ_c − ∇ℓ_r⟩(θ_k)/N "
                  "(adds visits that never happened)", "the last checkpoint", "nats/token", _lazy("tracin_cp"),
                  ("checkpoints",), ("checkpoints",), label="variant"),
        Estimator("cosine", "−cos(∇L_q, ∇ℓ_c − ∇ℓ_r)", "none (direction only)", "cosine", _lazy("cosine")),
        Estimator("adam-cosine", "TrackStar without projection: −cos(P∇L_q, P(∇ℓ_c − ∇ℓ_r)), P = 1/(√v̂+ε)",
                  "none (direction only)", "cosine", _lazy("adam_cosine"), ("optimizer",), ("optimizer",)),
        Estimator("ekfac", "influence function, EK-FAC curvature (kronfluence)", "convergence", "nats/token",
                  _influence("ekfac"), (), ("influence",), "kronfluence"),
        Estimator("kfac", "influence function, K-FAC curvature (kronfluence)", "convergence", "nats/token",
                  _influence("kfac"), (), ("influence",), "kronfluence"),
        Estimator("trak", "TRAK (traker, CPU projector): −(τ(q, c) − τ(q, r)), one model", "convergence", "score",
                  _trak, (), ("influence",), "trak"),
        Estimator("unroll", "the exact one-step change at s carried through the twin's steps to h (first order): "
                  "⟨∇L_q(θ_h), Δθ_h⟩", "every horizon", "nats/token", _unroll("unroll"), ("trainer", "horizon"),
                  ("trainer", "horizon"), label="reference"),
        Estimator("unroll-readout", "unroll's Δθ_h read out exactly: L_q(θ_h + Δθ_h) − L_q(θ_h) (the readout's "
                  "curvature apart from the propagation's error)", "every horizon", "nats/token", _unroll("unroll-readout"),
                  ("trainer", "horizon"), ("trainer", "horizon"), label="reference"),
        Estimator("unroll-tangent", "the w → 0 limit of unroll per unit row weight: the first step linearized too "
                  "(d/dw at w = 0, carried and read out linearly)", "every horizon", "nats/token",
                  _unroll("unroll-tangent"), ("trainer", "horizon"), ("trainer", "horizon"), label="reference"),
        Estimator("metagrad", "unroll in reverse mode: ⟨λ_{s+1}, Δz_{s+1}(c)⟩, λ the adjoint of L_q(θ_h) carried back "
                  "through the twin's replayed steps, Δz unroll's exact change at s (equal to unroll to float round-off)",
                  "every horizon", "nats/token", _metagrad, ("trainer", "horizon"), ("trainer", "horizon"),
                  label="reference"),
        Estimator("metagrad-trunc", "truncated metagrad: metagrad's value where the horizon is at most W updates after s "
                  "(attribute.metagrad_window, 10: the measured linear horizon), 0 later; on the run's own rows "
                  "(rowscores) the same for a row of step t and h − t", "every horizon up to s + W", "nats/token",
                  _metagrad_trunc, ("trainer", "horizon"), ("trainer", "horizon", "window"), label="variant"),
        Estimator("random", "a seeded random number per text: −(u(c) − u(r))", "none", "score", _lazy("random_baseline"),
                  (), ("seed",), label="baseline"),
        Estimator("loss", "the text's mean CE at θ_s: −(L(c) − L(r))", "none", "score", _lazy("loss_baseline"),
                  label="baseline"),
        Estimator("gradnorm", "the row gradient's norm at θ_s: −(‖∇ℓ_c‖ − ‖∇ℓ_r‖)", "none", "score",
                  _lazy("gradnorm_baseline"), label="baseline"),
        Estimator("length", "the text's token count: −(n(c) − n(r))", "none", "score", _lazy("length_baseline"),
                  label="baseline"),
    )
}
OPTIONS = {"lr", "grad_clip", "optimizer", "include_v", "checkpoints", "influence", "seed", "micro_batch", "trainer",
           "horizon", "step", "twin", "window"}
#: what a horizon-aware plug-in needs and reads (its Context: attribution/estimators/plugins.py)
PLUGIN_NEEDS, PLUGIN_ACCEPTS = ("step", "horizon"), ("step", "horizon", "seed", "lr", "grad_clip", "optimizer", "twin")


def get_estimator(name: str) -> Estimator:
    """The estimator called ``name`` (``package.module:function``: a plug-in, :func:`plugin`); a
    one-line SeedlabError if there is none or its library is missing."""
    if ":" in name:
        return plugin(name)
    if name not in ESTIMATORS:
        raise SeedlabError(f"estimator: must be one of {', '.join(ESTIMATORS)}, got {name!r}")
    e = ESTIMATORS[name]
    if e.library is not None:
        try:
            importlib.import_module(e.library)
        except ImportError:
            raise SeedlabError(f"estimator {name!r} needs {e.library}, which is not installed: {HINTS[e.library]}") from None
    return e


def plugin(spec: str) -> Estimator:
    """The user's estimator ``package.module:function`` (the module doc), checked before anything runs."""
    fn, attr = _load(spec)
    d = plugins.read(fn, spec, attr)
    doc = (inspect.getdoc(fn) or "").split("\n")[0]
    summary = f"plug-in: {doc}" if doc else "plug-in"
    if d.form == plugins.TRAINING_ROWS:
        raise SeedlabError(f"estimator {spec!r}: a training-rows plug-in ({attr}(rows)) scores the run's own rows, not "
                           "swaps: give it to --row-estimator of seedlab attribution score, or to seedlab attribution "
                           "rowscores")
    if d.form == plugins.HORIZON_AWARE:
        def horizon_aware(grads: Gradients, **options: Any) -> Any:
            return plugins.call_horizon_aware(fn, spec, grads, **options)

        return Estimator(spec, summary, "every horizon", d.unit, horizon_aware, PLUGIN_NEEDS, PLUGIN_ACCEPTS,
                         label="plug-in", per_horizon=True, wants=d.horizons)
    return Estimator(spec, summary, "step s (evaluated at θ_s)", d.unit,
                     lambda grads: plugins.call_at_injection(fn, spec, grads), label="plug-in", wants=d.horizons)


# --------------------------------------------------------------------------- estimators of the run's own rows


@dataclass(frozen=True)
class RowEstimator:
    """An estimator of a *training row's* removal effect (attribution/estimators/rowscores.py: the values the
    leave-one-out and the LDS are scored on): the built-ins, computed by rowscores.py, and training-rows plug-ins
    (``fn(rows) -> [rows × queries]``: attribution/estimators/plugins.py :class:`~.plugins.Rows`)."""

    name: str
    summary: str
    unit: str  # "nats/token" (a predicted Δ L_q), "cosine" or "score"
    library: str | None = None  # optional import it needs (a key of HINTS)
    label: str = "estimator"  # as Estimator.label ("plug-in" for plug-ins)
    fn: Callable[..., Any] | None = None  # a plug-in's function; None: a built-in of rowscores.py
    horizons: tuple[int | str, ...] = ()  # where a plug-in is evaluated (config terms); (): every horizon
    shares: str | None = None  # computed in that estimator's pass when both are named (rowscores.py): its cost


ROW_ESTIMATORS: dict[str, RowEstimator] = {
    e.name: e
    for e in (
        RowEstimator("tracin", "TracIn, the row's one visit: +lr_t·⟨∇L_q(θ_t), ∇ℓ_i(θ_t)⟩/N at the weights it was "
                     "trained at", "nats/token"),
        RowEstimator("grad-dot", "⟨∇L_q(θ_h), ∇ℓ_i(θ_h)⟩/N at the twin's weights of the horizon", "score"),
        RowEstimator("grad-cosine", "cos(∇L_q(θ_h), ∇ℓ_i(θ_h))", "cosine", label="baseline", shares="grad-dot"),
        RowEstimator("ekfac", "influence function, EK-FAC (kronfluence) at the end: +⟨∇L_q, (F + λ)⁻¹ ∇ℓ_i⟩/D, a group "
                     "the sum of its rows'", "nats/token", "kronfluence"),
        RowEstimator("trak", "TRAK (traker) at the end: +τ(q, z), Φ fitted on the fit rows and the rows, a group the "
                     "sum of its rows'", "score", "trak"),
        RowEstimator("metagrad-trunc", "truncated metagrad: −∂L_q(θ_h)/∂w_{t,i} where h − t ≤ W (attribute."
                     "metagrad_window, 10: the measured linear horizon), 0 for an older row; run when named",
                     "nats/token", label="variant"),
    )
}


def get_row_estimator(name: str) -> RowEstimator:
    """The row estimator called ``name`` (``package.module:function``: a training-rows plug-in, :func:`row_plugin`);
    a one-line SeedlabError if there is none or its library is missing."""
    if ":" in name:
        return row_plugin(name)
    if name not in ROW_ESTIMATORS:
        raise SeedlabError(f"row estimator: must be one of {', '.join(ROW_ESTIMATORS)} or a training-rows plug-in "
                           f"package.module:function, got {name!r}")
    e = ROW_ESTIMATORS[name]
    if e.library is not None:
        try:
            importlib.import_module(e.library)
        except ImportError:
            package = "traker" if e.library == "trak" else e.library
            raise SeedlabError(f"rowscores: {name} needs {package}, which is not installed: {HINTS[e.library]}") from None
    return e


def row_plugin(spec: str) -> RowEstimator:
    """The user's training-rows estimator ``package.module:function`` (``function(rows)``), checked before anything
    runs: one that does not import, is no function, or has another form is a one-line error."""
    fn, attr = _load(spec)
    d = plugins.read(fn, spec, attr)
    if d.form != plugins.TRAINING_ROWS:
        raise SeedlabError(f"estimator {spec!r}: scores swaps ({d.form}), not training rows: a row estimator takes "
                           f"({plugins.ROWS_ARG}); give this one to --estimator")
    doc = (inspect.getdoc(fn) or "").split("\n")[0]
    return RowEstimator(spec, f"plug-in: {doc}" if doc else "plug-in", d.unit, label="plug-in", fn=fn,
                        horizons=d.horizons)


def _load(spec: str) -> tuple[Callable[..., Any], str]:
    """A plug-in's function and its attribute path (``package.module:function``), imported with the current folder
    on ``sys.path``; a name of another shape, a module that does not import, a missing or non-callable attribute is
    a one-line error."""
    mod, _, attr = spec.partition(":")
    if not mod or not attr or not all(p.isidentifier() for p in [*mod.split("."), *attr.split(".")]):
        raise SeedlabError(f"estimator {spec!r}: a plug-in is named package.module:function")
    try:
        with _cwd_on_path():
            module = importlib.import_module(mod)
    except Exception as e:  # whatever the import raises: one line
        first = str(e).splitlines()[0] if str(e) else ""
        raise SeedlabError(f"estimator {spec!r}: cannot import {mod} ({type(e).__name__}: {first})") from None
    try:
        fn = reduce(getattr, attr.split("."), module)
    except AttributeError:
        raise SeedlabError(f"estimator {spec!r}: {mod} has no {attr}") from None
    if not callable(fn):
        raise SeedlabError(f"estimator {spec!r}: {attr} is not a function")
    return fn, attr


@contextlib.contextmanager
def _cwd_on_path() -> Iterator[None]:
    here = os.getcwd()
    sys.path.insert(0, here)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(here)


def _check(e: Estimator, options: dict[str, Any]) -> dict[str, Any]:
    missing = [k for k in e.needs if options.get(k) is None]
    if missing:
        raise SeedlabError(f"estimator {e.name!r}: needs {', '.join(f'{k}=' for k in missing)}")
    return {k: options[k] for k in e.accepts if k in options}


def _unknown(options: dict[str, Any]) -> None:
    bad = sorted(set(options) - OPTIONS)
    if bad:
        raise SeedlabError(f"options: must be among {', '.join(sorted(OPTIONS))}, got {', '.join(bad)}")


def run(name: str, model: GPT, case: Case, *, grads: Gradients | None = None, **options: Any) -> np.ndarray:
    """One estimator: [candidates × queries] (the case's order) of predicted Δ L_query.

    ``model`` holds θ_s, the weights *before* the injected update (the fork point); it is not
    changed. ``grads`` shares cached gradients between calls (built from model and case)."""
    import torch

    from seedlab.attribution.estimators.builtin import Gradients

    _unknown(options)
    e = get_estimator(name)
    kwargs = _check(e, options)
    if grads is None:
        grads = Gradients(model, case, micro_batch=options.get("micro_batch"))
    elif grads.model is not model or grads.case is not case:
        raise SeedlabError("grads: were built for another model or case")
    with torch.enable_grad():
        out = e.fn(grads, **kwargs)
    if isinstance(out, torch.Tensor):
        out = out.detach().cpu()
    out = np.asarray(out, dtype=np.float64)
    want = (len(case.candidates), len(case.queries))
    if out.shape != want:
        raise SeedlabError(f"estimator {e.name!r}: returned shape {out.shape}, not (candidates, queries) = {want}")
    return out


def estimate(names: str | Iterable[str], model: GPT, x: torch.Tensor, y: torch.Tensor, row: int,
             candidates: Texts, queries: Texts, pad_id: int, **options: Any) -> pd.DataFrame:
    """Several estimators on one case, as one long frame with the columns

        estimator, candidate, query, estimate, unit, horizon, label

    one row per (estimator, candidate, query); ``estimate`` is the predicted
    Δ L_query = L_query(run with the candidate) − L_query(twin), nats/token (``cosine``:
    unitless; baselines and plug-ins: a score), ``label`` the estimator's (estimator, variant,
    baseline or plug-in: :class:`Estimator`).
    ``x, y`` [B, T] is the ordinary batch of step s, ``row`` the replaced row,
    ``candidates`` / ``queries`` token-id lists by name (or plain lists: named "0", "1", ...),
    ``pad_id`` the id after a short candidate (masked). Options: see the module doc. Names
    and options are all checked before any gradient is computed."""
    from seedlab.attribution.estimators.builtin import Case, Gradients

    names = [names] if isinstance(names, str) else list(names)
    _unknown(options)
    chosen = [get_estimator(n) for n in names]
    for e in chosen:
        _check(e, options)
    case = Case.of(x, y, row, candidates, queries, pad_id)
    grads = Gradients(model, case, micro_batch=options.get("micro_batch"))
    frames = []
    for e in chosen:
        values = run(e.name, model, case, grads=grads, **options)
        idx = pd.MultiIndex.from_product([list(case.candidates), list(case.queries)], names=["candidate", "query"])
        f = pd.DataFrame({"estimate": values.reshape(-1)}, index=idx).reset_index()
        f.insert(0, "estimator", e.name)
        f["unit"], f["horizon"], f["label"] = e.unit, e.horizon, e.label
        frames.append(f)
    return pd.concat(frames, ignore_index=True)


def available() -> list[str]:
    """The registered estimators whose library is importable."""
    out = []
    for name in ESTIMATORS:
        try:
            get_estimator(name)
        except SeedlabError:
            continue
        out.append(name)
    return out


__all__: Sequence[str] = ("ESTIMATORS", "Estimator", "ROW_ESTIMATORS", "RowEstimator", "available", "estimate",
                          "get_estimator", "get_row_estimator", "plugin", "row_plugin", "run")
