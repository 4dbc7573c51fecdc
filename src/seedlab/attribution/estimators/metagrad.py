"""``metagrad``: the reverse mode of unroll's linearisation — every training row's metagradient, and every
candidate's first-order effect, from one backward pass through the twin's replayed run.

unroll (attribution/estimators/unroll.py, whose module doc states the step) writes the trainer's update at step t as a
map of the whole optimizer state, z_{t+1} = F_t(z_t), z = (θ, m, v) (plain SGD: z = θ), and carries a
tangent forward, one JVP per step and candidate. Here the same map is given the batch's per-row loss
weights w ∈ ℝ^B as a second input,

    z_{t+1} = F_t(z_t, w),   L_t(θ, w) = (Σ_i w_i ℓ_i(θ)) / N   (ℓ_i row i's CE sum, N = B·T; w = 1 the run),

and the *adjoint* of a query's loss at a horizon h, λ_t = ∂L_q(θ_h)/∂z_t, is carried backward:

    λ_h = (∇L_q(θ_h), 0, 0),      (λ_t, ∂L_q(θ_h)/∂w_{t,·}) = vjp(F_t at (z_t, w = 1))(λ_{t+1}).

One VJP of the single step (``torch.func.vjp`` of unroll's :class:`~seedlab.attribution.estimators.unroll.Step`, the
row weights an input beside z: :class:`WeightedStep`) gives both: the previous adjoint and the
derivative of L_q(θ_h) with respect to every row's loss weight at that step. What the VJP differentiates
through is the step as torch computes it: the raw gradient g = ∇_θ L_t(θ, w) (a Hessian-vector product
inside: reverse over reverse), torch's global-norm clip c = g·min(1, C/(‖g‖ + 1e-6)) (where it acts, a
cotangent c̄ of c becomes κ·(c̄ − g·⟨g, c̄⟩/(‖g‖(‖g‖ + 1e-6))) with κ = C/(‖g‖ + 1e-6): its part along g
removed, as the norm is held at C; where it does not act, the identity), then AdamW m' = β₁m + (1−β₁)c, v' = β₂v + (1−β₂)c²,
θ' = θ(1 − lr·wd) − (lr/bc₁)·m'/(√(v'/bc₂) + ε). The bias corrections bc_k = 1 − β_kᵗ, the rate lr_t and the
step count t depend on t alone, not on z: constants of the step, not differentiated, that set the adjoint's
paths through the moments — ∂θ'/∂m' = −(lr/bc₁)/(√(v'/bc₂) + ε) and ∂θ'/∂v' = (lr/bc₁)·m'/(√(v'/bc₂) + ε)²
· 1/(2 bc₂ √(v'/bc₂)) elementwise (1/bc₁ is largest at the first steps); √v's derivative is 0 where
v' = 0 (as unroll's tangent). The weights w enter only through g (∂g/∂w_i = ∇ℓ_i(θ_t)/N), so their cotangent is
∂L_q(θ_h)/∂w_{t,i} = ⟨λ_{t+1}, ∂F_t/∂w_i⟩ = ⟨(∂F_t/∂g)ᵀλ_{t+1}, ∇ℓ_i(θ_t)/N⟩: one number per row, every row of
the step from the one VJP.

- **Rows** — for every row (t, i) with t₀ ≤ t < h: ∂L_q(θ_h)/∂w_{t,i} at w = 1 (:attr:`Adjoints.rows`).
  Removing row i of step t changes L_q(θ_h) by ≈ −that value; up-weighting it by ε, by ε·that.
- **Candidates** — for a candidate c swapped into row r at s, its first-order effect ⟨λ_{s+1}, Δz_{s+1}(c)⟩
  with Δz_{s+1}(c) the *exact* change of the step at s, the very Δz unroll starts from
  (:func:`~seedlab.attribution.estimators.unroll.first_step`): forward and reverse mode of one linearisation, so
  it equals unroll's estimate at h up to float round-off (tests/attribution/test_metagrad.py).

**Replay.** The adjoint is taken along the twin's trajectory bit for bit: the run is replayed by the bank's
own trainer, from the seed's initialisation (step 0: GPT ``init_from_seed`` and the (seed, t) batches of
lm/batches.py; for t₀ < s) or from the kept prefix (prefix.safetensors, the complete state at s), and
checked: at s every tensor of the complete state (weights, moments, step counts) against the prefix's
recorded hashes, and at every step the twin's manifest.json holds, the weights against it
(:func:`replay_check`); a mismatch (a corrupted or foreign prefix, another seed, another torch or thread
count) is a one-line error.

**Checkpoint-and-recompute.** The forward replay keeps the complete state every k-th step from t₀
(``every``; default ⌈√(H − t₀)⌉, H the last horizon); the backward pass, segment by segment from the last,
recomputes the k states of a segment from its checkpoint (each recomputed state's weights hashed against
the forward replay's: bitwise the same run) and runs the segment's VJPs in reverse. Memory: at most
⌈T/k⌉ + k − 1 kept complete states (θ, m, v: 3P numbers each, :class:`_Saved`) with T = H − t₀ — O(T/k + k),
O(√T) at the default — beside the one trainer that replays, recomputes and is differentiated (its state
loaded in place: 4P with its gradient), the adjoints (Q queries × the horizons still open, 3P each), the
query gradients at each horizon (Q × P each) and one step's VJP graph (a batch's activations for the
forward, the gradient and their backward, times the cotangents vmapped at once: ``chunk``). Cost: the
replay (H − start updates), the recomputation (T − ⌈T/k⌉ more; none at k = 1), and per step one VJP: the
step's function once (a forward and a backward of the batch with the graph kept) and its backward once per
open cotangent (about two more passes each, vmapped).

Numerics: the adjoint in the parameters' dtype (float32 for the bank's fp32 runs, as unroll's tangent);
row weights in the loss's dtype (float32: the trainer's CE, lm/model.py ``masked_ce_sum``); inner products
and the written values in float64. Attention on torch's MATH kernel inside the VJP (as unroll).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
from torch.func import functional_call, vjp, vmap

from seedlab.attribution.estimators.builtin import Gradients
from seedlab.attribution.bank.rundir import Bank, open_bank
from seedlab.attribution.estimators.unroll import State, Step, _math_attention, first_step
from seedlab.errors import SeedlabError
from seedlab.forks.prefix import first_difference, read_prefix
from seedlab.lm.trainer import Trainer
from seedlab.store import digest, read_verified, tensor_hashes, write_json, write_parquet

#: ``check(t, trainer)``: called with the replayed run after every update it reaches (and at its start)
Check = Callable[[int, Trainer], None]


class WeightedStep(Step):
    """unroll's :class:`~seedlab.attribution.estimators.unroll.Step` with the batch's per-row loss weights ``w`` [B] as an
    input: ``weighted(w, *z)`` = F_t(z, w) with the loss (Σ_i w_i ℓ_i)/N (ℓ_i row i's CE sum in float32, as
    ``masked_ce_sum``; N = B·T); at w = 1 it is :meth:`Step.__call__`'s function. :meth:`pull` is its VJP."""

    _w: torch.Tensor | None = None

    def loss(self, theta: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self._w is None:
            return super().loss(theta)
        logits, _ = functional_call(self.model, dict(zip(self.names, theta)), (self.x,))
        ce = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), self.y.flatten(), reduction="none")
        return (ce.view(self.y.shape).sum(1) * self._w.to(ce.dtype)).sum() / self.y.numel()

    def weighted(self, w: torch.Tensor, *state: tuple[torch.Tensor, ...]) -> State:
        """F_t(z, w): :meth:`Step.__call__` with the rows weighed by ``w`` (the weights read inside its gradient)."""
        self._w = w
        try:
            return self(*state)
        finally:
            self._w = None

    def pull(self, cotangents: State, chunk: int | None) -> tuple[torch.Tensor, State]:
        """For a batch of cotangents λ_{t+1} (each tensor with a leading axis R): (∂/∂w [R, B], λ_t) at
        (z_t, w = 1) — one ``torch.func.vjp`` of the step, its backward vmapped over the R cotangents."""
        ones = torch.ones(self.x.shape[0], dtype=self.state[0][0].dtype, device=self.x.device)
        with _math_attention(self.x.device):
            _, back = vjp(self.weighted, ones, *self.state)
            out = vmap(back, chunk_size=chunk)(cotangents)
        return out[0], tuple(out[1:])


@dataclass
class Adjoints:
    """What :func:`adjoints` returns: per horizon, every row's metagradient and the adjoints asked for."""

    first: int  # t₀: the first step whose rows are differentiated
    horizons: list[int]
    queries: list[str]  # the rows' and the adjoints' query order
    rows: dict[int, np.ndarray]  # h -> [Q, h - t₀, B] float64: ∂L_q(θ_h)/∂w_{t,i} at w = 1, t = t₀ + index
    at: dict[int, dict[int, State]] = field(default_factory=dict)  # t -> h -> λ_t, each tensor [Q, ...]
    every: int = 1  # k: the checkpoint spacing used
    held: int = 0  # the most complete states held at once (the memory, in states)
    vjps: int = 0  # single-step VJPs taken (each over the horizons open at its step × Q cotangents)
    replayed: int = 0  # updates trained: the replay and the recomputation


def adjoints(start: Trainer, queries: Mapping[str, Sequence[int]], horizons: Sequence[int], *,
             first: int | None = None, every: int | None = None, keep: Collection[int] = (),
             check: Check | None = None, chunk: int | None = None, micro_batch: int | None = None,
             tick: Callable[[], None] | None = None) -> Adjoints:
    """The adjoints of every query's loss at every horizon, carried back from each horizon h to ``first`` = t₀
    (module doc), and every row's metagradient on the way.

    ``start``: a trainer anywhere at or before t₀ (``start.step`` ≤ t₀; not changed: a fork is replayed);
    ``queries``: {name: token ids} (∇L_q as the estimators take it: attribution/estimators/builtin.py ``Gradients``,
    eval mode, mean CE); ``horizons``: updates completed, each ≥ t₀ (a horizon at t₀ has no rows) and within
    the schedule; ``every``: k,
    the checkpoint spacing (None: ⌈√(H − t₀)⌉); ``keep``: steps t (t₀ ≤ t ≤ H) whose adjoints λ_t to keep
    (:attr:`Adjoints.at`); ``check(t, trainer)``: called at every step the forward replay reaches (the
    caller compares the run with the twin's hashes); ``chunk``: cotangents per vmapped VJP (None: all);
    ``tick``: once per update replayed and per VJP."""
    a = start.step
    t0 = a if first is None else int(first)
    hs = sorted({int(h) for h in horizons})
    if not queries:
        raise SeedlabError("metagrad: at least one query is needed")
    if not hs or not a <= t0 <= hs[0] or hs[-1] > start.cfg.steps:
        raise SeedlabError(f"metagrad: the first step must lie in {a} .. the first horizon, and the horizons within "
                           f"the run's {start.cfg.steps} updates, got first step {t0} and horizons {hs}")
    H = hs[-1]
    k = int(every) if every is not None else max(1, math.ceil(math.sqrt(H - t0)))
    if k < 1:
        raise SeedlabError(f"metagrad: every must be at least 1, got {every}")
    if chunk is not None and chunk < 1:
        raise SeedlabError(f"metagrad: chunk must be at least 1, got {chunk}")
    bad = sorted(t for t in keep if not t0 <= t <= H)
    if bad:
        raise SeedlabError(f"metagrad: adjoints can be kept at steps {t0} .. {H}, got {bad[0]}")
    names = list(queries)
    out = Adjoints(t0, hs, names, {}, every=k)

    # forward: the replay, a complete state every k-th step from t₀, the query gradients at each horizon
    tr = start.fork()  # the one trainer replayed, recomputed and differentiated: states are loaded into it
    kept: dict[int, _Saved] = {}
    weights: dict[int, str] = {}  # t -> the replay's weights' digest (the recomputation must match it)
    targets: dict[int, tuple[torch.Tensor, ...]] = {}  # h -> ∇L_q(θ_h) [Q, ...] (λ_h's θ part; m and v parts 0)
    while True:
        t = tr.step
        if check is not None:
            check(t, tr)
        if t >= t0:
            weights[t] = digest(tensor_hashes(tr.weights()))
            if (t - t0) % k == 0 and t < H:
                kept[t] = _Saved.of(tr)
                out.held = max(out.held, len(kept))
        if t in hs:
            targets[t] = _target(tr, queries, micro_batch)
        if t == H:
            break
        tr.advance()
        out.replayed += 1
        if tick is not None:
            tick()

    # backward: segment by segment from the last, its states recomputed from its checkpoint
    Q, B = len(names), start.cfg.batch_size
    channels = 3 if isinstance(start.opt, torch.optim.AdamW) else 1
    rows = {h: np.zeros((Q, h - t0, B)) for h in hs}
    lam: State | None = None
    order: list[int] = []  # the horizons of lam's blocks of Q rows, in order
    for c in sorted(kept, reverse=True):
        end = min(c + k, H)
        seg = [kept.pop(c)]
        seg[0].load(tr)
        while tr.step < end - 1:
            tr.advance()
            out.replayed += 1
            if tick is not None:
                tick()
            if digest(tensor_hashes(tr.weights())) != weights[tr.step]:
                raise SeedlabError(f"metagrad: the run recomputed from step {c} differs from the replay at step "
                                   f"{tr.step} (training is not deterministic here)")
            seg.append(_Saved.of(tr))
            out.held = max(out.held, len(kept) + len(seg))
        for t in range(end - 1, c - 1, -1):
            if t + 1 in targets:  # a horizon: its queries' adjoints join
                lam = _join(lam, targets.pop(t + 1), channels)
                order.append(t + 1)
            if t + 1 in keep:
                out.at[t + 1] = _split(lam, order, Q)
            assert lam is not None
            seg.pop().load(tr)
            dw, lam = WeightedStep(tr).pull(lam, chunk)
            out.vjps += 1
            if tick is not None:
                tick()
            dw = dw.double().cpu().numpy()
            for j, h in enumerate(order):
                rows[h][:, t - t0, :] = dw[j * Q : (j + 1) * Q]
    if t0 in targets:  # a horizon at t₀ itself (no step between): λ_h is its own adjoint
        lam = _join(lam, targets.pop(t0), channels)
        order.append(t0)
    if t0 in keep:
        out.at[t0] = _split(lam, order, Q)
    out.rows = rows
    return out


def candidate_effects(grads: Gradients, trainer: Trainer, adj: Adjoints) -> dict[int, np.ndarray]:
    """``{h: [candidates × queries]}`` of ⟨λ_{s+1}, Δz_{s+1}(c)⟩ (float64): every candidate's first-order effect on
    every query at every horizon of ``adj``, which must hold λ_{s+1} (``keep`` s + 1) for ``grads.case``'s
    queries in their order. ``trainer``: the twin at the fork point (``step == s``), ``grads`` at θ_s (unroll's)."""
    s = trainer.step
    if s + 1 not in adj.at or adj.queries != list(grads.case.queries):
        raise SeedlabError("metagrad: the adjoints hold no λ at s+1 for these queries")
    dz = first_step(grads, trainer)  # the exact change at s, per candidate: unroll's start
    flat_dz = _flat(dz)  # [K, 3P] float64
    return {h: (flat_dz @ _flat(lam).T).cpu().numpy() for h, lam in adj.at[s + 1].items()}


def metagrad(grads: Gradients, trainer: Trainer, horizons: Sequence[int], *, every: int | None = None,
             chunk: int | None = None, check: Check | None = None,
             tick: Callable[[], None] | None = None) -> dict[int, np.ndarray]:
    """``{h: [candidates × queries]}``: the estimator ``metagrad`` — every candidate's ⟨λ_{s+1}, Δz_{s+1}(c)⟩ at
    every horizon, one backward pass from the last horizon to s + 1 (the frame of unroll's :func:`~seedlab.
    attribution.unroll.unroll`, and its value to float round-off). ``trainer``: the twin at the fork point
    (``step == s``: the prefix loaded; not changed); ``check(t, trainer)`` at every replayed step."""
    s = trainer.step
    hs = sorted({int(h) for h in horizons})
    if not hs or hs[0] <= s or hs[-1] > trainer.cfg.steps:
        raise SeedlabError(f"metagrad: horizons must be after the injection step {s} and within the run's "
                           f"{trainer.cfg.steps} updates, got {hs}")
    adj = adjoints(trainer, grads.case.queries, hs, first=s + 1, every=every, keep={s + 1}, check=check,
                   chunk=chunk, micro_batch=grads.micro_batch, tick=tick)
    return candidate_effects(grads, trainer, adj)


# --------------------------------------------------------------------------- a bank's rows: metagrad.parquet

#: metagrad.parquet's columns: one row per seed × query × horizon × step × batch row
COLUMNS = ["seed", "query", "horizon", "step", "row", "value"]


def replay_check(bank: Bank, seed: int, horizons: Sequence[int]) -> Check:
    """``check(t, trainer)`` for a replay of the bank's twin of ``seed`` (module doc, Replay): at the injection
    step s every tensor of the complete state (weights, AdamW moments and step counts, as Trainer.save_state names
    them) must hash as prefix.safetensors recorded them (where the prefix was kept), and at every step the twin's
    manifest.json holds, the weights as it records them; else a one-line error. A horizon without the twin's
    hashes (nothing to check the replay against there) is refused first."""
    s, twin = bank.cfg.injection_step, bank.dir.twin(seed)
    manifest = twin.read_manifest()
    missing = [h for h in horizons if str(h) not in manifest]
    if missing:
        raise SeedlabError(f"seed {seed}: metagrad cannot reach step {missing[0]}: the twin recorded no hashes there "
                           f"(its steps: {', '.join(sorted(manifest, key=int)) or 'none'})")
    prefix = bank.dir.prefix(seed)
    recorded: dict[str, str] | None = None
    if prefix.is_file():
        _, meta = read_verified(prefix)  # the file against its own hashes: a corrupted prefix is refused here
        recorded = {k: v for k, v in json.loads(meta["sha256"]).items() if k != "losses"}

    def check(t: int, tr: Trainer) -> None:
        if t == s and recorded is not None:
            bad = first_difference(recorded, tensor_hashes(_complete_state(tr)))
            if bad is not None:
                raise SeedlabError(f"seed {seed}: the run replayed for metagrad differs from the kept prefix "
                                   f"({prefix.name}) at step {s} in tensor {bad!r} (a wrong seed, a foreign prefix, or "
                                   "another torch, device or thread count than the bank's? see environment.json)")
        want = manifest.get(str(t))
        bad = None if want is None else first_difference(want, tensor_hashes(tr.weights()))
        if bad is not None:
            raise SeedlabError(f"seed {seed}: the run replayed for metagrad differs from the bank's twin at step {t} "
                               f"in tensor {bad!r} (a wrong seed, a foreign prefix, or another torch, device or thread "
                               "count than the bank's? see environment.json)")

    return check


def _complete_state(tr: Trainer) -> dict[str, torch.Tensor]:
    """The complete training state under the names lm/trainer.py ``Trainer.save_state`` writes (losses aside)."""
    out = {f"model.{k}": v for k, v in tr.model.state_dict().items()}
    for i, st in tr.opt.state_dict()["state"].items():
        for k, v in st.items():
            out[f"opt.{i}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return out


def bank_horizons(bank: Bank, horizons: Sequence[str | int] | None) -> list[int]:
    """The horizons asked for (labels as the bank names them — s+1, mid, end — or updates completed), as steps;
    None: every horizon of the bank. One the bank lacks is a one-line error."""
    have = bank.cfg.horizon_steps()  # {step: label}
    if not horizons:
        return sorted(have)
    by_label = {label: t for t, label in have.items()}
    out = []
    for h in horizons:
        key = str(h).strip()
        t = by_label.get(key, int(key) if key.lstrip("-").isdigit() else None)
        if t not in have:
            allowed = ", ".join(f"{label} ({t})" for t, label in have.items())
            raise SeedlabError(f"--horizon: must be one of the bank's horizons {allowed}, got {h!r}")
        out.append(t)
    return sorted(set(out))


def bank_metagrad(root: str | Path, *, first: int = 0, every: int | None = None,
                  horizons: Sequence[str | int] | None = None, device: str = "auto", chunk: int | None = None,
                  progress: bool = True) -> pd.DataFrame:
    """``seedlab attribution metagrad BANK``: every row's metagradient ∂L_q(θ_h)/∂w_{t,i} for every query of the
    bank (its query rows and probes), every horizon h asked for and every row (t, i), ``first`` ≤ t < h, of every
    seed whose twin finished, the twin replayed (from step 0 when ``first`` < s, else from the kept prefix) and
    checked (:func:`replay_check`); written to metagrad.parquet (:data:`COLUMNS`) and metagrad.json (the
    settings, the replay's and the VJPs' counts, the states held, the wall time per seed) in the bank folder.
    Every input is checked before any work (a first step outside 0 .. the first horizon, a horizon the bank
    lacks, ``every`` or ``chunk`` < 1, a bank without queries or a finished twin, a prefix missing where
    the replay starts from it): one line, nothing written."""
    from seedlab.lm.determinism import nondeterminism_is_an_error, settle
    from seedlab.lm.distributed import World
    from seedlab.progress import Bar

    bank = open_bank(root)
    cfg, inputs, s = bank.cfg, bank.inputs, bank.cfg.injection_step
    hs = bank_horizons(bank, horizons)
    if not 0 <= first <= hs[0]:
        raise SeedlabError(f"--t0: must be in 0 .. {hs[0]} (0: the twin replayed from its seed's initialisation; "
                           f"{s} = s: from the kept prefix; at most the first horizon asked for), got {first}")
    if every is not None and every < 1:
        raise SeedlabError(f"--every: at least 1 (a complete state kept every K steps), got {every}")
    if chunk is not None and chunk < 1:
        raise SeedlabError(f"--chunk: at least 1, got {chunk}")
    queries = {n: t.tokens for n, t in inputs.queries.items()}
    if not queries:
        raise SeedlabError(f"{bank.root}: the bank has no queries (queries.heldout, queries.probes) to differentiate")
    seeds = [seed for seed in cfg.seeds if bank.dir.twin(seed).finished]
    if not seeds:
        raise SeedlabError(f"{bank.root}: no seed's twin has finished (run `seedlab attribution bank` first)")
    if first >= s:
        gone = [seed for seed in seeds if not bank.dir.prefix(seed).is_file()]
        if gone:
            raise SeedlabError(f"--t0: {first} replays from the kept prefix, and seed {gone[0]} kept none "
                               f"({bank.dir.prefix(gone[0])}); pass --t0 below {s} to replay from step 0")
    checks = {seed: replay_check(bank, seed, hs) for seed in seeds}  # every horizon's hashes, every prefix's file
    dev = World().device(device)
    settle(dev, cfg.threads)
    T = hs[-1] - first
    k = every or max(1, math.ceil(math.sqrt(T)))
    start = 0 if first < s else s
    per_seed = (hs[-1] - start) + (T - math.ceil(T / k)) + T  # the replay, the recomputation, the VJPs
    frames, record = [], {}
    with Bar("metagrad", per_seed * len(seeds), "steps", enabled=progress) as bar, nondeterminism_is_an_error():
        for seed in seeds:
            bar.update(note=f"seed {seed}")
            t_start = time.perf_counter()
            tr = Trainer(cfg.model_copy(update={"device": str(dev)}), inputs.gcfg, seed, inputs.corpus.train)
            if start == s:
                read_prefix(tr, bank.dir.prefix(seed), s)
            adj = adjoints(tr, queries, hs, first=first, every=k, check=checks[seed], chunk=chunk,
                           micro_batch=cfg.micro_batch, tick=bar.advance)
            frames.append(rows_frame(seed, adj))
            record[str(seed)] = {"seconds": time.perf_counter() - t_start, "replayed_from": start,
                                 "updates_replayed": adj.replayed, "vjps": adj.vjps, "states_held": adj.held}
    df = pd.concat(frames, ignore_index=True)
    write_parquet(bank.dir.metagrad, df)
    write_json(bank.dir.metagrad_json, {"t0": first, "every": k, "horizons": hs, "queries": list(queries),
                                        "device": str(dev), "chunk": chunk, "seeds": record})
    return df


def rows_frame(seed: int, adj: Adjoints) -> pd.DataFrame:
    """:attr:`Adjoints.rows` as metagrad.parquet's long frame (:data:`COLUMNS`)."""
    parts = []
    for h, arr in adj.rows.items():
        Q, n, B = arr.shape
        parts.append(pd.DataFrame({
            "seed": np.full(Q * n * B, seed, dtype=np.int64),
            "query": np.repeat(np.asarray(adj.queries, dtype=object), n * B),
            "horizon": np.full(Q * n * B, h, dtype=np.int64),
            "step": np.tile(np.repeat(np.arange(adj.first, adj.first + n, dtype=np.int64), B), Q),
            "row": np.tile(np.arange(B, dtype=np.int64), Q * n),
            "value": arr.reshape(-1),
        }))
    return pd.concat(parts, ignore_index=True)[COLUMNS]


# --------------------------------------------------------------------------- helpers


@dataclass
class _Saved:
    """A run's complete state at one step (weights, and the optimizer's per-parameter state: AdamW's moments and step
    counts), copied out of a trainer and loaded back into one: a kept checkpoint of checkpoint-and-recompute."""

    step: int
    params: list[torch.Tensor]
    opt: dict[int, dict[str, object]]  # parameter index -> its optimizer state (tensors copied)

    @classmethod
    def of(cls, tr: Trainer) -> _Saved:
        opt = {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in tr.opt.state[p].items()}
               for i, p in enumerate(tr.params) if p in tr.opt.state}
        return cls(tr.step, [p.detach().clone() for p in tr.params], opt)

    def load(self, tr: Trainer) -> None:
        """``tr`` at this state (its parameters overwritten in place, its optimizer state replaced by copies), so that
        its next update is the one this state's run made (bit for bit: the same tensors, the same step)."""
        with torch.no_grad():
            for p, v in zip(tr.params, self.params):
                p.copy_(v)
                p.grad = None
        tr.opt.state.clear()
        for i, st in self.opt.items():
            tr.opt.state[tr.params[i]] = {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
        tr.step = self.step


def _target(tr: Trainer, queries: Mapping[str, Sequence[int]], micro_batch: int | None) -> tuple[torch.Tensor, ...]:
    """∇L_q(θ_h) for every query, [Q, ...] per parameter in the parameters' dtype: estimators.py's
    ``Gradients.query`` (the kernels unroll's readout uses, so the same bits). λ_h is (this, 0, 0)."""
    params = list(tr.model.parameters())
    g = Gradients(tr.model, SimpleNamespace(queries=dict(queries)), micro_batch=micro_batch)  # query() reads .queries only
    flat = torch.stack([g.query(name) for name in queries])  # [Q, P] float64
    theta, i = [], 0
    for p in params:
        theta.append(flat[:, i : i + p.numel()].reshape(len(queries), *p.shape).to(p.dtype).to(p.device))
        i += p.numel()
    return tuple(theta)


def _join(lam: State | None, theta: tuple[torch.Tensor, ...], channels: int) -> State:
    """The open adjoints with a horizon's λ_h = (∇L_q(θ_h), 0, 0) appended (its Q rows last): ``channels`` 3 for
    AdamW's (θ, m, v), 1 for plain SGD's θ."""
    new = (theta, *(tuple(torch.zeros_like(x) for x in theta) for _ in range(channels - 1)))
    if lam is None:
        return new
    return tuple(tuple(torch.cat([x, y]) for x, y in zip(pa, pb)) for pa, pb in zip(lam, new))


def _split(lam: State | None, order: list[int], Q: int) -> dict[int, State]:
    """λ's rows by horizon: {h: State [Q, ...]}."""
    if lam is None:
        return {}
    return {h: tuple(tuple(x[j * Q : (j + 1) * Q].clone() for x in part) for part in lam) for j, h in enumerate(order)}


def _flat(state: State) -> torch.Tensor:
    """A batched State (each tensor [R, ...]) -> [R, numbers] float64 on the CPU (channels, then parameters)."""
    return torch.cat([x.reshape(x.shape[0], -1).double().cpu() for part in state for x in part], dim=1)
