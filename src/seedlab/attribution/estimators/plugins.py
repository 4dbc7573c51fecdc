"""Plug-in estimators: the two forms a user's function may take, what it is handed, and its declarations.

A plug-in (``--estimator package.module:function``, attribution/estimators/registry.py :func:`plugin`) predicts

    Δ L_q(h) = L_q(run with candidate c, after h updates) − L_q(twin, after h updates)

for every candidate c and query q of one seed's case: an array [len(case.candidates), len(case.queries)]
(numpy or torch) in nats/token or as a score with that sign. Its form is read from its signature:

- **at θ_s** (:class:`PluginAtInjection`): ``function(model, case, grads)`` — evaluated once, at the
  weights before the injected update, and the same number is set beside every horizon (the form
  plug-ins have always had; any function whose signature binds three positional arguments);
- **horizon-aware** (:class:`HorizonAwarePlugin`): ``function(ctx)`` — one parameter, named ``ctx`` —
  evaluated once per horizon h of the bank with a :class:`Context`: what the built-in estimators get
  (seed; the injection step s; h; the rate and the gradient clip of step s; the AdamW state before
  step s; the twin's weights after any saved step; θ_s; the case; the shared gradients). Its result
  may differ by horizon.

A third form scores the run's own rows instead of swaps (``--row-estimator`` of ``seedlab attribution score``,
``--estimator`` of ``seedlab attribution rowscores``; registry.py :func:`~seedlab.attribution.estimators.registry.row_plugin`):

- **training rows** (:class:`RowPlugin`): ``function(rows)`` — one parameter, named ``rows`` — evaluated once per
  seed and horizon h with a :class:`Rows`: the rows the bank's leave-one-out and group arms removed that were trained
  before h (their token ids, step and position), the queries, each step's rate, and the twin's weights at any step
  the bank or export holds them. It returns [len(rows), len(queries)]: the predicted Δ L_q(θ_h) of *removing* each
  row (positive: the query's loss rises), what attribution/analyses/loo.py and lds.py score.

Both forms may declare, as attributes of the function (:func:`declare` sets them):

- ``unit`` — ``"nats/token"`` (a predicted Δ L_q: the report's calibration, the slope of measured on
  estimate and the median ratio, includes it) or ``"score"`` (only its ranking means something; the
  default);
- ``horizons`` — the horizons it is written for, in the config's terms (updates after s, ≥ 1, or
  ``"mid"``, ``"end"``): a bank that lacks one of them is refused before any work. It is evaluated at
  every horizon of the bank either way.

What a plug-in can change is its own: ``model`` / ``ctx.model`` is a copy of θ_s made for it (the
weights the later estimators use are another tensor), ``ctx.adam()`` a copy of the optimizer state,
``ctx.weights()`` a fresh read of the twin's file. The gradients ``grads`` hands out are the cache
every estimator of the seed shares (copying them would cost a vector per call): a plug-in that
changes one in place (or θ_s) is stopped with a one-line error naming it, before any later estimator
reads it. An unknown form, unit or horizon is a one-line error before anything runs (registry.py).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from seedlab.errors import SeedlabError

if TYPE_CHECKING:
    import torch

    from seedlab.attribution.bank.config import AttributionConfig
    from seedlab.attribution.estimators.builtin import Case, Gradients
    from seedlab.lm.model import GPT

UNITS = ("nats/token", "score")
AT_INJECTION, HORIZON_AWARE, TRAINING_ROWS = "at θ_s", "horizon-aware", "training rows"
CONTEXT_ARG, ROWS_ARG = "ctx", "rows"
Unit = Literal["nats/token", "score"]
Result = Any  # np.ndarray | torch.Tensor, [len(case.candidates), len(case.queries)]
F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- what a plug-in is handed


class SharedGradients:
    """The seed's cached gradients at θ_s (:class:`~seedlab.attribution.estimators.builtin.Gradients`) as a
    plug-in sees them: flat float64 over ``model.parameters()``, each computed once for all estimators.

    ``query(q)`` = ∇L_q (mean CE of query q), ``swap(c)`` = ∇ℓ_c − ∇ℓ_r (CE sums of the candidate's
    row and of the ordinary row), ``row()`` = ∇ℓ_r, ``batch()`` = the twin's full-batch gradient
    (Σ rows' CE)/N; ``case``, ``device``, ``micro_batch`` as there; ``model`` the plug-in's copy of
    θ_s. The tensors are shared: change a copy (``.clone()``), never one of them in place."""

    def __init__(self, grads: Gradients, model: Callable[[], GPT]):
        self._grads, self._model = grads, model
        self._handed: dict[int, tuple[torch.Tensor, int, str]] = {}  # id -> (tensor, its version then, what)

    @property
    def model(self) -> GPT:
        return self._model()

    @property
    def case(self) -> Case:
        return self._grads.case

    @property
    def device(self) -> torch.device:
        return self._grads.device

    @property
    def micro_batch(self) -> int | None:
        return self._grads.micro_batch

    def _hand(self, t: torch.Tensor, what: str) -> torch.Tensor:
        self._handed.setdefault(id(t), (t, t._version, what))
        return t

    def query(self, name: str) -> torch.Tensor:
        """∇L_q, the query's mean CE (nats/token)."""
        return self._hand(self._grads.query(name), f"query({name!r})")

    def swap(self, name: str) -> torch.Tensor:
        """∇ℓ_c − ∇ℓ_r (= N·δ_c)."""
        return self._hand(self._grads.swap(name), f"swap({name!r})")

    def row(self) -> torch.Tensor:
        """∇ℓ_r, the ordinary row's CE sum."""
        return self._hand(self._grads.row(), "row()")

    def batch(self) -> torch.Tensor:
        """The twin's full-batch gradient g = (Σ_rows ∇ℓ) / N, before clipping."""
        return self._hand(self._grads.batch(), "batch()")

    def changed(self) -> str | None:
        """The first handed-out gradient changed in place since it was handed out (None: none)."""
        return next((what for t, version, what in self._handed.values() if t._version != version), None)


@dataclass(frozen=True)
class AdamState:
    """A copy of the trainer's AdamW state *before* step s, by parameter name (``model.named_parameters()``).

    The injected update is step ``steps[name] + 1`` of AdamW: with the clipped gradient c,
    m ← β₁m + (1−β₁)c, v ← β₂v + (1−β₂)c², θ ← θ(1 − lr·wd) − lr·m̂/(√v̂ + ε), m̂ = m/(1−β₁ᵗ),
    v̂ = v/(1−β₂ᵗ), t = steps + 1 (:class:`~seedlab.lm.gradients.AdamStep`)."""

    m: dict[str, torch.Tensor]  # first moments (exp_avg), the parameters' shapes; zeros before the first update
    v: dict[str, torch.Tensor]  # second moments (exp_avg_sq)
    steps: dict[str, int]  # updates already made (s at the fork point)
    betas: tuple[float, float]  # (β₁, β₂), the same in every param group
    eps: float  # ε, the same in every param group
    weight_decay: dict[str, float]  # decoupled decay per parameter (0 for biases and norms in the trainer)

    @classmethod
    def of(cls, optimizer: Any, model: GPT) -> AdamState:
        """The copy of ``optimizer``'s state (a torch AdamW over exactly ``model``'s parameters)."""
        import torch

        if not isinstance(optimizer, torch.optim.AdamW):
            raise SeedlabError(f"ctx.adam(): the run's optimizer is {type(optimizer).__name__}, not AdamW: "
                               "there is no AdamW state")
        named = list(model.named_parameters())
        group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        if {id(p) for _, p in named} != set(group_of):
            raise SeedlabError("ctx.adam(): the optimizer's parameters are not the model's")
        hyper = {(tuple(map(float, g["betas"])), float(g["eps"])) for g in optimizer.param_groups}
        if len(hyper) != 1:
            raise SeedlabError(f"ctx.adam(): the param groups' betas and eps differ ({sorted(hyper)})")
        (betas, eps), = hyper
        m, v, steps = {}, {}, {}
        for name, p in named:
            st = optimizer.state.get(p, {})
            m[name] = st["exp_avg"].detach().clone() if st else torch.zeros_like(p.detach())
            v[name] = st["exp_avg_sq"].detach().clone() if st else torch.zeros_like(p.detach())
            steps[name] = int(st["step"]) if st else 0
        wd = {name: float(group_of[id(p)]["weight_decay"]) for name, p in named}
        return cls(m, v, steps, betas, eps, wd)

    def flat(self, which: Literal["m", "v"], device: Any = None) -> torch.Tensor:
        """``m`` or ``v`` flattened over the parameters in their order (float64): aligned with the gradients."""
        import torch

        if which not in ("m", "v"):
            raise SeedlabError(f"AdamState.flat: which must be 'm' or 'v', got {which!r}")
        return torch.cat([t.reshape(-1).double() for t in getattr(self, which).values()]).to(device)


@dataclass(frozen=True)
class Context:
    """What a horizon-aware plug-in gets for one (seed, horizon): the built-ins' inputs.

    ``horizon`` h counts updates completed (the twin's step; h − s = :attr:`after` ≥ 0); ``lr`` is the
    rate of the injected update, ``lr_at(s)`` (lm/schedule.py), ``grad_clip`` the trainer's global-norm
    clip (None: none). The lazy parts cost nothing until asked for: :attr:`model` (a copy of θ_s made
    once per context), :meth:`adam` (a copy of the AdamW state before step s), :meth:`weights` and
    :meth:`model_at` (the twin's saved weights, read from its file on each call)."""

    seed: int | None  # the training seed
    step: int  # s: updates before the injected one
    horizon: int  # h: updates completed when the effect is measured
    lr: float | None  # lr_at(s)
    grad_clip: float | None  # the trainer's clip (None: none)
    case: Case  # the ordinary batch of step s, the replaced row, the candidates and queries (output order)
    grads: SharedGradients  # the shared gradients at θ_s
    _theta_s: GPT = field(repr=False)  # the estimators' θ_s itself: read through model (a copy)
    _optimizer: Any = field(default=None, repr=False)  # the AdamW before step s, bound to _theta_s: read through adam()
    _twin: Callable[[int], Mapping[str, torch.Tensor]] | None = field(default=None, repr=False)  # step -> weights
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def after(self) -> int:
        """h − s, updates after the injection (1 = the injected update itself)."""
        return self.horizon - self.step

    @property
    def model(self) -> GPT:
        """The plug-in's copy of θ_s (made at the first access, then the same object)."""
        if "model" not in self._memo:
            self._memo["model"] = copy.deepcopy(self._theta_s)
        return self._memo["model"]

    def adam(self) -> AdamState:
        """A copy of the AdamW state before step s (made at the first call, then the same object)."""
        if "adam" not in self._memo:
            if self._optimizer is None:
                raise SeedlabError("ctx.adam(): no optimizer was given (registry.run: optimizer=...)")
            self._memo["adam"] = AdamState.of(self._optimizer, self._theta_s)
        return self._memo["adam"]

    def weights(self, step: int | None = None) -> dict[str, torch.Tensor]:
        """The twin's weights after ``step`` updates (default: this horizon), a state dict read from
        its file with every tensor's hash checked; any step the twin saved (s, every horizon, the
        TracIn checkpoints)."""
        if self._twin is None:
            raise SeedlabError("ctx.weights(): no twin was given (registry.run: twin=...)")
        return dict(self._twin(self.horizon if step is None else step))

    def model_at(self, step: int | None = None) -> GPT:
        """A new copy of the model holding :meth:`weights` of ``step`` (default: this horizon), in eval mode."""
        m = copy.deepcopy(self._theta_s)
        m.load_state_dict(self.weights(step))
        return m.eval()


@dataclass(frozen=True)
class Rows:
    """What a training-rows plug-in gets for one (seed, horizon): the run's own rows trained before h.

    ``steps[j]``, ``positions[j]``: row j is row ``positions[j]`` of the batch of step ``steps[j]`` (the rows
    attribution/bank/removals.py ``rows_of`` names, those with t < h, sorted by (t, i)); ``x[j]``, ``y[j]`` [T] its
    tokens and next tokens (every target counts: a training row has no padding). The twin trained each on the update
    of its step at rate :meth:`lr` (t), its loss the row's CE *sum* over its T targets divided by ``n_targets``
    N = B·T (lm/trainer.py). ``queries``: {name: token ids} in the output's column order (L_q: a query's mean CE,
    nats/token; ``pad_id`` pads a shorter one). :meth:`weights` (step) reads the twin's weights after that many
    updates, every tensor's hash checked, at any step of ``checkpoints`` (the twin's saved steps, and in an export
    the removed rows' own steps where it carries them); another step is a one-line error."""

    seed: int
    step: int  # s, the injection step
    horizon: int  # h: updates completed when the effect is read
    end: int  # the run's last step
    steps: tuple[int, ...]  # each row's step t (< h)
    positions: tuple[int, ...]  # each row's index in the batch of its step
    x: torch.Tensor  # [R, T] int64
    y: torch.Tensor  # [R, T] int64
    queries: dict[str, tuple[int, ...]]
    pad_id: int
    batch_size: int  # B
    n_targets: int  # N = B·T
    checkpoints: tuple[int, ...]  # the steps :meth:`weights` can read, sorted
    _lr: Callable[[int], float] = field(repr=False)
    _twin: Callable[[int], Mapping[str, torch.Tensor]] = field(repr=False)
    _model: Callable[[], GPT] = field(repr=False)
    where: str = ""  # the bank or export (for messages)

    @property
    def names(self) -> list[tuple[int, int]]:
        """(t, i) of every row, in order."""
        return list(zip(self.steps, self.positions))

    def lr(self, step: int) -> float:
        """The rate of the update that consumed the batch of ``step`` (lm/schedule.py ``lr_of``)."""
        return float(self._lr(int(step)))

    def require(self, steps: Sequence[int], who: str) -> None:
        """A one-line error naming ``who`` and the first of ``steps`` without the twin's weights (module doc)."""
        missing = sorted(set(int(t) for t in steps) - set(self.checkpoints))
        if missing:
            raise SeedlabError(f"{who}: needs the twin's weights at step {missing[0]}, which {self.where or 'this bank'} "
                               f"does not hold (it has {', '.join(map(str, self.checkpoints)) or 'none'}; "
                               f"{len(missing)} step(s) missing: export the bank with --checkpoints rows)")

    def weights(self, step: int | None = None) -> dict[str, torch.Tensor]:
        """The twin's weights after ``step`` updates (default: the horizon), hash-checked."""
        step = self.horizon if step is None else int(step)
        self.require([step], "rows.weights()")
        return dict(self._twin(step))

    def model_at(self, step: int | None = None) -> GPT:
        """A new GPT holding :meth:`weights` of ``step`` (default: the horizon), in eval mode."""
        w = self.weights(step)
        dtype = next(v.dtype for v in w.values() if v.is_floating_point())
        m = self._model().to(dtype)
        m.load_state_dict(w)
        return m.eval()


class RowPlugin(Protocol):
    """``function(rows)``: evaluated once per seed and horizon with that horizon's :class:`Rows`; returns
    [len(rows.steps), len(rows.queries)], the predicted Δ L_q(θ_h) of removing each row (positive: the loss
    rises). Optional attributes ``unit`` and ``horizons`` (:func:`declare`; horizons: the ones it is evaluated at,
    default every horizon of the bank)."""

    def __call__(self, rows: Rows, /) -> Result: ...


class PluginAtInjection(Protocol):
    """``function(model, case, grads)``: evaluated once at θ_s; the same number stands at every horizon.
    ``model`` is a copy of θ_s (eval mode is yours to set), ``grads`` the :class:`SharedGradients`."""

    def __call__(self, model: GPT, case: Case, grads: SharedGradients, /) -> Result: ...


class HorizonAwarePlugin(Protocol):
    """``function(ctx)``: evaluated once per horizon of the bank with that horizon's :class:`Context`;
    the prediction of Δ L_q after ``ctx.horizon`` updates. Optional attributes ``unit`` and
    ``horizons``: :func:`declare`."""

    def __call__(self, ctx: Context, /) -> Result: ...


def declare(*, unit: Unit | None = None, horizons: Sequence[int | str] | None = None) -> Callable[[F], F]:
    """Decorator: set the plug-in's ``unit`` ("nats/token" or "score") and ``horizons`` (updates after
    s ≥ 1, "mid", "end": those the bank must have) as attributes of the function. Checked when the
    plug-in is loaded (a one-line error), not here: a module that imports is always one that loads."""

    def mark(fn: F) -> F:
        if unit is not None:
            fn.unit = unit  # type: ignore[attr-defined]
        if horizons is not None:
            fn.horizons = horizons  # type: ignore[attr-defined]
        return fn

    return mark


# --------------------------------------------------------------------------- reading a plug-in


@dataclass(frozen=True)
class Declared:
    """A plug-in as read from its signature and attributes."""

    form: str  # AT_INJECTION or HORIZON_AWARE
    unit: str  # one of UNITS
    horizons: tuple[int | str, ...]  # the horizons it asks the bank for (config terms); () none


def read(fn: Callable[..., Any], spec: str, attr: str) -> Declared:
    """``fn``'s form, unit and horizons; a one-line SeedlabError naming ``spec`` for anything else."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None  # a builtin without a signature: taken as a function of (model, case, grads)
    form = AT_INJECTION if sig is None else _form(sig)
    if form is None:
        raise SeedlabError(f"estimator {spec!r}: horizon-aware plug-ins take ({CONTEXT_ARG}), training-rows plug-ins "
                           f"({ROWS_ARG}), the others must take (model, case, grads), its signature is {attr}{sig}")
    unit = getattr(fn, "unit", "score")
    if unit not in UNITS:
        raise SeedlabError(f"estimator {spec!r}: unit must be {' or '.join(UNITS)}, got {unit!r}")
    wants = getattr(fn, "horizons", None)
    if wants is None:
        wants = ()
    if isinstance(wants, (str, bytes)) or not isinstance(wants, Sequence) or not all(map(_is_horizon, wants)):
        raise SeedlabError(f"estimator {spec!r}: horizons must be a list of updates after s (≥ 1), 'mid' or 'end', "
                           f"got {wants!r}")
    return Declared(form, unit, tuple(wants))


def _form(sig: inspect.Signature) -> str | None:
    params = list(sig.parameters.values())
    named = {CONTEXT_ARG: HORIZON_AWARE, ROWS_ARG: TRAINING_ROWS}
    if params and params[0].name in named and params[0].kind in (params[0].POSITIONAL_ONLY,
                                                                 params[0].POSITIONAL_OR_KEYWORD):
        try:
            sig.bind(None)
            return named[params[0].name]
        except TypeError:
            pass
    try:
        sig.bind("model", "case", "grads")
        return AT_INJECTION
    except TypeError:
        return None


def _is_horizon(h: object) -> bool:
    return h in ("mid", "end") or (isinstance(h, int) and not isinstance(h, bool) and h >= 1)


def check_horizons(spec: str, horizons: Sequence[int | str], cfg: AttributionConfig) -> None:
    """A one-line SeedlabError if the bank ``cfg`` lacks one of the horizons the plug-in asks for."""
    have = cfg.horizon_steps()
    for h in horizons:
        step = cfg.end if h == "end" else cfg.mid if h == "mid" else cfg.injection_step + int(h)
        if step not in have:
            name = h if isinstance(h, str) else f"s+{h}"
            raise SeedlabError(f"estimator {spec!r}: asks for horizon {name} (step {step}), which this bank lacks "
                               f"(its horizons: {', '.join(f'{lab} (step {t})' for t, lab in have.items())})")


# --------------------------------------------------------------------------- calling one


def _guarded(spec: str, grads: Gradients, shared: SharedGradients, call: Callable[[], Result]) -> Result:
    """``call()``, then a one-line error if it changed θ_s or a shared gradient in place."""
    params = list(grads.model.parameters())
    before = [p._version for p in params]
    out = call()
    what = shared.changed()
    if what is not None:
        raise SeedlabError(f"estimator {spec!r}: changed grads.{what} in place; it is shared with the other "
                           "estimators (change a copy: .clone())")
    if any(p._version != v for p, v in zip(params, before)):
        raise SeedlabError(f"estimator {spec!r}: changed the weights at θ_s, which the other estimators use "
                           "(change the copy it is handed)")
    return out


def call_at_injection(fn: PluginAtInjection, spec: str, grads: Gradients) -> Result:
    """``fn(model, case, grads)`` with a copy of θ_s and the :class:`SharedGradients`."""
    model = copy.deepcopy(grads.model)
    shared = SharedGradients(grads, lambda: model)
    return _guarded(spec, grads, shared, lambda: fn(model, grads.case, shared))


def call_horizon_aware(fn: HorizonAwarePlugin, spec: str, grads: Gradients, *, step: int, horizon: int,
                       seed: int | None = None, lr: float | None = None, grad_clip: float | None = None,
                       optimizer: Any = None, twin: Callable[[int], Mapping[str, Any]] | None = None) -> Result:
    """``fn(ctx)`` with the :class:`Context` of ``horizon`` (the registry's options: module doc)."""
    if horizon < step:
        raise SeedlabError(f"estimator {spec!r}: horizon {horizon} is before the injection step {step}")
    memo: dict[str, Any] = {}
    shared = SharedGradients(grads, lambda: ctx.model)
    ctx = Context(seed, step, horizon, lr, grad_clip, grads.case, shared, grads.model, optimizer, twin, memo)
    return _guarded(spec, grads, shared, lambda: fn(ctx))


__all__: Sequence[str] = ("AdamState", "Context", "HorizonAwarePlugin", "PluginAtInjection", "RowPlugin", "Rows",
                          "SharedGradients", "UNITS", "declare")
