"""A bank (or an exported benchmark) as a dattri ``AttributionTask``, on which dattri's TracIn runs unchanged.

dattri (TRAIS-Lab, ``pip install 'seedlab[dattri]'``; 0.3.0 checked) scores train samples against test samples
through one object, ``dattri.task.AttributionTask(loss_func, model, checkpoints, target_func,
checkpoints_load_func)``, with ``loss_func(params, data)`` / ``target_func(params, data)`` in ``torch.func``
style (``params`` a ``{name: tensor}`` mapping, ``data`` one sample: dattri vmaps them over a batch), and
``attributor.attribute(train_loader, test_loader)`` returning a tensor [n_train, n_test] (positive: training on
the sample lowers the test target). :func:`task` builds, for one seed of a bank or an export:

- **model**: the bank's GPT (its config, the checkpoint's dtype), in eval mode;
- **checkpoints**: the twin's saved weights — by default θ_s alone (``steps="injection"``: the weights the
  candidate's one visit saw); ``steps="checkpoints"``: every saved step before the last horizon (TracIn-CP's,
  attribute.py ``tracin_steps``); or a list — each loaded through ``checkpoints_load_func`` from its
  safetensors file with every tensor checked against the twin's manifest (never ``torch.load``);
- **train data**: the bank's candidates as training samples — row ``injection_row`` of the batch of s with
  the candidate injected (its passage, then padding the loss masks; lm/batches.py ``inject``) — and last
  the replaced row itself, each a tuple ``(x, y, mask)`` [T];
- **loss_func**: a row's masked next-token cross-entropy *sum* (nats), as the trainer sums it
  (lm/model.py ``masked_ce_sum``; the trainer divides the batch's sum by N = B·T);
- **test data** / **target_func**: every query of the case (the candidates' own texts first when
  ``queries.own``, then the query rows and probes), right-padded to T and masked, scored by its mean
  cross-entropy (nats/token: L_query, measures/text.py ``text_ce``; causal attention makes the padding inert).

The bank measures a *swap* (candidate c in place of row r), so a train-sample score becomes a predicted
ΔL_query as :meth:`BankTask.estimate` does: −(score(c) − score(r)) (the sign of ΔL: learning c lowers the
loss). With TracIn's weights lr_t / N (:meth:`BankTask.tracin_weights`) and no projection
(``projector_kwargs={"proj_type": "identity"}``), dattri's ``TracInAttributor`` on θ_s is the bank's ``tracin``
estimator, and over ``steps="checkpoints"`` its ``tracin-cp`` at the last horizon (float32 against float64:
tests/attribution/test_export.py).

What runs on the task, and what does not: ``TracInAttributor`` (at θ_s and over the checkpoints) and Grad-Dot
through it (:func:`grad_dot`) are tested. dattri's influence-function attributors (``IFAttributorExplicit``,
``IFAttributorCG``, ``IFAttributorLiSSA``, ``IFAttributorArnoldi``, ``IFAttributorDataInf``,
``IFAttributorEKFAC``) raise inside :func:`row_loss`: the explicit, CG and Arnoldi ones hand
``loss_func`` a whole batch of rows, where this loss takes one row (the sample TracIn vmaps over), and their
curvature would be fitted on the candidates and the replaced row alone. The others (TRAK, LoGra, RPS, ...) have not
been tried; scoring every dattri attributor on the run's own rows is not built yet.

Plug-ins (``--estimator seedlab.attribution.dattri_adapter:tracin`` to ``seedlab attribution attribute`` or
``score``): :func:`tracin` (dattri's TracIn at θ_s in nats/token) and :func:`grad_dot` (its Grad-Dot, a score).

A bank or export without the checkpoints asked for (a prefix, or a twin step missing, or one whose hashes no
longer match) is a one-line error before dattri is called; so is dattri not being installed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from seedlab.attribution.estimators.plugins import declare
from seedlab.errors import SeedlabError

if TYPE_CHECKING:
    from seedlab.attribution.estimators.builtin import Case
    from seedlab.attribution.estimators.plugins import Context, SharedGradients
    from seedlab.lm.model import GPT

HINT = "pip install 'seedlab[dattri]' (dattri keeps the pinned torch; see pyproject.toml)"


def _dattri():
    try:
        from dattri.task import AttributionTask
    except ImportError as e:
        raise SeedlabError(f"dattri is not installed ({HINT}): {e}") from None
    return AttributionTask


def row_loss(model: torch.nn.Module) -> Callable:
    """dattri's ``loss_func``: ``(params, (x, y, mask))`` -> the row's masked CE sum (x, y, mask [T] one sample)."""
    from seedlab.lm.model import masked_ce_sum

    def loss(params: Mapping[str, torch.Tensor], data: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, y, mask = data
        logits, _ = torch.func.functional_call(model, dict(params), (x.unsqueeze(0),))
        return masked_ce_sum(logits, y.unsqueeze(0), mask.unsqueeze(0))

    return loss


def query_target(model: torch.nn.Module) -> Callable:
    """dattri's ``target_func``: ``(params, (x, y, mask))`` -> the query's mean CE over its targets (nats/token)."""
    from seedlab.lm.model import masked_ce_sum

    def target(params: Mapping[str, torch.Tensor], data: tuple[torch.Tensor, ...]) -> torch.Tensor:
        x, y, mask = data
        logits, _ = torch.func.functional_call(model, dict(params), (x.unsqueeze(0),))
        return masked_ce_sum(logits, y.unsqueeze(0), mask.unsqueeze(0)) / mask.sum()

    return target


def train_rows(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, mask) [C + 1, T]: every candidate injected in the case's row, then the replaced row itself."""
    rows = [case.candidate_row(n) for n in case.candidates] + [case.ordinary_row()]
    return tuple(torch.cat([r[i] for r in rows]) for i in range(3))  # type: ignore[return-value]


def test_rows(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, mask) [Q, T]: every query of the case, right-padded with the pad id to T and masked."""
    T = case.x.shape[1]
    x = torch.full((len(case.queries), T), case.pad_id, dtype=torch.int64)
    y, mask = x.clone(), torch.zeros(len(case.queries), T, dtype=torch.bool)
    for i, ids in enumerate(case.queries.values()):
        n = len(ids) - 1
        t = torch.as_tensor(ids, dtype=torch.int64)
        x[i, :n], y[i, :n], mask[i, :n] = t[:-1], t[1:], True
    return x, y, mask


@dataclass
class BankTask:
    """One seed's case as dattri sees it (module doc): the task, its data and how to read its scores."""

    task: Any  # dattri.task.AttributionTask
    train: torch.utils.data.TensorDataset  # (x, y, mask): the candidates, then the replaced row
    test: torch.utils.data.TensorDataset  # (x, y, mask): the queries
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


def case_task(model: GPT, case: Case, checkpoints: Sequence[Any], *, load: Callable | None = None,
              steps: Sequence[int | None] | None = None, lrs: Sequence[float | None] | None = None,
              seed: int | None = None) -> BankTask:
    """The dattri task of ``case`` on ``model``'s architecture with ``checkpoints`` (state dicts, or anything
    ``load(model, checkpoint)`` turns into a loaded model: dattri's ``checkpoints_load_func``)."""
    AttributionTask = _dattri()
    from torch.utils.data import TensorDataset

    model = copy.deepcopy(model).eval()

    def load_state(m: torch.nn.Module, ckpt: Any) -> torch.nn.Module:
        m.load_state_dict(ckpt)
        return m.eval()

    t = AttributionTask(loss_func=row_loss(model), model=model, checkpoints=list(checkpoints),
                        target_func=query_target(model), checkpoints_load_func=load or load_state)
    n = len(checkpoints)
    return BankTask(t, TensorDataset(*train_rows(case)), TensorDataset(*test_rows(case)), list(case.candidates),
                    list(case.queries), list(steps) if steps is not None else [None] * n,
                    list(lrs) if lrs is not None else [None] * n, case.n_targets, seed, case)


def task(root: str | Path, seed: int, *, steps: str | Sequence[int] = "injection") -> BankTask:
    """The dattri task of one seed of a bank folder or an exported benchmark (verified first; module doc)."""
    from seedlab.attribution.estimators.attribute import tracin_steps
    from seedlab.attribution.benchmark import bank_case, open_scorable
    from seedlab.lm.model import GPT
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


# --------------------------------------------------------------------------- plug-ins


#: no projection: dattri's TracIn then takes exact inner products of the per-sample gradients
IDENTITY = {"proj_type": "identity"}


def tracin_scores(bt: BankTask, weights: torch.Tensor, *, batch_size: int = 16) -> torch.Tensor:
    """dattri's ``TracInAttributor`` on ``bt`` with ``weights`` per checkpoint and no projection: its [C + 1, Q]
    scores. (dattri 0.3 updates its module-level default projector settings in place with the ones given;
    they are restored afterwards, so other dattri users in the process keep theirs.)"""
    from dattri.algorithm import tracin as module

    saved = dict(module.DEFAULT_PROJECTOR_KWARGS)
    try:
        att = module.TracInAttributor(bt.task, weight_list=weights, normalized_grad=False,
                                      projector_kwargs=dict(IDENTITY))
        return att.attribute(*bt.loaders(batch_size))
    finally:
        module.DEFAULT_PROJECTOR_KWARGS.clear()
        module.DEFAULT_PROJECTOR_KWARGS.update(saved)


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
