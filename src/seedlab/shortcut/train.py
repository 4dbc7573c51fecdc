"""Train one ensemble: config -> data -> members trained together -> outcomes and curves.

The loop, per epoch: one optimizer step per batch (the whole training split when
``batch_size`` is null); every ``eval_every`` epochs, accuracy and mean loss on
train/val/adv for every member. A member *generalizes* when its adversarial accuracy
is exactly 100% at some evaluation; ``gen_epoch`` is the first such epoch and
``retained`` says whether it is still 100% at the last evaluation.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from seedlab.progress import Bar
from seedlab.shortcut.config import EnsembleConfig, Member
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.optim import EnsembleAdamW
from seedlab.shortcut.phases import phases
from seedlab.shortcut.tasks import Split, check_feasible, get_task, make_splits
from seedlab.store import content_hash, write_json, write_parquet, write_safetensors, write_yaml

SPLITS = ("train", "val", "adv")


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


@dataclass
class Outcome:
    generalized: bool = False
    gen_epoch: int | None = None
    peak_adv_acc: float = 0.0
    final: dict[str, float] = field(default_factory=dict)  # last evaluation: {split}_acc, {split}_loss
    final_epoch: int = 0

    def update(self, epoch: int, metrics: dict[str, float]) -> None:
        """Fold one evaluation in: generalization is adversarial accuracy of exactly 100%."""
        adv = metrics["adv_acc"]
        self.peak_adv_acc = max(self.peak_adv_acc, adv)
        if adv == 1.0 and not self.generalized:
            self.generalized, self.gen_epoch = True, epoch
        self.final, self.final_epoch = dict(metrics), epoch

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


def _batch_orders(members: list[Member], n: int, epoch: int) -> torch.Tensor:
    """Each member's own shuffle for this epoch, from its seed alone: [S, n]."""
    return torch.stack(
        [torch.randperm(n, generator=torch.Generator().manual_seed(hash_seed(m.seed, epoch))) for m in members]
    )


def hash_seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> 1)


@torch.no_grad()
def evaluate(model: EnsembleTransformer, x: torch.Tensor, y: torch.Tensor, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-member (accuracy, mean loss) on one split."""
    n = x.shape[1]
    loss = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    correct = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    for i in range(0, n, chunk):
        l, c = model.losses(x[:, i : i + chunk], y[:, i : i + chunk])
        loss += l.double()
        correct += c
    return (correct.double() / n).cpu().numpy(), (loss / n).cpu().numpy()


def train_epoch(
    model: EnsembleTransformer,
    opt: EnsembleAdamW,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int,
    chunk: int,
    order: torch.Tensor | None = None,
) -> None:
    """One pass over the training split: a step per batch, each batch in ``chunk``-row pieces.

    ``order`` ([S, n], each member's own shuffle) is needed for mini-batches; full batch ignores it.
    """
    n = x.shape[1]
    for b0 in range(0, n, batch_size):
        opt.zero_grad()
        rows = min(batch_size, n - b0)
        for c0 in range(b0, b0 + rows, chunk):
            c1 = min(c0 + chunk, b0 + rows)
            if order is None:
                xb, yb = x[:, c0:c1], y[:, c0:c1]
            else:
                idx = order[:, c0:c1]
                xb = torch.gather(x, 1, idx.unsqueeze(-1).expand(-1, -1, x.shape[2]))
                yb = torch.gather(y, 1, idx)
            loss, _ = model.losses(xb, yb)
            # members' losses are independent: the sum's gradient is each member's own
            (loss.sum() / rows).backward()
        opt.step()


def train_ensemble(
    cfg: EnsembleConfig,
    out: str | Path | None = None,
    *,
    members: list[Member] | None = None,
    progress: bool = True,
    on_eval: Callable[[int, dict[str, np.ndarray]], None] | None = None,
) -> Result:
    """Train every member of ``cfg`` (or the given ``members``) as one ensemble."""
    t0 = time.time()
    members = members if members is not None else cfg.expand()
    check_members(cfg, members)
    tc, S = cfg.train, len(members)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    dev = torch.device(tc.device)
    data = {s: tuple(t.to(dev) for t in xyc) for s, xyc in member_data(cfg, members).items()}
    n_classes = get_task(members[0].task).n_classes

    model = EnsembleTransformer(cfg.model, S, cfg.data.vocab, cfg.data.length, n_classes)
    model.init_members([m.seed for m in members])
    model.to(dev)
    o = cfg.optim
    opt = EnsembleAdamW(
        model.parameters(),
        lr=[m.lr for m in members],
        weight_decay=[m.weight_decay for m in members],
        beta1=[o.beta1] * S,
        beta2=[o.beta2] * S,
        eps=[o.eps] * S,
    )

    xtr, ytr, ctr = data["train"]
    n = xtr.shape[1]
    bs = tc.batch_size or n
    chunk = min(max(1, tc.chunk // S) if tc.chunk else bs, bs)  # rows per member per piece
    outcomes = [Outcome() for _ in members]
    rows: list[tuple[int, int, str, float, float]] = []
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_yaml(out / "config.yaml", cfg.model_dump(mode="json"))

    def do_eval(epoch: int) -> None:
        metrics = {}
        for s in SPLITS:
            acc, loss = evaluate(model, *data[s][:2], chunk=max(chunk, 1024))
            metrics[f"{s}_acc"], metrics[f"{s}_loss"] = acc, loss
            rows.extend((i, epoch, s, float(acc[i]), float(loss[i])) for i in range(S))
        for i, oc in enumerate(outcomes):
            oc.update(epoch, {k: float(v[i]) for k, v in metrics.items()})
        if on_eval is not None:
            on_eval(epoch, metrics)

    def save_checkpoint(epoch: int) -> None:
        if out is None:
            return
        meta = {"epoch": str(epoch), "members": json.dumps([asdict(m) for m in members])}
        write_safetensors(out / "checkpoints" / f"epoch-{epoch:06d}.safetensors", model.state_dict(), meta)

    gc = tc.gradients
    grad_frames: list[pd.DataFrame] = []

    def measure_gradients(epoch: int) -> None:
        from seedlab.shortcut import gradients

        df = gradients.measure(
            model, xtr, ytr, ctr, [m.ratio for m in members], epoch, chunk=max(chunk, 1024), sample=gc.sample, seed=epoch
        )
        grad_frames.append(df)

    bar = Bar("train", tc.epochs, "epochs", note=f"generalized 0/{S}", enabled=progress)
    do_eval(0)
    if gc.enabled:
        measure_gradients(0)
    if 0 in tc.checkpoint_epochs:
        save_checkpoint(0)
    epoch = 0
    with bar:
        for epoch in range(1, tc.epochs + 1):
            order = _batch_orders(members, n, epoch).to(dev) if bs < n else None
            train_epoch(model, opt, xtr, ytr, batch_size=bs, chunk=chunk, order=order)
            last = epoch == tc.epochs
            decided = False
            if epoch % tc.eval_every == 0 or last:
                do_eval(epoch)
                decided = tc.stop_when_decided and all(oc.generalized for oc in outcomes)
            if gc.enabled and (epoch % gc.every == 0 or last or decided):
                measure_gradients(epoch)
            # an early stop also keeps the final weights when any checkpoints were asked for
            if epoch in tc.checkpoint_epochs or (decided and tc.checkpoint_epochs):
                save_checkpoint(epoch)
            bar.update(epoch, f"generalized {sum(oc.generalized for oc in outcomes)}/{S}")
            if decided:
                break

    curves = pd.DataFrame(rows, columns=["member", "epoch", "split", "acc", "loss"])
    summary = summarize(members, outcomes, cfg)
    ph = phases(curves).set_index("member")
    summary["shortcut_epoch"] = ph["shortcut_epoch"].reindex(summary["member"]).to_numpy()
    summary["phase2_epoch"] = ph["phase2_epoch"].reindex(summary["member"]).to_numpy()
    seconds = time.time() - t0
    if out is not None:
        write_parquet(out / "curves.parquet", curves)
        if grad_frames:
            write_parquet(out / "gradients.parquet", pd.concat(grad_frames, ignore_index=True))
        write_parquet(out / "summary.parquet", summary)
        write_json(
            out / "meta.json",
            {"config_hash": content_hash(cfg), "epochs_run": epoch, "seconds": round(seconds, 3), "members": S},
        )
    grads = pd.concat(grad_frames, ignore_index=True) if grad_frames else None
    return Result(members, summary, curves, grads, seconds, epoch)


def summarize(members: list[Member], outcomes: list[Outcome], cfg: EnsembleConfig) -> pd.DataFrame:
    """One row per member: the DESIGN contract's columns first, then the extras."""
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
