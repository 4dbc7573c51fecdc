"""The estimators by name: :data:`ESTIMATORS`, :func:`get_estimator`, :func:`run`, :func:`estimate`.

Options (keyword arguments of :func:`run` / :func:`estimate`; each estimator reads its own):

- ``lr`` — sgd, adam: the injected update's rate, ``lr_at(s)`` (lm/schedule.py);
- ``grad_clip`` — sgd, adam: the trainer's global-norm clip (None: no clipping);
- ``optimizer`` — adam: the torch AdamW *before* step s, bound to ``model``'s parameters
  (the trainer at the fork point: ``trainer.opt`` with ``trainer.model``, ``trainer.step == s``);
- ``include_v`` — adam: keep the second-moment term of the first-order update (default True);
- ``checkpoints`` — tracin: [(state_dict, lr), ...];
- ``influence`` — ekfac, kfac: :class:`~seedlab.attribution.influence.InfluenceOptions`;
- ``micro_batch`` — rows per forward/backward for the full-batch gradient (memory only).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from seedlab.attribution import estimators as est
from seedlab.attribution.estimators import Case, Gradients, Texts
from seedlab.errors import SeedlabError
from seedlab.lm.model import GPT

INSTALL_HINT = "install seedlab[attribution] (pip install -e '.[attribution]'; pip install --no-deps kronfluence==1.0.1)"


@dataclass(frozen=True)
class Estimator:
    """A registered estimator: ``fn(grads, **options) -> [candidates × queries]``."""

    name: str
    summary: str
    horizon: str  # which Δ L_query it predicts
    unit: str  # "nats/token" (a predicted Δ L_query) or "cosine"
    fn: Callable[..., np.ndarray]
    needs: tuple[str, ...] = ()  # options that must be given
    accepts: tuple[str, ...] = ()  # options it reads (needs included)
    library: str | None = None  # optional import it needs


def _influence(strategy: str) -> Callable[..., np.ndarray]:
    def fn(grads: Gradients, *, influence: Any = None) -> np.ndarray:
        from seedlab.attribution.influence import influence as run_influence

        return run_influence(grads.model, grads.case, strategy=strategy, options=influence)

    return fn


ESTIMATORS: dict[str, Estimator] = {
    e.name: e
    for e in (
        Estimator("sgd", "one plain-SGD step: −lr·⟨∇L_q, δ_c⟩", "step s+1", "nats/token", est.sgd_one_step,
                  ("lr",), ("lr", "grad_clip")),
        Estimator("adam", "one AdamW step, first order in δ_c (preconditioner and second moment)", "step s+1",
                  "nats/token", est.adam_one_step, ("lr", "optimizer"), ("lr", "optimizer", "grad_clip", "include_v")),
        Estimator("tracin", "TracIn-CP: −Σ_k lr_k·⟨∇L_q(θ_k), ∇ℓ_c − ∇ℓ_r⟩/N", "the last checkpoint", "nats/token",
                  est.tracin, ("checkpoints",), ("checkpoints",)),
        Estimator("cosine", "−cos(∇L_q, ∇ℓ_c − ∇ℓ_r)", "none (direction only)", "cosine", est.cosine),
        Estimator("ekfac", "influence function, EK-FAC curvature (kronfluence)", "convergence", "nats/token",
                  _influence("ekfac"), (), ("influence",), "kronfluence"),
        Estimator("kfac", "influence function, K-FAC curvature (kronfluence)", "convergence", "nats/token",
                  _influence("kfac"), (), ("influence",), "kronfluence"),
    )
}
OPTIONS = {"lr", "grad_clip", "optimizer", "include_v", "checkpoints", "influence", "micro_batch"}


def get_estimator(name: str) -> Estimator:
    """The estimator called ``name``; a one-line SeedlabError if there is none or its library is missing."""
    if name not in ESTIMATORS:
        raise SeedlabError(f"estimator: must be one of {', '.join(ESTIMATORS)}, got {name!r}")
    e = ESTIMATORS[name]
    if e.library is not None:
        try:
            importlib.import_module(e.library)
        except ImportError:
            raise SeedlabError(f"estimator {name!r} needs {e.library}, which is not installed: {INSTALL_HINT}") from None
    return e


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
    _unknown(options)
    e = get_estimator(name)
    kwargs = _check(e, options)
    if grads is None:
        grads = Gradients(model, case, micro_batch=options.get("micro_batch"))
    elif grads.model is not model or grads.case is not case:
        raise SeedlabError("grads: were built for another model or case")
    with torch.enable_grad():
        return e.fn(grads, **kwargs)


def estimate(names: str | Iterable[str], model: GPT, x: torch.Tensor, y: torch.Tensor, row: int,
             candidates: Texts, queries: Texts, pad_id: int, **options: Any) -> pd.DataFrame:
    """Several estimators on one case, as one long frame with the columns

        estimator, candidate, query, estimate, unit, horizon

    one row per (estimator, candidate, query); ``estimate`` is the predicted
    Δ L_query = L_query(run with the candidate) − L_query(twin), nats/token (``cosine``:
    unitless). ``x, y`` [B, T] is the ordinary batch of step s, ``row`` the replaced row,
    ``candidates`` / ``queries`` token-id lists by name (or plain lists: named "0", "1", ...),
    ``pad_id`` the id after a short candidate (masked). Options: see the module doc. Names
    and options are all checked before any gradient is computed."""
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
        f["unit"], f["horizon"] = e.unit, e.horizon
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


__all__: Sequence[str] = ("ESTIMATORS", "Estimator", "available", "estimate", "get_estimator", "run")
