"""The library estimators: the influence functions ``ekfac`` and ``kfac`` (curvature from
kronfluence) and ``trak`` (TRAK through traker: :func:`trak`).

    Δ L_q ≈ −⟨∇L_q, (F + λI)⁻¹ (∇ℓ_c − ∇ℓ_r)⟩ / D

F is kronfluence's Fisher of the *per-row* training loss (a row's CE sum), averaged over the
rows it is fitted on (EK-FAC: Kronecker eigenbasis with corrected eigenvalues, George et al.
2018; K-FAC: the Kronecker product itself) — by default the true Fisher (labels sampled from
the model, a seeded generator), which is the Gauss-Newton curvature of the loss. λ is
kronfluence's damping (``None``: its heuristic, 0.1 × the mean eigenvalue, per module).
The formula is the response-function influence of the swap: a model trained *to
convergence* on D rows whose mean token loss is Σ ℓ / (D·T) moves by
−H⁻¹ (∇ℓ_c − ∇ℓ_r) / (D·T) when row r becomes c, and the Gauss-Newton H of that mean is
F / T. So its horizon is "convergence", not a step count. ``train_rows`` sets D; the default
D = B (the batch) makes it the one-step formula with lr·I replaced by H⁻¹:
−⟨∇L_q, H⁻¹ δ_c⟩, δ_c = (∇ℓ_c − ∇ℓ_r)/(B·T); pass D = steps·B to read the whole
single-epoch run as the training set (the estimate shrinks by 1/steps; ranks are unchanged).

kronfluence's K-FAC factors are averaged over *tokens* (A = E_tok[a aᵀ], S = E_tok[g gᵀ]),
so its F is per token, about (per-row F)/T when tokens are uncorrelated; the ``kfac``
estimate divides by T as well (T = the rows' target positions) to stay on the per-row scale,
and its ``damping`` acts on that per-token scale.

Which parameters: kronfluence tracks ``nn.Linear`` (and Conv2d) modules only. The GPT's
output head is ``F.linear(h, wte.weight)`` — the token table itself, no Linear module — and
the embeddings, LayerNorms and the head are therefore **not tracked**: the influence is
computed over the transformer blocks' Linear weights and biases (``attn.c_attn``,
``attn.c_proj``, ``mlp.c_fc``, ``mlp.c_proj`` of every block; ``modules="mlp"`` keeps the MLP
pair only, the choice of Grosse et al. 2023), and the other parameters are treated as frozen
(their gradient components are dropped from both the query and the training gradients).
Wrapping the head as an ``nn.Linear`` sharing ``wte.weight`` would let kronfluence track
only its head use (not the lookup), and its gradient factor is vocab × vocab (50304² for
GPT-2: 10 GB and an infeasible eigendecomposition), so it is not done.

Library choice: kronfluence 1.0.1 (installed ``--no-deps``: its torchvision requirement would
replace the pinned torch). It agrees with the exact damped inverse Hessian to float64
round-off on a model where EK-FAC and K-FAC are exact (tests/attribution/test_influence.py),
masks padding tokens, samples the true Fisher through the task, works on module hooks (no
functional rewrite of the GPT) and keeps its factors on disk (a temporary folder here).
Not taken: dattri 0.3.0 (installs cleanly, but its EK-FAC ignores the loss mask — fisher.py
sets it to ones — needs a torch.func functional loss, and a first try on the same exact-Hessian
check disagreed with the brute force); bergson 2.5.1 (requires torchvision 0.28 and
torchaudio 2.11, which would replace torch 2.13).

TRAK: traker 0.3.2 (``pip install traker==0.3.2``; it requires only torch>=2, numpy and tqdm,
so the pinned torch stays; its CUDA projector needs the separate fast_jl build, and the CPU
BasicProjector is used here). Its gradients come from ``torch.func`` (vmap over one example).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from seedlab.attribution.estimators.builtin import Case, query_tensors
from seedlab.errors import SeedlabError
from seedlab.lm.determinism import deterministic
from seedlab.lm.model import GPT, masked_ce_sum

Strategy = Literal["ekfac", "kfac", "diagonal", "identity"]


@dataclass(frozen=True)
class InfluenceOptions:
    """Settings of the influence estimators (all optional)."""

    damping: float | None = None  # λ; None: kronfluence's heuristic 0.1 × mean eigenvalue, per module
    modules: str | tuple[str, ...] = "all"  # "all" Linear modules of the blocks, "mlp", or module names
    fit: tuple[torch.Tensor, torch.Tensor] | None = None  # rows (x, y) [M, T] for F; None: the ordinary batch
    train_rows: int | None = None  # D of the formula; None: B (the batch's rows)
    true_fisher: bool = True  # labels sampled from the model (False: the empirical Fisher, the data's labels)
    seed: int = 0  # of the label sampling
    weights: Mapping[str, torch.Tensor] | None = None  # evaluate at these weights instead of the model's
    fit_batch: int = 8  # rows per forward while fitting F (memory only)
    query_batch: int = 8  # queries per forward (memory only)
    dtype: torch.dtype = torch.float32  # kronfluence's factor, gradient and score dtypes (eigendecomposition: float64)
    proj_dim: int | None = None  # trak: the projection's dimension; None: half the training rows, at most 2048


def tracked_modules(model: GPT, modules: str | Sequence[str] = "all") -> list[str]:
    """The Linear modules the influence is computed over (see the module doc)."""
    mlp = ("mlp.c_fc", "mlp.c_proj")
    kinds = {"all": ("attn.c_attn", "attn.c_proj", *mlp), "mlp": mlp}
    if isinstance(modules, str):
        if modules not in kinds:
            raise SeedlabError(f"modules: must be 'all', 'mlp' or a list of module names, got {modules!r}")
        return [f"blocks.{l}.{k}" for l in range(len(model.blocks)) for k in kinds[modules]]
    names = dict(model.named_modules())
    bad = [m for m in modules if not isinstance(names.get(m), torch.nn.Linear)]
    if bad or not modules:
        raise SeedlabError(f"modules: must name nn.Linear modules of the model, got {bad or list(modules)!r}")
    return list(modules)


# --------------------------------------------------------------------------- kronfluence glue


class _Rows(torch.utils.data.Dataset):
    def __init__(self, items: list[dict[str, torch.Tensor]]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def _rows(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> _Rows:
    return _Rows([{"x": x[i], "y": y[i], "mask": mask[i]} for i in range(x.shape[0])])


def gpt_task(modules: Sequence[str], *, true_fisher: bool = True, seed: int = 0) -> Any:
    """A kronfluence ``Task`` for seedlab's GPT on batches {x, y, mask} [b, T]:
    training loss = masked CE *sum* (sampled labels for the true Fisher), measurement = each
    row's masked *mean* CE (L_query), summed over the batch."""
    from kronfluence.task import Task

    class GPTTask(Task):
        def __init__(self) -> None:
            self.generators: dict[torch.device, torch.Generator] = {}

        def _generator(self, device: torch.device) -> torch.Generator:
            if device not in self.generators:
                self.generators[device] = torch.Generator(device=device).manual_seed(seed)
            return self.generators[device]

        def compute_train_loss(self, batch: Any, model: torch.nn.Module, sample: bool = False) -> torch.Tensor:
            logits, _ = model(batch["x"])
            y = batch["y"]
            if sample and true_fisher:
                with torch.no_grad():
                    probs = torch.softmax(logits.detach().float().flatten(0, 1), dim=-1)
                    y = torch.multinomial(probs, 1, generator=self._generator(probs.device)).view_as(y)
            return masked_ce_sum(logits, y, batch["mask"])

        def compute_measurement(self, batch: Any, model: torch.nn.Module) -> torch.Tensor:
            logits, _ = model(batch["x"])
            y, m = batch["y"], batch["mask"]
            ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none").view_as(y)
            return (torch.where(m, ce, torch.zeros_like(ce)).sum(1) / m.sum(1)).sum()

        def get_influence_tracked_modules(self) -> list[str]:
            return list(modules)

        def get_attention_mask(self, batch: Any) -> torch.Tensor | None:
            m = batch["mask"]
            return None if bool(m.all()) else m.long()

    return GPTTask()


def kronfluence_scores(model: torch.nn.Module, task: Any, fit: torch.utils.data.Dataset,
                       queries: torch.utils.data.Dataset, train: torch.utils.data.Dataset, *,
                       strategy: Strategy = "ekfac", damping: float | None = None, dtype: torch.dtype = torch.float32,
                       fit_batch: int = 8, query_batch: int = 8) -> np.ndarray:
    """kronfluence's pairwise scores [queries × train]: ∇f_qᵀ (F + λI)⁻¹ ∇ℓ_j, F fitted on ``fit``.

    Works on a deep copy of ``model`` (kronfluence wraps its modules in place), in a temporary
    folder; training examples one per batch, so equal examples get bitwise-equal scores."""
    from kronfluence.analyzer import Analyzer, prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments
    from kronfluence.utils.state import State

    device = next(model.parameters()).device
    work = prepare_model(copy.deepcopy(model), task)
    if State._shared_state and State().device.type != device.type:  # a process-wide singleton
        State._reset_state()
    factor_args = FactorArguments(
        strategy=strategy, use_empirical_fisher=False, activation_covariance_dtype=dtype,
        gradient_covariance_dtype=dtype, per_sample_gradient_dtype=dtype, lambda_dtype=dtype,
    )
    score_args = ScoreArguments(
        damping_factor=damping, per_sample_gradient_dtype=dtype, precondition_dtype=dtype, score_dtype=dtype,
    )
    with tempfile.TemporaryDirectory(prefix="seedlab-kronfluence-") as out, warnings.catch_warnings(), \
            deterministic(device, strict=False), _quiet_logs():
        warnings.simplefilter("ignore", FutureWarning)
        analyzer = Analyzer("seedlab", work, task, cpu=device.type == "cpu", disable_tqdm=True, output_dir=out)
        analyzer.fit_all_factors("f", fit, per_device_batch_size=fit_batch, factor_args=factor_args,
                                 overwrite_output_dir=True)
        analyzer.compute_pairwise_scores("s", "f", queries, train, per_device_query_batch_size=query_batch,
                                         per_device_train_batch_size=1, score_args=score_args,
                                         overwrite_output_dir=True)
        scores = analyzer.load_pairwise_scores("s")["all_modules"]
    return scores.detach().double().cpu().numpy()


@contextlib.contextmanager
def _quiet_logs(name: str = "kronfluence"):
    log = logging.getLogger(name)
    before = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(before)


# --------------------------------------------------------------------------- the estimators


def _weights(model: GPT, o: InfluenceOptions) -> GPT:
    """``model``, or a copy at ``o.weights``."""
    if o.weights is None:
        return model
    model = copy.deepcopy(model)
    model.load_state_dict(o.weights)
    return model


def _fit_rows(case: Case, o: InfluenceOptions, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows (x, y) [M, T] the curvature is fitted on: ``o.fit``, else the ordinary batch."""
    if o.fit is None:
        return case.x, case.y
    fx, fy = (torch.as_tensor(t, dtype=torch.int64) for t in o.fit)
    if fx.dim() != 2 or fx.shape != fy.shape or fx.shape[1] > block_size:
        raise SeedlabError(f"fit: must be (x, y) [M, T <= block_size], got {tuple(fx.shape)} and {tuple(fy.shape)}")
    return fx, fy


def _swap_rows(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, mask) [1 + K, T]: the replaced row, then every candidate's row."""
    rows = [case.ordinary_row(), *(case.candidate_row(c) for c in case.candidates)]
    return tuple(torch.cat(t) for t in zip(*rows))  # type: ignore[return-value]


def _query_rows(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, mask) [Q, L] of the case's queries (:func:`query_rows`)."""
    return query_rows(case.queries, case.pad_id)


def query_rows(queries: Mapping[str, Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, mask) [Q, L] of the queries (token ids), padded with ``pad_id`` after the text (masked) to the longest."""
    L = max(len(ids) for ids in queries.values()) - 1
    qx = torch.full((len(queries), L), pad_id, dtype=torch.int64)
    qy, qm = qx.clone(), torch.zeros(qx.shape, dtype=torch.bool)
    for i, ids in enumerate(queries.values()):
        x, y, m = query_tensors(ids)
        n = x.shape[1]
        qx[i, :n], qy[i, :n], qm[i, :n] = x[0], y[0], m[0]
    return qx, qy, qm


def influence(model: GPT, case: Case, *, strategy: Strategy = "ekfac",
              options: InfluenceOptions | None = None) -> np.ndarray:
    """[candidates × queries] of −⟨∇L_q, (F + λI)⁻¹ (∇ℓ_c − ∇ℓ_r)⟩ / D (the module doc).

    ``strategy``: "ekfac" or "kfac" (the registered estimators), or kronfluence's "diagonal" /
    "identity" (identity: no curvature, −⟨∇L_q, ∇ℓ_c − ∇ℓ_r⟩ / D over the tracked modules)."""
    o = options or InfluenceOptions()
    if strategy not in ("ekfac", "kfac", "diagonal", "identity"):
        raise SeedlabError(f"strategy: must be ekfac, kfac, diagonal or identity, got {strategy!r}")
    D = o.train_rows if o.train_rows is not None else case.x.shape[0]
    if D < 1:
        raise SeedlabError(f"train_rows: must be >= 1, got {D!r}")
    model = _weights(model, o)
    modules = tracked_modules(model, o.modules)
    fx, fy = _fit_rows(case, o, model.config.block_size)
    fit = _rows(fx, fy, torch.ones(fx.shape, dtype=torch.bool))
    task = gpt_task(modules, true_fisher=o.true_fisher, seed=o.seed)
    scores = kronfluence_scores(model, task, fit, _rows(*_query_rows(case)), _rows(*_swap_rows(case)),
                                strategy=strategy, damping=o.damping, dtype=o.dtype, fit_batch=o.fit_batch,
                                query_batch=o.query_batch)  # [Q, 1 + K]
    scale = D * (fx.shape[1] if strategy == "kfac" else 1)
    return -(scores[:, 1:] - scores[:, :1]).T / scale


# --------------------------------------------------------------------------- TRAK (traker)


def trak(model: GPT, case: Case, *, options: InfluenceOptions | None = None) -> np.ndarray:
    """``trak``: TRAK (Park et al. 2023, "TRAK: Attributing Model Behavior at Scale", eq. (9) with
    one model) through the ``traker`` library on the CPU, with its CPU projector (BasicProjector,
    Gaussian): [candidates × queries] of

        −(τ(q, c) − τ(q, r)),   τ(q, z) = φ(q)ᵀ (ΦᵀΦ)⁻¹ φ(z) · Q_z,   φ = Pᵀ∇f / √p,

    f a text's summed per-token margin log(p_t / (1 − p_t)) (the paper's multiclass margin,
    §3.3, one classification per next-token target; masked targets left out), Q_z the row's mean
    1 − p_t over its targets (the out-to-loss term; exact per token, averaged to traker's one
    number per example), P a seeded Gaussian projection of the p parameters to ``proj_dim``
    dimensions (``options.proj_dim``; None: half the training rows, at most 2048, so that ΦᵀΦ is
    invertible without regularisation; one block, so the p × proj_dim float32 matrix is made once
    and held: 4·p·proj_dim bytes) and Φ the projected gradients of the training set: the fit rows
    (``options.fit``; None: the ordinary batch), the replaced row and the candidates, featurized
    ``options.fit_batch`` rows at a time. A candidate equal to the replaced row is no swap and gets
    0 as every estimator does (traker's float32 X(XᵀX)⁻¹ puts equal rows at two positions ~1 ulp
    apart, so this is set, not computed). τ > 0 says training on z raises q's
    margin, i.e. lowers its loss: hence the minus sign. traker rescales (ΦᵀΦ)⁻¹ by its mean
    |entry|, so the scale is arbitrary: unit "score". All parameters are tracked; the model is
    copied to float32 on the CPU (``options.weights``: at those weights); ``options.seed`` seeds P."""
    o = options or InfluenceOptions()
    model = _weights(model, o)
    fx, fy = _fit_rows(case, o, model.config.block_size)
    sx, sy, sm = _swap_rows(case)
    X, Y = torch.cat([fx, sx]), torch.cat([fy, sy])
    M = torch.cat([torch.ones(fx.shape, dtype=torch.bool), sm])
    m = len(fx)
    scores = trak_tau(model, (X, Y, M), _query_rows(case), proj_dim=o.proj_dim, seed=o.seed,
                      fit_batch=o.fit_batch)  # [train, queries]
    est = -(scores[m + 1 :] - scores[m : m + 1])
    est[[case.passage(c) == case.own_row() for c in case.candidates]] = 0.0  # no swap (float32 features: ±1 ulp)
    return est


def trak_tau(model: GPT, train: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
             queries: tuple[torch.Tensor, torch.Tensor, torch.Tensor], *, proj_dim: int | None = None,
             seed: int = 0, fit_batch: int = 8) -> np.ndarray:
    """[train rows × queries] float64 of traker's τ(q, z) = φ(q)ᵀ (ΦᵀΦ)⁻¹ φ(z) · Q_z (:func:`trak`'s core, shared
    with attribution/estimators/rowscores.py): Φ the projected margin gradients of ``train`` (x, y, mask) [n, T], featurized
    ``fit_batch`` rows at a time in their order; ``queries`` (x, y, mask) [Q, L]; P seeded by ``seed``, of dimension
    ``proj_dim`` (None: n // 2, at most 2048); ``model`` copied to float32 on the CPU, every parameter tracked.
    τ > 0: training on z raises q's margin (lowers its loss); the scale is traker's (arbitrary)."""
    from trak import TRAKer
    from trak.projectors import BasicProjector, ProjectionType

    work = copy.deepcopy(model).float().cpu().eval()
    X, Y, M = train
    n, nq = len(X), len(queries[0])
    k = proj_dim or min(2048, max(1, n // 2))
    root = logging.getLogger()
    handlers = root.handlers[:]  # TRAKer calls logging.basicConfig(): the root logger is restored after
    with tempfile.TemporaryDirectory(prefix="seedlab-trak-") as out, _quiet_logs("TRAK"), _no_tqdm(), \
            warnings.catch_warnings(), deterministic(torch.device("cpu"), strict=False):
        warnings.simplefilter("ignore")
        projector = BasicProjector(grad_dim=sum(p.numel() for p in work.parameters()), proj_dim=k, seed=seed,
                                   proj_type=ProjectionType.normal, device="cpu", block_size=k)
        tr = TRAKer(model=work, task=_margins_task(), train_set_size=n, save_dir=out, device="cpu",
                    projector=projector, use_half_precision=False, logging_level=logging.ERROR)
        tr.load_checkpoint(work.state_dict(), model_id=0)
        for i in range(0, n, fit_batch):
            j = min(i + fit_batch, n)
            tr.featurize(batch=(X[i:j], Y[i:j], M[i:j]), num_samples=j - i)
        tr.finalize_features()
        if not tr.projector.proj_matrix_available:  # traker 0.3.2 frees it and, with one block, never makes it again
            tr.projector.generate_sketch_matrix(tr.projector.generator_states[0])
        tr.start_scoring_checkpoint("queries", work.state_dict(), model_id=0, num_targets=nq)
        tr.score(batch=queries, num_samples=nq)
        scores = np.asarray(tr.finalize_scores("queries"), dtype=np.float64)  # [train, queries]
    root.handlers = handlers
    return scores


def _margins_task() -> Any:
    """traker's model output for seedlab's GPT on (x, y, mask): f = Σ_t log(p_t / (1 − p_t))."""
    from trak.modelout_functions import AbstractModelOutput

    def margins(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logp = F.log_softmax(logits.float(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
        return torch.where(mask, logp - torch.log(-torch.expm1(logp)), 0.0).sum(-1)  # log(p/(1−p)), stable

    class Margins(AbstractModelOutput):
        def __init__(self) -> None:
            super().__init__()

        def get_output(self, model, weights, buffers, x, y, mask) -> torch.Tensor:
            if weights is None:  # traker's IterativeGradientComputer: the batch at once
                return margins(model(x)[0], y, mask)
            logits, _ = torch.func.functional_call(model, (weights, buffers), (x.unsqueeze(0),))
            return margins(logits, y.unsqueeze(0), mask.unsqueeze(0)).sum()

        def get_out_to_loss_grad(self, model, weights, buffers, batch) -> torch.Tensor:
            x, y, mask = batch
            with torch.no_grad():
                p = torch.softmax(model(x)[0].float(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
            return (torch.where(mask, 1 - p, 0.0).sum(-1) / mask.sum(-1)).unsqueeze(-1)

    return Margins()


@contextlib.contextmanager
def _no_tqdm():
    """traker's progress bars off (its module's ``tqdm``, replaced for the while)."""
    import trak.traker

    before = trak.traker.tqdm
    trak.traker.tqdm = lambda it, *args, **kwargs: it
    try:
        yield
    finally:
        trak.traker.tqdm = before
