"""Every circuit measure of every checkpoint of a run or sweep folder -> ``circuits.parquet`` and ``patching.parquet``.

``circuits.parquet``: one row per (member, epoch, layer, head): head 0..H-1 are the attention
heads, head = -1 is the layer's MLP. Columns (:data:`COLUMNS`):

- fingerprints (:mod:`seedlab.shortcut.fingerprints`, nan on MLP rows except the probes):
  ``qk_rho_value``, ``attn_pos0`` (activation-based QK, on the data), ``qk_w_rho_value``,
  ``qk_w_pos0`` (weight-based QK: the readout query against every value's key),
  ``ov_rho_residue`` (OV: each single token's own residue, on the direct path to the
  unembedding; not the sum's residue), ``probe_sum``, ``probe_shortcut`` (cross-validated
  linear-probe accuracy of the sum residue / the shortcut residue from the component's write at
  the readout; heads and MLPs), ``probe_rows`` (the rows each probe used: half val, half adv),
  ``probe_sum_chance`` / ``probe_shortcut_chance`` (the chance level of each probe: the best
  accuracy from the other residue alone, :func:`~seedlab.shortcut.fingerprints.best_from`;
  1/2 on these rows for binary and ternary tasks alike);
- ablations (:mod:`seedlab.shortcut.interventions`), accuracy changes (ablated - clean) on
  the split named: ``zero_ablation_*``, ``mean_ablation_*`` (whole component), and per head
  ``qk_uniform_ablation_*``, ``qk_mean_ablation_*`` (pattern -> uniform / its mean, OV kept),
  ``ov_mean_ablation_*`` (values -> their mean, pattern kept); nan on MLP rows;
- ``resample_val_into_adv`` / ``resample_adv_into_val``: row-paired patching of val row i
  into adv row i (and the reverse) as a fraction of the full difference of batch means
  (:func:`~seedlab.shortcut.interventions.patch`). The rows share neither label nor
  content, so this is a resample-ablation score, not counterfactual patching.

``patching.parquet``: matched-pair activation patching (:func:`~seedlab.shortcut.interventions.pair_patching`
on :func:`~seedlab.shortcut.pairs.make_pairs`), one row per (member, epoch, layer, head,
pairs, path, direction): ``pairs`` the kind of pairs (``same_label``: the shortcut feature
changes, the label stays; ``label_changing``: the shortcut token stays, the label changes),
``path`` what the patched activation reaches (``total``: everything; ``direct``: the
unembedding only; ``via_mlp``: the inputs of the MLPs that read it only),
``direction`` in ``clean_to_corrupt`` / ``corrupt_to_clean``, and the per-pair distribution
(:data:`PATCHING_COLUMNS`, defined in :meth:`~seedlab.shortcut.interventions.PairPatching.summary`).

Probe rows (:data:`PROBE_ROWS`): the probes' small-sample bias, estimated as the 10-fold
cross-validated accuracy on the whole space (all 32,736 sequences of the demo sweep, length 3,
vocab 32, d_model 64; half consistent, half anti) minus the mean 5-fold accuracy on 16 random
balanced draws of ``n`` rows, over every head and MLP of the 1L and 2L members at epochs 100 and
300. For components the probe reads (accuracy > 0.55) the mean bias was 0.03-0.11 points at
4096 rows (0.05-0.26 at 1024, the former count). The largest single-component gaps at 4096
rows (0.5 point in 1L, 2-3 in 2L) sat on weakly read components (accuracy 0.55-0.6) and, where
checked (2L, epoch 300), did not shrink at 8192 or 16384 rows: the whole-space reference is off
there (cross-validating on nearly all of a finite space pushes accuracy near chance down), not
the sample. A clearly read component (accuracy 0.81): 1.9 points at 1024 rows, 0.9 at 4096,
0.1 at 16384. Hence the probes use up to 4096 val+adv rows, half each
(``probe_rows`` says how many; fewer when the splits are smaller), not the ``n`` rows of the
other measures; no correction is applied.

Checkpoints are read through the run folder, every tensor checked against its recorded
SHA-256. Counterfactual pairs are held out: neither side is in any member's training split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from seedlab.config import load_yaml, parse
from seedlab.errors import SeedlabError
from seedlab.shortcut.config import EnsembleConfig, Member
from seedlab.shortcut.fingerprints import ov_fingerprint, probe_fingerprint, qk_fingerprint, qk_weight_fingerprint
from seedlab.shortcut.interventions import (
    MIN_GAP,
    PATH_ABLATIONS,
    PATHS,
    QUANTILES,
    ablate,
    cached_run,
    pair_patching,
    patch,
    path_ablate,
)
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.pairs import KINDS, check_pairs_feasible, make_pairs
from seedlab.shortcut.rundir import RunDir, SweepDir, open_folder
from seedlab.shortcut.sweep import finished_jobs
from seedlab.shortcut.tasks import get_task
from seedlab.shortcut.train import member_data
from seedlab.store import write_parquet

KEYS = ["member", "epoch", "layer", "head"]
#: the most val+adv rows (half each) the linear probes use: small-sample bias below 1 point (module docstring)
PROBE_ROWS = 4096
COLUMNS = [
    *KEYS,
    "qk_rho_value",
    "attn_pos0",
    "qk_w_rho_value",
    "qk_w_pos0",
    "ov_rho_residue",
    "probe_sum",
    "probe_shortcut",
    "probe_rows",
    "probe_sum_chance",
    "probe_shortcut_chance",
    "zero_ablation_val",
    "zero_ablation_adv",
    "mean_ablation_val",
    "mean_ablation_adv",
    "qk_uniform_ablation_val",
    "qk_uniform_ablation_adv",
    "qk_mean_ablation_val",
    "qk_mean_ablation_adv",
    "ov_mean_ablation_val",
    "ov_mean_ablation_adv",
    "resample_val_into_adv",
    "resample_adv_into_val",
]
PATCHING_COLUMNS = [
    *KEYS,
    "pairs",
    "path",
    "direction",
    "n_pairs",
    "n_small_gap",
    *(f"frac_q{round(100 * q):02d}" for q in QUANTILES),
    "frac_mean",
    "frac_ratio_of_means",
    "dld_q25",
    "dld_q50",
    "dld_q75",
    "gap_q50",
    "ld_clean_q50",
    "ld_corrupt_q50",
]


class Analyses(NamedTuple):
    circuits: pd.DataFrame  # COLUMNS
    patching: pd.DataFrame  # PATCHING_COLUMNS


def load_checkpoint(run: RunDir, cfg: EnsembleConfig, epoch: int) -> tuple[EnsembleTransformer, list[Member]]:
    """The ensemble saved at ``epoch`` (hash-checked), in eval mode, and its members."""
    state, meta = run.load_checkpoint(epoch)
    members = [Member(**m) for m in json.loads(meta["members"])] if "members" in meta else cfg.expand()
    n_classes = get_task(members[0].task).n_classes
    model = EnsembleTransformer(cfg.model, len(members), cfg.data.vocab, cfg.data.length, n_classes)
    model.load_state_dict(state)
    model.eval()
    return model, members


def check_analyzable(run: RunDir) -> tuple[EnsembleConfig, list[int]]:
    """The run's config and checkpoint epochs; a one-line error when it has no checkpoints or no pairs exist."""
    epochs = run.checkpoint_epochs()
    if not epochs:
        raise SeedlabError(f"{run.root}: no checkpoints (set train.checkpoint_epochs)")
    cfg = parse(EnsembleConfig, load_yaml(run.config_path))
    for task in sorted({m.task for m in cfg.expand()}):
        for kind in KINDS:
            check_pairs_feasible(task, cfg.data.length, cfg.data.vocab, kind)
    return cfg, epochs


def member_pairs(cfg: EnsembleConfig, members: list[Member], train_x: torch.Tensor, n: int,
                 kind: str = "same_label") -> dict[str, torch.Tensor]:
    """Each member's ``n`` counterfactual pairs of ``kind``, stacked: ``clean``, ``corrupt`` [S, n, length],
    ``y``, ``y_corrupt`` [S, n] (their labels).

    One set of pairs per task (from the data seed), none of whose sequences is in the
    training split of any member of that task (``train_x`` [S, n_train, length]).
    """
    d = cfg.data
    by_task = {}
    for task in sorted({m.task for m in members}):
        seen = np.concatenate([train_x[i].numpy() for i, m in enumerate(members) if m.task == task])
        by_task[task] = make_pairs(task, n, length=d.length, vocab=d.vocab, seed=d.data_seed, exclude=seen, kind=kind)
    stack = lambda f: torch.from_numpy(np.stack([getattr(by_task[m.task], f) for m in members]))
    return {f: stack(f) for f in ("clean", "corrupt", "y", "y_corrupt")}


def _long(arrays: dict[str, np.ndarray], epoch: int, H: int) -> pd.DataFrame:
    """{column: [S, layers, heads + 1]} -> one row per (member, layer, head); the MLP is head -1."""
    S, Ly, Hp = next(iter(arrays.values())).shape
    s_, l_, h_ = np.meshgrid(np.arange(S), np.arange(Ly), np.arange(Hp), indexing="ij")
    keys = {"member": s_.ravel(), "epoch": epoch, "layer": l_.ravel(), "head": np.where(h_ == H, -1, h_).ravel()}
    return pd.DataFrame({**keys, **{k: np.asarray(v, dtype=np.float64).ravel() for k, v in arrays.items()}})


def _with_mlp(per_head: np.ndarray) -> np.ndarray:
    """[S, layers, heads] -> [S, layers, heads + 1]: nan on the MLP rows, which have no such measure."""
    return np.concatenate([per_head, np.full((*per_head.shape[:2], 1), np.nan)], -1)


def measure_checkpoint(model: EnsembleTransformer, members: list[Member], data: dict, pairs: dict[str, dict], epoch: int,
                       rows: int, probe_rows: int = PROBE_ROWS) -> Analyses:
    """Every measure of one checkpoint on the first ``rows`` val/adv rows, the members' pairs of each kind
    (``pairs[kind]``, :func:`member_pairs`) and, for the probes, ``probe_rows`` val+adv rows (half each, at most)."""
    H = model.cfg.heads
    xv, yv = data["val"][0][:, :rows], data["val"][1][:, :rows]
    xa, ya = data["adv"][0][:, :rows], data["adv"][1][:, :rows]
    val_adv = lambda k: [torch.cat([data["val"][i][:, :k], data["adv"][i][:, :k]], 1) for i in (0, 1)]  # (x, y)
    both = val_adv(rows)[0]  # the label and the shortcut agree on val and disagree on adv
    half = min(probe_rows // 2, data["val"][0].shape[1], data["adv"][0].shape[1])
    xp, yp = val_adv(half)
    shortcut = torch.stack([torch.from_numpy(get_task(m.task).shortcut_feature(xp[i].numpy())) for i, m in enumerate(members)])
    qk = qk_fingerprint(model, both)
    qk_w = qk_weight_fingerprint(model)
    per_head = {
        "qk_rho_value": qk["qk_rho_value"],
        "attn_pos0": qk["attn_pos0"],
        "qk_w_rho_value": qk_w["qk_w_rho_value"],
        "qk_w_pos0": qk_w["qk_w_pos0"],
        "ov_rho_residue": ov_fingerprint(model, both, model.n_classes),
    }
    run = {"val": cached_run(model, xv), "adv": cached_run(model, xa)}  # the clean runs every measure shares
    for kind in PATH_ABLATIONS:
        per_head[f"{kind}_ablation_val"] = path_ablate(model, xv, yv, kind, run["val"])
        per_head[f"{kind}_ablation_adv"] = path_ablate(model, xa, ya, kind, run["adv"])
    cols = {k: _with_mlp(v) for k, v in per_head.items()}
    cols |= probe_fingerprint(model, xp, {"sum": yp, "shortcut": shortcut})
    cols["probe_rows"] = np.full_like(cols["probe_sum"], 2 * half)
    for kind in ("zero", "mean"):
        cols[f"{kind}_ablation_val"] = ablate(model, xv, yv, kind, run["val"])
        cols[f"{kind}_ablation_adv"] = ablate(model, xa, ya, kind, run["adv"])
    cols["resample_val_into_adv"] = patch(model, xv, xa, ya, src=run["val"], dst=run["adv"])
    cols["resample_adv_into_val"] = patch(model, xa, xv, yv, src=run["adv"], dst=run["val"])
    circuits = _long(cols, epoch, H)[COLUMNS].astype({"probe_rows": "int64"})
    patching = []
    for kind, p in pairs.items():
        runs = cached_run(model, p["clean"]), cached_run(model, p["corrupt"])  # shared by the three paths
        for path in PATHS:
            result = pair_patching(model, p["clean"], p["corrupt"], p["y"], *runs, y_corrupt=p["y_corrupt"], path=path)
            patching += [_long(stats, epoch, H).assign(pairs=kind, path=path, direction=d)
                         for d, stats in result.summary(MIN_GAP).items()]
    patching = pd.concat(patching, ignore_index=True).astype({"n_pairs": "int64", "n_small_gap": "int64"})
    return Analyses(circuits, patching[PATCHING_COLUMNS])


def analyze_run(run_dir: str | Path, n: int = 512, probe_rows: int = PROBE_ROWS) -> Analyses:
    """All circuit measures for every checkpoint of a run folder: (circuits, patching) DataFrames.

    Data: the first ``rows = min(n, n_val, n_adv)`` rows of each member's validation split
    (all shortcut-consistent) and adversarial split (all anti-shortcut), for the ablations
    and the resample scores; the val and adv rows together for the QK/OV fingerprints (where
    the sum residue and the shortcut residue disagree on half the rows); up to ``probe_rows``
    val+adv rows (half each) for the probes; ``rows`` counterfactual pairs of each kind per
    member for the matched-pair patching. A one-line
    :class:`SeedlabError` when the run has no checkpoints, or its tasks have no
    counterfactual pairs at its length/vocabulary.
    """
    run = RunDir(run_dir)
    cfg, epochs = check_analyzable(run)
    circuits, patching = [], []
    inputs: dict[str, tuple[dict, dict, int]] = {}  # the data and pairs of each member list (task, ratio per member)
    for epoch in epochs:
        model, members = load_checkpoint(run, cfg, epoch)
        key = json.dumps([(m.task, m.ratio) for m in members])
        if key not in inputs:
            data = member_data(cfg, members)
            rows = min(n, data["val"][0].shape[1], data["adv"][0].shape[1])
            pairs = {kind: member_pairs(cfg, members, data["train"][0], rows, kind) for kind in KINDS}
            inputs[key] = (data, pairs, rows)
        data, pairs, rows = inputs[key]
        c, p = measure_checkpoint(model, members, data, pairs, epoch, rows, probe_rows)
        circuits.append(c)
        patching.append(p)
    ints = dict.fromkeys(KEYS, "int64")
    return Analyses(pd.concat(circuits, ignore_index=True).astype(ints), pd.concat(patching, ignore_index=True).astype(ints))


def write_analyses(run_dir: str | Path, n: int = 512, probe_rows: int = PROBE_ROWS) -> dict[str, Path]:
    """:func:`analyze_run` written to the folder's ``circuits.parquet`` and ``patching.parquet``.

    A sweep folder is analyzed job by job (jobs with checkpoints), with the sweep's global
    member ids, as in its summary.parquet, and a ``job`` column first. Every job is checked
    before any is analyzed, and nothing is written unless every job succeeded.
    """
    folder = open_folder(run_dir)
    if not isinstance(folder, SweepDir):
        result = analyze_run(folder.root, n=n, probe_rows=probe_rows)
    else:
        jobs = [(key, run, offset) for key, run, offset in finished_jobs(folder) if run.checkpoint_epochs()]
        if not jobs:
            raise SeedlabError(f"{folder.root}: no checkpoints in any finished job (set train.checkpoint_epochs)")
        for _, run, _ in jobs:
            check_analyzable(run)
        parts = []
        for key, run, offset in jobs:
            res = analyze_run(run.root, n=n, probe_rows=probe_rows)
            for df in res:
                df["member"] += offset
                df.insert(0, "job", key)
            parts.append(res)
        result = Analyses(*(pd.concat([p[i] for p in parts], ignore_index=True) for i in range(2)))
    return {"circuits": write_parquet(folder.circuits_path, result.circuits),
            "patching": write_parquet(folder.patching_path, result.patching)}


def write_circuits(run_dir: str | Path, n: int = 512) -> Path:
    """:func:`write_analyses`, returning the ``circuits.parquet`` path (``patching.parquet`` is written beside it)."""
    return write_analyses(run_dir, n)["circuits"]
