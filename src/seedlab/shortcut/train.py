"""Train one ensemble: config -> data -> members trained together -> outcomes and curves.

The loop, per epoch: one optimizer step per batch (the whole training split when
``batch_size`` is null), then whichever of three callbacks is due: the evaluation (every
``eval_every`` epochs and at the end: accuracy and mean loss on train/val/adv for every
member), the gradient measurement (``train.gradients``) and the checkpoint (at
``checkpoint_epochs``). Epoch 0 is the initial weights, before any step. A member
*generalizes* when its adversarial accuracy is exactly 100% and its validation accuracy at least
``phases.VAL_LEVEL`` (99%, where the shortcut counts as learned) at one evaluation (or at a
``train.adv_every`` check between them, which evaluates the validation split whenever a member's
adversarial accuracy is 100%): the rule solves both splits, while a shortcut solves only one —
the validation split (all consistent) for the shortcut, and the adversarial split (all
anti-shortcut) for the *inverted* shortcut that a training split with r < 0.5 rewards.
``gen_epoch`` is the first such epoch and ``retained`` says whether adversarial accuracy is still
100% at the last evaluation.

The **adv prefix** of one evaluation is the number of leading adversarial rows that are all
correct (the index of the first wrong row; n_adv when none is wrong); ``adv_prefix_max`` is its
maximum over the evaluations and checks. The adversarial split's first m rows are a uniform
sample of it, so a member would have generalized on an adversarial split of those m rows iff
``adv_prefix_max >= m`` (the report's rate against the split's size), and ``generalized`` iff
``adv_prefix_max == n_adv``.

With ``train.gradients`` on, the gradient log writes ``gradients.parquet`` (one row per member
and measurement) and ``gradients_heads.parquet`` (the conflict restricted to each attention
head's parameters, one row per member, measurement, layer and head): see
:mod:`seedlab.shortcut.gradients`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from seedlab.machine import environment
from seedlab.precision import warn_precision
from seedlab.progress import Bar
from seedlab.shortcut.config import EnsembleConfig, GradientsConfig, Member
from seedlab.shortcut.gradients import measure as measure_gradients
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.optim import EnsembleAdamW
from seedlab.shortcut.phases import VAL_LEVEL, phases
from seedlab.shortcut.rundir import RunDir
from seedlab.shortcut.tasks import SPLITS, Split, check_feasible, get_task, make_splits
from seedlab.store import content_hash, write_json, write_parquet, write_yaml


def check_members(cfg: EnsembleConfig, members: list[Member]) -> None:
    """Every member's data can be built (fails early, before anything is written)."""
    d = cfg.data
    for m in members:
        check_feasible(get_task(m.task), m.ratio, d.n_train, d.n_val, d.n_adv, d.length, d.vocab)


def member_data(cfg: EnsembleConfig, members: list[Member]) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Stack each member's splits: split -> (x [S, n, length], y [S, n], consistent [S, n]).

    Splits shared by several members (same task and ratio) are built once.
    """
    d = cfg.data
    cache: dict[tuple[str, float], dict[str, Split]] = {}
    for m in members:
        if (m.task, m.ratio) not in cache:
            cache[(m.task, m.ratio)] = make_splits(
                m.task, m.ratio, d.n_train, n_val=d.n_val, n_adv=d.n_adv, length=d.length, vocab=d.vocab, seed=d.data_seed
            )
    out = {}
    for s in SPLITS:
        x = np.stack([cache[(m.task, m.ratio)][s].x for m in members])
        y = np.stack([cache[(m.task, m.ratio)][s].y for m in members])
        c = np.stack([cache[(m.task, m.ratio)][s].consistent for m in members])
        out[s] = (torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(c))
    return out


#: what ``generalized`` means in this code (recorded in each job's meta.json: jobs trained before
#: 2026-12-01 counted adversarial accuracy alone, which the inverted shortcut of r < 0.5 also reaches)
GENERALIZED = f"adversarial accuracy exactly 100% and validation accuracy >= {VAL_LEVEL:.0%} at one evaluation or adv_every check"


@dataclass
class Outcome:
    generalized: bool = False
    gen_epoch: int | None = None
    peak_adv_acc: float = 0.0
    adv_prefix_max: int = 0  # the most leading adversarial rows all correct at one evaluation or check
    final: dict[str, float] = field(default_factory=dict)  # last evaluation: {split}_acc, {split}_loss
    final_epoch: int = 0

    def update(self, epoch: int, metrics: dict[str, float], adv_prefix: int) -> None:
        """Fold one evaluation in: generalization is adversarial accuracy exactly 100% with validation >= VAL_LEVEL."""
        self.see_adv(epoch, metrics["adv_acc"], adv_prefix, metrics["val_acc"])
        self.final, self.final_epoch = dict(metrics), epoch

    def see_adv(self, epoch: int, adv: float, adv_prefix: int, val: float) -> None:
        self.peak_adv_acc = max(self.peak_adv_acc, adv)
        self.adv_prefix_max = max(self.adv_prefix_max, adv_prefix)
        if adv == 1.0 and val >= VAL_LEVEL and not self.generalized:
            self.generalized, self.gen_epoch = True, epoch

    @property
    def retained(self) -> bool:
        return self.generalized and self.final.get("adv_acc") == 1.0


@dataclass
class Result:
    members: list[Member]
    summary: pd.DataFrame
    curves: pd.DataFrame
    gradients: pd.DataFrame | None
    seconds: float
    epochs_run: int
    gradients_heads: pd.DataFrame | None = None


def _batch_orders(members: list[Member], n: int, epoch: int) -> torch.Tensor:
    """Each member's own shuffle for this epoch, from its seed alone: [S, n]."""
    return torch.stack(
        [torch.randperm(n, generator=torch.Generator().manual_seed(hash_seed(m.seed, epoch))) for m in members]
    )


def hash_seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> 1)


@torch.no_grad()
def evaluate(
    model: EnsembleTransformer, x: torch.Tensor, y: torch.Tensor, chunk: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-member accuracy, mean loss and prefix (:func:`leading_correct`) on one split."""
    n = x.shape[1]
    loss = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    correct = []
    for i in range(0, n, chunk):
        ce, c = model.row_losses(x[:, i : i + chunk], y[:, i : i + chunk])
        loss += ce.sum(1).double()
        correct.append(c)
    rows = torch.cat(correct, 1)
    return (rows.sum(1).double() / n).cpu().numpy(), (loss / n).cpu().numpy(), leading_correct(rows).cpu().numpy()


def leading_correct(correct: torch.Tensor) -> torch.Tensor:
    """The number of leading rows all correct (the first wrong row's index; n when none is): [S, n] bool -> [S]."""
    return correct.long().cumprod(1).sum(1)


def train_epoch(
    model: EnsembleTransformer,
    opt: EnsembleAdamW,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    chunk: int,
    order: torch.Tensor | None = None,
    precision: str = "fp32",
) -> None:
    """One pass over the training split: a step per batch, each batch in ``chunk``-row pieces.

    ``order`` ([S, n], each member's own shuffle) is needed for mini-batches; full batch ignores it.
    ``precision`` "bf16": the forward's matmuls and attention in bfloat16 (:class:`Bf16Step`); the
    loss, the residual stream, the layer norms and the gradients' accumulation stay fp32.
    """
    n = x.shape[1]
    for b0 in range(0, n, batch_size):
        opt.zero_grad()
        rows = min(batch_size, n - b0)
        bf16 = Bf16Step(model) if precision == "bf16" else None
        for c0 in range(b0, b0 + rows, chunk):
            c1 = min(c0 + chunk, b0 + rows)
            if order is None:
                xb, yb = x[:, c0:c1], y[:, c0:c1]
            else:
                idx = order[:, c0:c1]
                xb = torch.gather(x, 1, idx.unsqueeze(-1).expand(-1, -1, x.shape[2]))
                yb = torch.gather(y, 1, idx)
            # members' losses are independent: the sum's gradient is each member's own
            if bf16 is None:
                loss, _ = model.losses(xb, yb)
                (loss.sum() / rows).backward()
            else:
                bf16.backward(xb, yb, rows)
        if bf16 is not None:
            bf16.finish()
        opt.step()


class Bf16Step:
    """One optimizer step's bf16 forward and backward, its weights cast once.

    The model's :meth:`~EnsembleTransformer.folded_weights` (fp32, with the graph to the
    parameters) are cast to bfloat16 once (the embeddings stay fp32: the residual stream is
    fp32); each piece of the batch runs :meth:`~EnsembleTransformer.forward_folded` on the casts
    and adds its gradient with respect to them into fp32 sums (:meth:`backward`); :meth:`finish`
    carries the sums through the cast and the fold into the parameters' ``.grad``, once per step.
    autocast, by contrast, casts every weight again in every piece and every activation at
    every matmul (docs/benchmarks.md).
    """

    def __init__(self, model: EnsembleTransformer):
        self.model = model
        self.folded = model.folded_weights()
        keep = {"embed", "pos"}
        self.cast = {k: (v if k in keep else v.to(torch.bfloat16)).detach().requires_grad_() for k, v in self.folded.items()}
        self.grads: list[torch.Tensor] | None = None

    def backward(self, x: torch.Tensor, y: torch.Tensor, rows: int) -> None:
        """Add the gradient of this piece's summed loss / ``rows`` into the step's fp32 sums."""
        loss, _ = self.model.losses(x, y, self.cast)
        grads = torch.autograd.grad(loss.sum() / rows, list(self.cast.values()))
        if self.grads is None:
            self.grads = [g.float() for g in grads]
        else:
            for acc, g in zip(self.grads, grads, strict=True):
                acc.add_(g)

    def finish(self) -> None:
        """The summed gradients into the fp32 parameters' ``.grad`` (accumulated, as ``backward()`` does)."""
        torch.autograd.backward(list(self.folded.values()), self.grads)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to bfloat16 on ``device`` for "bf16" (CPU as CUDA), nothing for "fp32": what a
    plain loop adds for bf16, and how seedlab's bf16 forward ran before :class:`Bf16Step`."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def init_ensemble(
    cfg: EnsembleConfig, members: list[Member], device: torch.device
) -> tuple[EnsembleTransformer, EnsembleAdamW]:
    """The ensemble at its seed-determined initialization, and its AdamW with each member's lr and weight decay."""
    S, o = len(members), cfg.optim
    model = EnsembleTransformer(cfg.model, S, cfg.data.vocab, cfg.data.length, get_task(members[0].task).n_classes)
    model.init_members([m.seed for m in members])
    model.to(device)
    opt = EnsembleAdamW(
        model.parameters(),
        lr=[m.lr for m in members],
        weight_decay=[m.weight_decay for m in members],
        beta1=[o.beta1] * S,
        beta2=[o.beta2] * S,
        eps=[o.eps] * S,
    )
    return model, opt


def train_ensemble(
    cfg: EnsembleConfig,
    out: str | Path | None = None,
    *,
    members: list[Member] | None = None,
    progress: bool = True,
    on_eval: Callable[[int, dict[str, np.ndarray]], None] | None = None,
) -> Result:
    """Train every member of ``cfg`` (or the given ``members``) as one ensemble; with ``out``, write its run folder."""
    t0 = time.time()
    members = members if members is not None else cfg.expand()
    check_members(cfg, members)
    tc, S = cfg.train, len(members)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    warn_precision(tc.precision, tc.device)  # bf16: refused where it cannot run, a warning where emulated
    dev = torch.device(tc.device)
    data = {s: tuple(t.to(dev) for t in xyc) for s, xyc in member_data(cfg, members).items()}
    model, opt = init_ensemble(cfg, members, dev)

    xtr, ytr, _ = data["train"]
    n = xtr.shape[1]  # training samples per member
    bs = tc.batch_size or n  # samples per optimizer step
    rows = tc.chunk_rows()  # member-rows per piece on this device
    chunk = min(max(1, rows // S) if rows else bs, bs)  # samples per member in one forward piece
    run = None if out is None else RunDir(out).start()
    if run is not None:
        write_yaml(run.config_path, cfg.model_dump(mode="json"))
    evaluation = Evaluation(model, data, members, tc.eval_every, chunk=max(chunk, 1024), on_eval=on_eval)
    grad_log = GradientLog(model, data["train"], members, tc.gradients, chunk=max(chunk, 1024))
    checkpoints = Checkpoints(model, members, tc.checkpoint_epochs, run)

    bar = Bar("train", tc.epochs, "epochs", note=f"generalized 0/{S}", enabled=progress)
    with bar:
        for epoch in range(tc.epochs + 1):  # epoch 0: the initial weights, before any step
            if epoch > 0:
                order = _batch_orders(members, n, epoch).to(dev) if bs < n else None
                train_epoch(model, opt, xtr, ytr, batch_size=bs, chunk=chunk, order=order, precision=tc.precision)
            last = epoch == tc.epochs
            checked = evaluation.due(epoch, last)
            if checked:
                evaluation(epoch)
            elif tc.adv_every and epoch % tc.adv_every == 0:  # adversarial accuracy alone, in between
                evaluation.check_adv(epoch)
                checked = True
            # every member has generalized and train.stop_when_decided: stop now
            decided = checked and epoch > 0 and tc.stop_when_decided and evaluation.n_generalized == S
            if grad_log.due(epoch, last, decided):
                grad_log(epoch)
            if checkpoints.due(epoch, decided):
                checkpoints(epoch)
            if epoch > 0:
                bar.update(epoch, f"generalized {evaluation.n_generalized}/{S}")
            if decided:
                break

    curves = evaluation.curves()
    summary = summarize(members, evaluation.outcomes, cfg)
    ph = phases(curves, generalized=[i for i, oc in enumerate(evaluation.outcomes) if oc.generalized]).set_index("member")
    summary["shortcut_epoch"] = ph["shortcut_epoch"].reindex(summary["member"]).to_numpy()
    summary["phase2_epoch"] = ph["phase2_epoch"].reindex(summary["member"]).to_numpy()
    summary["adv_prefix_max"] = [oc.adv_prefix_max for oc in evaluation.outcomes]  # after the columns tools read
    grads, grads_heads = grad_log.tables()
    seconds = time.time() - t0
    if run is not None:
        write_parquet(run.curves_path, curves)
        if grads is not None:
            write_parquet(run.gradients_path, grads)
            write_parquet(run.gradients_heads_path, grads_heads)
        write_parquet(run.summary_path, summary)
        write_json(
            run.meta_path,
            {"config_hash": content_hash(cfg), "epochs_run": epoch, "seconds": round(seconds, 3), "members": S,
             "generalized": GENERALIZED, "environment": environment(dev, tc.precision)},
        )  # a member's outcome is a chaotic trajectory: a rerun on another CPU, torch or thread count is another draw
    return Result(members, summary, curves, grads, seconds, epoch, grads_heads)


# --------------------------------------------------------------------------- callbacks of the loop
class Evaluation:
    """Every ``every`` epochs and at the end: each member's accuracy and mean loss on train/val/adv,
    folded into its :class:`Outcome` (with the adv prefix) and into the curves."""

    def __init__(
        self,
        model: EnsembleTransformer,
        data: dict[str, tuple[torch.Tensor, ...]],
        members: list[Member],
        every: int,
        *,
        chunk: int,
        on_eval: Callable[[int, dict[str, np.ndarray]], None] | None = None,
    ):
        self.model, self.data, self.every, self.chunk, self.on_eval = model, data, every, chunk, on_eval
        self.outcomes = [Outcome() for _ in members]
        self.rows: list[tuple[int, int, str, float, float]] = []  # member, epoch, split, acc, loss

    def due(self, epoch: int, last: bool) -> bool:
        return epoch % self.every == 0 or last

    def __call__(self, epoch: int) -> None:
        metrics, prefix = {}, {}
        for s in SPLITS:
            acc, loss, prefix[s] = evaluate(self.model, *self.data[s][:2], chunk=self.chunk)
            metrics[f"{s}_acc"], metrics[f"{s}_loss"] = acc, loss
            self.rows.extend((i, epoch, s, float(acc[i]), float(loss[i])) for i in range(len(self.outcomes)))
        for i, oc in enumerate(self.outcomes):
            oc.update(epoch, {k: float(v[i]) for k, v in metrics.items()}, int(prefix["adv"][i]))
        if self.on_eval is not None:
            self.on_eval(epoch, metrics)

    def check_adv(self, epoch: int) -> None:
        """Adversarial accuracy (``train.adv_every``), and validation accuracy when a member not yet
        generalized is at 100% on it: such a member with validation >= VAL_LEVEL has generalized at this epoch.
        The curves and the last evaluation are left as they are (the checks only read the weights)."""
        acc, _, prefix = evaluate(self.model, *self.data["adv"][:2], chunk=self.chunk)
        new = [not oc.generalized and a == 1.0 for oc, a in zip(self.outcomes, acc)]
        val = evaluate(self.model, *self.data["val"][:2], chunk=self.chunk)[0] if any(new) else np.zeros(len(acc))
        for i, oc in enumerate(self.outcomes):
            oc.see_adv(epoch, float(acc[i]), int(prefix[i]), float(val[i]))

    @property
    def n_generalized(self) -> int:
        return sum(oc.generalized for oc in self.outcomes)

    def curves(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=["member", "epoch", "split", "acc", "loss"])


class GradientLog:
    """Gradient conflict and amplification (:mod:`seedlab.shortcut.gradients`) on the training split,
    overall and per attention head, every ``cfg.every`` epochs, at the end and at an early stop, when
    ``cfg.enabled``."""

    def __init__(self, model: EnsembleTransformer, train: tuple[torch.Tensor, ...], members: list[Member],
                 cfg: GradientsConfig, *, chunk: int):
        self.model, self.train, self.cfg, self.chunk = model, train, cfg, chunk
        self.ratios = [m.ratio for m in members]
        self.classes = [get_task(m.task).n_classes for m in members]
        self.frames: list[pd.DataFrame] = []

    def due(self, epoch: int, last: bool, decided: bool) -> bool:
        return self.cfg.enabled and (epoch % self.cfg.every == 0 or last or decided)

    def __call__(self, epoch: int) -> None:
        x, y, consistent = self.train
        self.frames.append(measure_gradients(
            self.model, x, y, consistent, self.ratios, epoch, chunk=self.chunk, sample=self.cfg.sample, seed=epoch,
            classes=self.classes,
        ))

    def tables(self) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
        """(gradients, gradients_heads): every measurement's two tables, or (None, None) when none was taken."""
        if not self.frames:
            return None, None
        return tuple(pd.concat(list(t), ignore_index=True) for t in zip(*self.frames, strict=True))


class Checkpoints:
    """Every member's weights at the ``epochs`` asked for (and at an early stop, when any were asked
    for), into the run folder's checkpoints with their SHA-256 in its manifest."""

    def __init__(self, model: EnsembleTransformer, members: list[Member], epochs: list[int], run: RunDir | None):
        self.model, self.epochs, self.run = model, epochs, run
        self.members = json.dumps([asdict(m) for m in members])

    def due(self, epoch: int, decided: bool) -> bool:
        return self.run is not None and (epoch in self.epochs or (decided and bool(self.epochs)))

    def __call__(self, epoch: int) -> None:
        self.run.save_checkpoint(epoch, self.model.state_dict(), {"epoch": str(epoch), "members": self.members})


def summarize(members: list[Member], outcomes: list[Outcome], cfg: EnsembleConfig) -> pd.DataFrame:
    """One row per member: the columns other tools read first (task .. retained), then the extras."""
    rows = []
    for i, (m, oc) in enumerate(zip(members, outcomes, strict=True)):
        rows.append(
            {
                "member": i,
                "task": m.task,
                "ratio": m.ratio,
                "layers": cfg.model.layers,
                "heads": cfg.model.heads,
                "weight_decay": m.weight_decay,
                "seed": m.seed,
                "generalized": oc.generalized,
                "gen_epoch": oc.gen_epoch,
                "final_val_acc": oc.final["val_acc"],
                "final_adv_acc": oc.final["adv_acc"],
                "retained": oc.retained,
                "lr": m.lr,
                "final_train_acc": oc.final["train_acc"],
                "final_train_loss": oc.final["train_loss"],
                "peak_adv_acc": oc.peak_adv_acc,
                "final_epoch": oc.final_epoch,
            }
        )
    df = pd.DataFrame(rows)
    df["gen_epoch"] = df["gen_epoch"].astype("Int64")
    return df
