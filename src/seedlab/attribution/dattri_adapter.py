"""A bank (or an exported benchmark) as dattri ``AttributionTask`` s: the single-row swaps, and the run's own rows.

dattri (TRAIS-Lab, ``pip install 'seedlab[dattri]'``; 0.3.0 checked) scores train samples against test samples
through one object, ``dattri.task.AttributionTask(loss_func, model, checkpoints, target_func,
checkpoints_load_func)``, with ``loss_func(params, data)`` / ``target_func(params, data)`` in ``torch.func`` style
(``params`` a ``{name: tensor}`` mapping) and ``attributor.attribute(train_loader, test_loader)`` returning a tensor
[n_train, n_test] (positive: training on the sample lowers the test target).

**The model and its loss** (what every attributor below shares). The model is the bank's GPT as :class:`DattriGPT`
(the same parameters and state dict; ``forward(x)`` returns the logits, ``forward(x, y, m)`` an output with ``.loss``,
as the hook-based attributors read it), in eval mode, its attention on PyTorch's math kernel (the fused CPU kernel
has no second derivative and no forward-mode one: the influence functions differentiate twice). A sample is
``(x, y, m)`` [T]: tokens, next tokens and a weight per target. :func:`row_loss` is Σ_t m_t·CE_t (a training row,
m = 1: its CE *sum*, as the trainer sums it before dividing by N = B·T), and :func:`query_target` a text's mean CE,
Σ_t m_t·CE_t / Σ_t m_t (L_query, nats/token). Both accept every batching dattri 0.3.0 uses: one sample [T] (TracIn,
TRAK and DVEmb vmap over the batch), a sample with its batch axis [1, T] (the influence functions vmap over dim 1),
a whole batch [b, T] (the explicit, CG and Arnoldi solvers and EK-FAC's fit pass the full training set; the loss
is then the sum over rows and the target the mean, EK-FAC's "mean loss by the batch size"), tokens as floats
(LiSSA's collate casts every tensor but the first to float), and the hook-based form ``loss(model, batch,
device)`` with a dict batch (LoGra, FactGraSS, block-projected IF). Query rows carry m = mask / n_targets, so that
``loss`` and ``target`` agree on them (DVEmb takes test gradients of the loss).

**Swaps** (:func:`task`, :func:`case_task`): for one seed, the bank's candidates as training samples — row
``injection_row`` of the batch of s with the candidate injected (lm/batches.py ``inject``) — and last the replaced
row itself; the queries (the candidates' own texts first when ``queries.own``) as test samples; checkpoints θ_s
(``steps="injection"``), every saved step before the last horizon (``steps="checkpoints"``: TracIn-CP's), or a
list. A swap's predicted ΔL_q is −(score(c) − score(r)) (:meth:`BankTask.estimate`). With weights lr_t / N and no
projection dattri's ``TracInAttributor`` on θ_s is the bank's ``tracin`` and over the checkpoints its ``tracin-cp``
(tests/attribution/test_export.py). Plug-ins: :func:`tracin`, :func:`grad_dot`.

**The run's own rows** (:func:`rows_task`, :func:`rows_scores`, and the training-rows plug-ins in :data:`rows`):
the rows the bank's leave-one-out and group arms removed (an export carries them: attribution/benchmark.py) are the
training samples *and* the full training set dattri fits curvature, kernels and embeddings on (the field's
training set for the group question); the queries are the test samples; the checkpoint is the twin at the horizon
(θ_h: the weights the effect is read at, as the field attributes a final model), or for TracIn each row's own step.
A score becomes the predicted Δ L_q(θ_h) of *removing* the row as +score (positive: training on the row lowered the
query's loss, so removing it raises it), what attribution/analyses/loo.py and lds.py score (a group: the sum of its
rows'). ``--row-estimator seedlab.attribution.dattri_adapter:rows.<name>`` (or ``seedlab attribution rowscores
BANK --estimator ...``) runs one; each is evaluated at the end of the run.

Every attributor dattri 0.3.0 ships (``dattri.algorithm.__all__``), and what it is here (:data:`ATTRIBUTORS`):

=====================  =======================  ================================================================
plug-in (``rows.``)    dattri class             on the run's own rows
=====================  =======================  ================================================================
tracin                 TracInAttributor         the row's one visit: +lr_t·⟨∇ℓ_i(θ_t), ∇L_q(θ_t)⟩/N at the weights it
                                                was trained at (nats/token; rowscores.py's ``tracin``); needs the
                                                twin's weights at every row's step (``export --checkpoints rows``)
grad_dot, grad_cos     TracInAttributor         at θ_h, weight 1/N (rowscores.py's ``grad-dot``) / normalized
                                                gradients (``grad-cosine``)
if_explicit            IFAttributorExplicit     the exact damped Hessian inverse, over ``ln_f.bias`` only (the
                                                attributor materializes the p × p Hessian: ~10¹⁰ entries for the
                                                whole mini GPT)
if_cg, if_lissa,       IFAttributorCG, LiSSA,   the Hessian of the rows' summed loss at θ_h, damped, by conjugate
if_arnoldi             Arnoldi                  gradients, LiSSA's recursion and Arnoldi's top eigenspace
if_datainf             IFAttributorDataInf      DataInf's layer-wise closed form of the empirical Fisher
trak                   TRAKAttributor           one model, the rows as Φ's training set (projected), Q = 1 − p, p
                                                the row's geometric-mean token probability exp(−mean CE)
logra, factgrass,      LoGraAttributor,         gradient compression through hooks on every Linear module, the
block_projected_if     FactGraSSAttributor,     empirical Fisher inverted on the compressed gradients
                       BlockProjectedIF...
dvemb                  DVEmbAttributor          data value embeddings: the twin's trajectory from each row's step to
                                                h replayed from the exported rows and checkpoints (SGD's
                                                recursion: it does not model AdamW's preconditioner)
if_ekfac               IFAttributorEKFAC        refused: dattri 0.3.0's EK-FAC fits activations of shape [batch,
                                                features] only (func/fisher.py sets ``a_prev`` for 2-D module
                                                inputs alone), and a transformer's Linear inputs are [batch, tokens,
                                                features]; kronfluence's EK-FAC is rowscores.py's ``ekfac``
rps                    RPSAttributor            refused: RPS decomposes an L2-fine-tuned classifier's last layer
                                                with one feature vector and one label per sample (dattri reads
                                                ``for x, _ in loader``, a single test label per sample); a row of a
                                                language model is T next-token predictions
knn_shapley            KNNShapleyAttributor     refused: KNN-Shapley values a k-nearest-neighbour classifier on
                                                fixed embeddings with one label per sample and takes no model
                                                (dattri 0.3.0 raises for a task); it says nothing about this run
=====================  =======================  ================================================================

The settings (:data:`SETTINGS`) are sized for the tiny test exports (seconds on a CPU), not tuned: a user scores
other settings with a plug-in of their own, ``def mine(rows): return rows_scores(rows, lambda task:
IFAttributorCG(task, max_iter=50, regularization=1e-3))``. A refused attributor raises :class:`Unsupported` (a
one-line error naming the limitation); so does one asked for on a bank or export without the checkpoints it needs
(before dattri runs), and dattri not being installed.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from seedlab.attribution.estimators.plugins import declare
from seedlab.errors import SeedlabError
from seedlab.lm.model import GPT

if TYPE_CHECKING:
    from seedlab.attribution.estimators.builtin import Case
    from seedlab.attribution.estimators.plugins import Context, Rows, SharedGradients

HINT = "pip install 'seedlab[dattri]' (dattri keeps the pinned torch; see pyproject.toml)"


class Unsupported(SeedlabError):
    """A dattri attributor that cannot score this data: the limitation, in one line."""


def _dattri():
    try:
        from dattri.task import AttributionTask
    except ImportError as e:
        raise SeedlabError(f"dattri is not installed ({HINT}): {e}") from None
    return AttributionTask


# --------------------------------------------------------------------------- the model and its loss


@contextlib.contextmanager
def _math_attention():
    """PyTorch's math attention kernel: twice differentiable, and forward-mode differentiable."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        yield


class DattriGPT(GPT):
    """The bank's GPT as dattri calls it (module doc): ``forward(x)`` -> logits [b, T, V]; ``forward(x, y, m)`` ->
    an output whose ``.loss`` is :func:`row_loss`'s (the hook-based attributors read ``model(**batch).loss``)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, m: torch.Tensor | None = None):  # type: ignore[override]
        with _math_attention():
            logits, _ = super().forward(x.long())
        if y is None:
            return logits
        return SimpleNamespace(loss=_weighted_ce(logits, y, m).sum(), logits=logits)


def as_dattri(model: torch.nn.Module) -> DattriGPT:
    """A :class:`DattriGPT` copy of a GPT (its config, dtype, device and weights), in eval mode."""
    p = next(model.parameters())
    m = DattriGPT(model.config).to(device=p.device, dtype=p.dtype)
    m.load_state_dict(model.state_dict())
    return m.eval()


def _unpack(data: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, m) of a sample or batch: a tuple/list, or a dict with those keys (a mask ``mask`` read as m)."""
    if isinstance(data, Mapping):
        return data["x"], data["y"], data["m"] if "m" in data else data["mask"]
    x, y, m = data
    return x, y, m


def _as_batch(x, y, m) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every dattri batching as [b, T] int64 tokens and float weights (module doc)."""
    if x.dim() == 1:
        x, y, m = x.unsqueeze(0), y.unsqueeze(0), m.unsqueeze(0)
    return x.long(), y.long(), m


def _weighted_ce(logits: torch.Tensor, y: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
    """[b]: Σ_t m_t·CE_t of each row (m None: every target)."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), y.long().flatten(), reduction="none").view(y.shape)
    return ce.sum(-1) if m is None else (ce * m.to(ce.dtype)).sum(-1)


def row_loss(model: torch.nn.Module) -> Callable:
    """dattri's ``loss_func`` (module doc): ``(params, data)`` -> Σ over the rows of Σ_t m_t·CE_t; also
    ``(model, batch, device)``, the hook-based attributors' form."""
    model = model if isinstance(model, DattriGPT) else as_dattri(model)

    def loss(params: Any, data: Any, device: Any = None) -> torch.Tensor:
        x, y, m = _as_batch(*_unpack(data))
        if isinstance(params, torch.nn.Module):
            dev = device or next(params.parameters()).device
            logits = params(x.to(dev))
            return _weighted_ce(logits, y.to(dev), m.to(dev)).sum()
        logits = torch.func.functional_call(model, dict(params), (x,))
        return _weighted_ce(logits, y, m).sum()

    return loss


def query_target(model: torch.nn.Module) -> Callable:
    """dattri's ``target_func`` (module doc): ``(params, data)`` -> the mean over the rows of a text's mean CE,
    Σ_t m_t·CE_t / Σ_t m_t (nats/token)."""
    model = model if isinstance(model, DattriGPT) else as_dattri(model)

    def target(params: Any, data: Any) -> torch.Tensor:
        x, y, m = _as_batch(*_unpack(data))
        logits = torch.func.functional_call(model, dict(params), (x,))
        m = m.to(logits.dtype)
        return (_weighted_ce(logits, y, m) / m.sum(-1)).mean()

    return target


def _query_weights(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A query row's m: its mask over its target count (L_q = Σ m·CE: loss and target agree on it)."""
    mask = mask.to(dtype)
    return mask / mask.sum(-1, keepdim=True)


# --------------------------------------------------------------------------- swaps (the bank's candidates)


def train_rows(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, mask) [C + 1, T]: every candidate injected in the case's row, then the replaced row itself."""
    rows = [case.candidate_row(n) for n in case.candidates] + [case.ordinary_row()]
    return tuple(torch.cat([r[i] for r in rows]) for i in range(3))  # type: ignore[return-value]


def test_rows(case: Case, T: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, mask) [Q, T]: every query of the case, right-padded with the pad id to T (default the case's) and
    masked."""
    return padded_queries(case.queries, case.pad_id, T or case.x.shape[1])


def padded_queries(queries: Mapping[str, Sequence[int]], pad_id: int, T: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, mask) [Q, T] of the queries (token ids), each right-padded with ``pad_id`` and masked (causal attention
    makes the padding inert)."""
    x = torch.full((len(queries), T), pad_id, dtype=torch.int64)
    y, mask = x.clone(), torch.zeros(len(queries), T, dtype=torch.bool)
    for i, ids in enumerate(queries.values()):
        n = len(ids) - 1
        t = torch.as_tensor(ids, dtype=torch.int64)
        x[i, :n], y[i, :n], mask[i, :n] = t[:-1], t[1:], True
    return x, y, mask


@dataclass
class BankTask:
    """One seed's case as dattri sees it (module doc): the task, its data and how to read its scores."""

    task: Any  # dattri.task.AttributionTask
    train: torch.utils.data.TensorDataset  # (x, y, m): the candidates, then the replaced row
    test: torch.utils.data.TensorDataset  # (x, y, m): the queries
    candidates: list[str]
    queries: list[str]
    steps: list[int | None]  # the checkpoints' steps (None: a state handed in, not a saved step)
    lrs: list[float | None]  # the rate of the update consuming each step's batch (None: not known)
    n_targets: int  # N = B·T, the trainer's denominator
    seed: int | None = None
    case: Case | None = field(default=None, repr=False)

    def loaders(self, batch_size: int = 16) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader]:
        """(train, test) loaders in order (dattri refuses to interpret shuffled ones)."""
        from torch.utils.data import DataLoader

        return (DataLoader(self.train, batch_size=batch_size, shuffle=False),
                DataLoader(self.test, batch_size=batch_size, shuffle=False))

    def tracin_weights(self) -> torch.Tensor:
        """TracIn's ``weight_list`` in the bank's units: lr_t / N per checkpoint (nats/token out of ⟨∇ℓ, ∇L⟩)."""
        if any(lr is None for lr in self.lrs):
            raise SeedlabError("tracin_weights: the task's checkpoints have no learning rate (a state handed in)")
        return torch.tensor([lr / self.n_targets for lr in self.lrs])  # type: ignore[operator]

    def estimate(self, scores: Any) -> np.ndarray:
        """dattri's [C + 1, Q] scores -> the predicted ΔL_query of each swap [C, Q]: −(score(c) − score(r))."""
        s = np.asarray(scores.detach().cpu().double() if torch.is_tensor(scores) else scores, dtype=np.float64)
        C, Q = len(self.candidates), len(self.queries)
        if s.shape != (C + 1, Q):
            raise SeedlabError(f"scores: expected [{C + 1}, {Q}] (the candidates and the replaced row x the queries), "
                               f"got {list(s.shape)}")
        return -(s[:C] - s[C])


def _load_state(m: torch.nn.Module, ckpt: Any) -> torch.nn.Module:
    m.load_state_dict(ckpt)
    return m.eval()


def case_task(model: GPT, case: Case, checkpoints: Sequence[Any], *, load: Callable | None = None,
              steps: Sequence[int | None] | None = None, lrs: Sequence[float | None] | None = None,
              seed: int | None = None) -> BankTask:
    """The dattri task of ``case`` on ``model``'s architecture with ``checkpoints`` (state dicts, or anything
    ``load(model, checkpoint)`` turns into a loaded model: dattri's ``checkpoints_load_func``)."""
    AttributionTask = _dattri()
    from torch.utils.data import TensorDataset

    model = as_dattri(model)
    t = AttributionTask(loss_func=row_loss(model), model=model, checkpoints=list(checkpoints),
                        target_func=query_target(model), checkpoints_load_func=load or _load_state)
    n = len(checkpoints)
    dtype = next(model.parameters()).dtype
    x, y, mask = train_rows(case)
    qx, qy, qm = test_rows(case)
    return BankTask(t, TensorDataset(x, y, mask.to(dtype)), TensorDataset(qx, qy, _query_weights(qm, dtype)),
                    list(case.candidates), list(case.queries), list(steps) if steps is not None else [None] * n,
                    list(lrs) if lrs is not None else [None] * n, case.n_targets, seed, case)


def task(root: str | Path, seed: int, *, steps: str | Sequence[int] = "injection") -> BankTask:
    """The dattri task of one seed of a bank folder or an exported benchmark (verified first; module doc)."""
    from seedlab.attribution.estimators.attribute import tracin_steps
    from seedlab.attribution.benchmark import bank_case, open_scorable
    from seedlab.lm.schedule import lr_of

    _dattri()
    bank, measured, _ = open_scorable(root)
    cfg, rd = bank.cfg, bank.dir
    seeds = sorted(int(k) for k in measured.seed.unique())
    if seed not in seeds:
        raise SeedlabError(f"seed: {seed} is not one of the bank's measured seeds ({', '.join(map(str, seeds))})")
    if isinstance(steps, str):
        if steps not in ("injection", "checkpoints"):
            raise SeedlabError(f"steps: 'injection', 'checkpoints' or a list of steps, got {steps!r}")
        want = [cfg.injection_step] if steps == "injection" else tracin_steps(cfg)
    else:
        want = [int(t) for t in steps]
    twin = rd.twin(seed)
    manifest = twin.read_manifest()
    have = sorted((int(t) for t in manifest if twin.checkpoint(int(t)).is_file()))
    missing = [t for t in want if t not in have]
    if missing or not want:
        raise SeedlabError(f"seed {seed}: {twin.checkpoint(missing[0]) if missing else twin.path} has no checkpoint"
                           f"{f' at step {missing[0]}' if missing else 's'} (a bank without its checkpoints; the twin "
                           f"saved {', '.join(map(str, have)) or 'none'})")
    first = twin.weights(want[0])  # every tensor checked against the manifest
    dtype = next(v.dtype for v in first.values() if v.is_floating_point())
    model = GPT(bank.inputs.gcfg).to(dtype)

    def load(m: torch.nn.Module, step: int) -> torch.nn.Module:
        m.load_state_dict(twin.weights(step))  # read, hash-checked, on every (re)load
        return m.eval()

    return case_task(model, bank_case(bank, seed), want, load=load, steps=want, lrs=[lr_of(cfg, t) for t in want],
                     seed=seed)


#: no projection: dattri's TracIn then takes exact inner products of the per-sample gradients
IDENTITY = {"proj_type": "identity"}


@contextlib.contextmanager
def _kept_defaults(*modules):
    """dattri 0.3 updates its modules' default projector settings in place with the ones given: restored after."""
    saved = [(m, dict(m.DEFAULT_PROJECTOR_KWARGS)) for m in modules]
    try:
        yield
    finally:
        for m, kw in saved:
            m.DEFAULT_PROJECTOR_KWARGS.clear()
            m.DEFAULT_PROJECTOR_KWARGS.update(kw)


@contextlib.contextmanager
def _quiet():
    """dattri's progress bars and warnings off (its tqdm writes to stderr on every loader pass)."""
    import functools

    import tqdm

    with warnings.catch_warnings(), _patched_tqdm(functools.partial(tqdm.tqdm, disable=True)):
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _patched_tqdm(quiet):
    import sys

    mods = [m for name, m in list(sys.modules.items()) if name.startswith("dattri") and hasattr(m, "tqdm")]
    before = [(m, m.tqdm) for m in mods]
    for m in mods:
        m.tqdm = quiet
    try:
        yield
    finally:
        for m, t in before:
            m.tqdm = t


def tracin_scores(bt: BankTask, weights: torch.Tensor, *, batch_size: int = 16, normalized: bool = False
                  ) -> torch.Tensor:
    """dattri's ``TracInAttributor`` on ``bt`` with ``weights`` per checkpoint and no projection: its [n_train,
    n_test] scores (``normalized``: unit gradients, TracIn's CosIn / Grad-Cos)."""
    from dattri.algorithm import tracin as module

    with _kept_defaults(module), _quiet():
        att = module.TracInAttributor(bt.task, weight_list=weights, normalized_grad=normalized,
                                      projector_kwargs=dict(IDENTITY))
        return att.attribute(*bt.loaders(batch_size))


def _tracin(model: GPT, case: Case, weight: float) -> np.ndarray:
    bt = case_task(model, case, [{k: v.detach().clone() for k, v in model.state_dict().items()}])
    return bt.estimate(tracin_scores(bt, torch.tensor([weight])))


@declare(unit="nats/token")
def tracin(ctx: Context) -> np.ndarray:
    """Plug-in: dattri's TracIn at θ_s with weight lr_s / N, no projection — the bank's ``tracin`` through dattri
    (nats/token; the same number at every horizon)."""
    _dattri()
    if ctx.lr is None:
        raise SeedlabError("dattri_adapter:tracin: the context has no learning rate")
    return _tracin(ctx.model, ctx.case, ctx.lr / ctx.case.n_targets)


def grad_dot(model: GPT, case: Case, grads: SharedGradients) -> np.ndarray:
    """Plug-in: dattri's Grad-Dot at θ_s (TracIn with weight 1 / N: −⟨∇L_q, ∇ℓ_c − ∇ℓ_r⟩ / N), a score."""
    _dattri()
    return _tracin(model, case, 1.0 / case.n_targets)


# --------------------------------------------------------------------------- the run's own rows


@dataclass
class RowsTask:
    """The run's own rows (module doc) as dattri sees them at some checkpoints: the task and its data."""

    task: Any  # dattri.task.AttributionTask on a DattriGPT
    model: DattriGPT
    train: torch.utils.data.TensorDataset  # (x, y, m): the removed rows (m = 1), in Rows' order
    test: torch.utils.data.TensorDataset  # (x, y, m): the queries (m = mask / n_targets)
    steps: list[int]  # the checkpoints' steps

    def loaders(self, batch_size: int | None = None, *, dicts: bool = False
                ) -> tuple[torch.utils.data.DataLoader, torch.utils.data.DataLoader]:
        """(train, test) loaders in order, each one batch by default (the influence functions transform the test
        gradients once per training batch); ``dicts``: batches as {x, y, m} (the hook-based attributors)."""
        from torch.utils.data import DataLoader

        def make(ds):
            data = _Dicts(ds) if dicts else ds
            return DataLoader(data, batch_size=batch_size or len(ds), shuffle=False)

        return make(self.train), make(self.test)


class _Dicts(torch.utils.data.Dataset):
    def __init__(self, ds: torch.utils.data.TensorDataset):
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y, m = self.ds[i]
        return {"x": x, "y": y, "m": m}


def rows_task(rows: Rows, steps: Sequence[int] | None = None, *, who: str = "dattri") -> RowsTask:
    """The dattri task of a :class:`~seedlab.attribution.estimators.plugins.Rows` at the twin's weights of
    ``steps`` (default: the horizon), each read and hash-checked when dattri loads it; a step without them is a
    one-line error naming ``who``, before dattri runs."""
    AttributionTask = _dattri()
    from torch.utils.data import TensorDataset

    steps = [rows.horizon] if steps is None else [int(t) for t in steps]
    rows.require(steps, who)
    first = rows.weights(steps[0])
    dtype = next(v.dtype for v in first.values() if v.is_floating_point())
    model = DattriGPT(rows._model().config).to(dtype)
    model.load_state_dict(first)
    model.eval()

    def load(m: torch.nn.Module, step: int) -> torch.nn.Module:
        m.load_state_dict(rows.weights(step))
        return m.eval()

    t = AttributionTask(loss_func=row_loss(model), model=model, checkpoints=list(steps),
                        target_func=query_target(model), checkpoints_load_func=load)
    T = rows.x.shape[1]
    qx, qy, qm = padded_queries(rows.queries, rows.pad_id, T)
    return RowsTask(t, model, TensorDataset(rows.x, rows.y, torch.ones(rows.x.shape, dtype=dtype)),
                    TensorDataset(qx, qy, _query_weights(qm, dtype)), steps)


def rows_scores(rows: Rows, make: Callable[[Any], Any], *, steps: Sequence[int] | None = None, cache: bool = True,
                dicts: bool = False, who: str = "dattri") -> np.ndarray:
    """[R, Q]: ``make(task)``'s attributor (any dattri attributor with the usual ``cache(full_train_loader)`` and
    ``attribute(train_loader, test_loader)``) on :func:`rows_task`, the rows also its full training set
    (``cache``), its scores as the predicted Δ L_q of removing each row (+score: module doc)."""
    rt = rows_task(rows, steps, who=who)
    train, test = rt.loaders(dicts=dicts)
    with _quiet(), torch.random.fork_rng():
        torch.manual_seed(0)  # LiSSA's and Arnoldi's draws: the same scores on every run
        att = make(rt.task)
        if cache:
            att.cache(train)
        s = att.attribute(train, test)
    return _checked(s, rows, who)


def _checked(s: Any, rows: Rows, who: str) -> np.ndarray:
    s = np.asarray(s.detach().cpu().double() if torch.is_tensor(s) else s, dtype=np.float64)
    if not np.isfinite(s).all():
        raise SeedlabError(f"{who}: returned non-finite scores ({int((~np.isfinite(s)).sum())} of {s.size}): its "
                           f"settings diverge on this bank")
    return s


# --- the attributors, one training-rows plug-in each (module doc)

#: the settings each attributor runs with (sized for the tiny test exports: module doc)
SETTINGS: dict[str, dict[str, Any]] = {
    "if_explicit": {"layer_name": ["ln_f.bias"], "regularization": 1e-2},
    "if_cg": {"max_iter": 5, "regularization": 1e-2},
    "if_lissa": {"batch_size": 8, "num_repeat": 1, "recursion_depth": 20, "damping": 1e-2, "scaling": 1e4},
    "if_arnoldi": {"proj_dim": 5, "max_iter": 15, "regularization": 1e-2},
    "if_datainf": {"regularization": 1e-1},
    "if_ekfac": {"damping": 1e-2},
    "trak": {"regularization": 1e-3},  # proj_dim: half the rows (ΦᵀΦ invertible), at most 512
    "logra": {"proj_dim": 16, "damping": 1e-3, "offload": "none"},
    "factgrass": {"proj_dim": 16, "blowup_factor": 4, "damping": 1e-3, "offload": "none"},
    "block_projected_if": {"damping": 1e-3, "offload": "none",  # two stages: 8 × 8 per layer, then 16
                           "sparsifier_kwargs": {"proj_dim": 8, "proj_max_batch_size": 64, "proj_type": "normal"},
                           "projector_kwargs": {"proj_dim": 16, "proj_max_batch_size": 64, "proj_type": "normal"}},
    "dvemb": {"proj_dim": 64, "proj_seed": 0},
}

#: why an attributor does not run on the run's own rows (module doc); the message its plug-in raises
LIMITS = {
    "if_ekfac": "dattri 0.3.0's IFAttributorEKFAC fits activations of shape [batch, features] only (dattri/func/"
                "fisher.py _update_covariance sets a_prev for 2-D module inputs alone, so a [batch, tokens, features] "
                "input raises UnboundLocalError): no sequence model runs; kronfluence's EK-FAC is the row estimator "
                "'ekfac'",
    "rps": "RPSAttributor decomposes an L2-fine-tuned classifier's last layer with one feature vector and one label per "
           "sample (dattri reads `for x, _ in loader` through getattr(model, final_linear_layer_name) and one test "
           "label per test sample); a training row of a language model is T next-token predictions, no one label",
    "knn_shapley": "KNNShapleyAttributor values a k-nearest-neighbour classifier on fixed embeddings with one label "
                   "per sample and takes no model (dattri 0.3.0 raises NotImplementedError for a task): it does not "
                   "estimate what removing a row does to this run",
}


def _unsupported(name: str) -> Unsupported:
    return Unsupported(f"dattri_adapter:rows.{name}: {LIMITS[name]}")


def _tracin_rows(rows: Rows) -> np.ndarray:
    """TracIn's one visit per row at θ_t (module doc), one dattri call per step."""
    _dattri()
    who = "dattri_adapter:rows.tracin (TracIn at each row's own step)"
    rows.require(sorted(set(rows.steps)), who)
    from dattri.algorithm import tracin as module

    out = np.zeros((len(rows.steps), len(rows.queries)))
    for t in sorted(set(rows.steps)):
        idx = [j for j, u in enumerate(rows.steps) if u == t]
        rt = rows_task(rows, [t], who=who)
        sub = torch.utils.data.Subset(rt.train, idx)
        from torch.utils.data import DataLoader

        with _kept_defaults(module), _quiet():
            att = module.TracInAttributor(rt.task, weight_list=torch.tensor([rows.lr(t) / rows.n_targets]),
                                          normalized_grad=False, projector_kwargs=dict(IDENTITY))
            s = att.attribute(DataLoader(sub, batch_size=len(idx), shuffle=False),
                              DataLoader(rt.test, batch_size=len(rt.test), shuffle=False))
        out[idx] = _checked(s, rows, who)
    return out


def _tracin_at_h(rows: Rows, normalized: bool) -> np.ndarray:
    _dattri()
    from dattri.algorithm import tracin as module

    weight = 1.0 if normalized else 1.0 / rows.n_targets
    with _kept_defaults(module):
        return rows_scores(rows, lambda task: module.TracInAttributor(
            task, weight_list=torch.tensor([weight]), normalized_grad=normalized, projector_kwargs=dict(IDENTITY)),
            cache=False, who=f"dattri_adapter:rows.{'grad_cos' if normalized else 'grad_dot'}")


def _influence(name: str, cls: str) -> Callable[[Rows], np.ndarray]:
    def run(rows: Rows) -> np.ndarray:
        _dattri()
        import dattri.algorithm as algorithm

        make = getattr(algorithm, cls)
        try:
            return rows_scores(rows, lambda task: make(task, **SETTINGS[name]), who=f"dattri_adapter:rows.{name}")
        except UnboundLocalError as e:  # dattri's EK-FAC on a sequence model (LIMITS)
            if name in LIMITS and "a_prev" in str(e):
                raise _unsupported(name) from None
            raise

    return run


def _trak(rows: Rows) -> np.ndarray:
    _dattri()
    from dattri.algorithm import trak as module

    rt = rows_task(rows, who="dattri_adapter:rows.trak")
    target = query_target(rt.model)
    kw = {"proj_dim": max(1, min(512, len(rows.steps) // 2)), "proj_max_batch_size": 32, "proj_seed": 0}

    def probability(params, data):  # the row's geometric-mean token probability (module doc)
        return torch.exp(-target(params, data))

    train, test = rt.loaders()
    with _kept_defaults(module), _quiet():
        att = module.TRAKAttributor(rt.task, correct_probability_func=probability, projector_kwargs=kw,
                                    **SETTINGS["trak"])
        att.cache(train)
        s = att.attribute(test)
    return _checked(s, rows, "dattri_adapter:rows.trak")


def _projected(name: str, cls: str) -> Callable[[Rows], np.ndarray]:
    def run(rows: Rows) -> np.ndarray:
        _dattri()
        import logging
        import tempfile

        import dattri.algorithm as algorithm

        make = getattr(algorithm, cls)
        log = logging.getLogger("dattri")
        level = log.level
        log.setLevel(logging.WARNING)
        try:  # eager: its compressor is torch.compile'd, seconds of compiling for a row-sized model
            with tempfile.TemporaryDirectory(prefix="seedlab-dattri-") as where, \
                    torch.compiler.set_stance("force_eager"):
                return rows_scores(rows, lambda task: make(task, cache_dir=where, **SETTINGS[name]), dicts=True,
                                   who=f"dattri_adapter:rows.{name}")
        finally:
            log.setLevel(level)

    return run


def _dvemb(rows: Rows) -> np.ndarray:
    """DVEmb (module doc): the trajectory from the oldest row's step to h, every batch of it from the exported rows,
    every step's weights from the export's checkpoints."""
    _dattri()
    from dattri.algorithm.dvemb import DVEmbAttributor

    who = "dattri_adapter:rows.dvemb"
    first, B = min(rows.steps), rows.batch_size
    for t in range(first, rows.horizon):
        have = sum(1 for u in rows.steps if u == t)
        if have != B:
            raise Unsupported(f"{who}: DVEmb replays the training trajectory, every row of every step from the oldest "
                              f"scored row's step ({first}) to the horizon ({rows.horizon}); this bank holds {have} of "
                              f"step {t}'s {B} rows (a bank with groups keeps every row of steps s .. end − 1)")
    rows.require(range(first, rows.horizon), who)
    rt = rows_task(rows, [rows.horizon], who=who)
    x, y, m = rt.train.tensors
    with _quiet():
        att = DVEmbAttributor(rt.task, **SETTINGS["dvemb"])
        for t in range(first, rows.horizon):
            idx = torch.tensor([j for j, u in enumerate(rows.steps) if u == t])
            rt.model.load_state_dict(rows.weights(t))
            # dattri divides the rate by the batch (a mean loss); the trainer's is the rows' CE sums over N = B·T
            att.cache_gradients(0, (x[idx], y[idx], m[idx]), idx, rows.lr(t) * B / rows.n_targets)
        att.cache()
        rt.model.load_state_dict(rows.weights(rows.horizon))
        s = att.attribute(torch.utils.data.DataLoader(rt.test, batch_size=len(rt.test), shuffle=False))
    return _checked(s, rows, who)


def _refused(name: str) -> Callable[[Rows], np.ndarray]:
    def run(rows: Rows) -> np.ndarray:
        _dattri()
        raise _unsupported(name)

    return run


@dataclass(frozen=True)
class Attributor:
    """One attributor dattri ships, as a training-rows plug-in (module doc)."""

    name: str  # the plug-in's attribute in :data:`rows`
    cls: str  # dattri.algorithm's class
    unit: str
    fn: Callable[[Rows], np.ndarray]
    what: str

    @property
    def runs(self) -> bool:
        return self.name not in LIMITS


ATTRIBUTORS: dict[str, Attributor] = {a.name: a for a in (
    Attributor("tracin", "TracInAttributor", "nats/token", _tracin_rows, "TracIn, the row's one visit at θ_t"),
    Attributor("grad_dot", "TracInAttributor", "score", lambda rows: _tracin_at_h(rows, False), "Grad-Dot at θ_h"),
    Attributor("grad_cos", "TracInAttributor", "score", lambda rows: _tracin_at_h(rows, True), "Grad-Cos at θ_h"),
    Attributor("if_explicit", "IFAttributorExplicit", "score", _influence("if_explicit", "IFAttributorExplicit"),
               "influence function, the explicit damped Hessian (ln_f)"),
    Attributor("if_cg", "IFAttributorCG", "score", _influence("if_cg", "IFAttributorCG"),
               "influence function, conjugate gradients"),
    Attributor("if_lissa", "IFAttributorLiSSA", "score", _influence("if_lissa", "IFAttributorLiSSA"),
               "influence function, LiSSA"),
    Attributor("if_arnoldi", "IFAttributorArnoldi", "score", _influence("if_arnoldi", "IFAttributorArnoldi"),
               "influence function, Arnoldi"),
    Attributor("if_datainf", "IFAttributorDataInf", "score", _influence("if_datainf", "IFAttributorDataInf"),
               "influence function, DataInf"),
    Attributor("if_ekfac", "IFAttributorEKFAC", "score", _influence("if_ekfac", "IFAttributorEKFAC"),
               "influence function, EK-FAC"),
    Attributor("trak", "TRAKAttributor", "score", _trak, "TRAK, one model"),
    Attributor("logra", "LoGraAttributor", "score", _projected("logra", "LoGraAttributor"), "LoGra"),
    Attributor("factgrass", "FactGraSSAttributor", "score", _projected("factgrass", "FactGraSSAttributor"),
               "FactGraSS"),
    Attributor("block_projected_if", "BlockProjectedIFAttributor", "score",
               _projected("block_projected_if", "BlockProjectedIFAttributor"), "block-projected influence function"),
    Attributor("dvemb", "DVEmbAttributor", "score", _dvemb, "data value embeddings"),
    Attributor("rps", "RPSAttributor", "score", _refused("rps"), "representer points"),
    Attributor("knn_shapley", "KNNShapleyAttributor", "score", _refused("knn_shapley"), "KNN-Shapley"),
)}


def _plugin(a: Attributor) -> Callable[[Rows], np.ndarray]:
    def plugin(rows: Rows) -> np.ndarray:
        return a.fn(rows)

    plugin.__name__ = plugin.__qualname__ = a.name
    plugin.__doc__ = f"dattri's {a.cls} on the run's own rows: {a.what} (dattri_adapter module doc)."
    return declare(unit=a.unit, horizons=["end"])(plugin)


#: the training-rows plug-ins, ``seedlab.attribution.dattri_adapter:rows.<name>`` (module doc)
rows = SimpleNamespace(**{a.name: _plugin(a) for a in ATTRIBUTORS.values()})

#: every attributor dattri 0.3.0 ships, by class: the plug-ins that run it (a test checks it against dattri itself)
SHIPPED = sorted({a.cls for a in ATTRIBUTORS.values()})
