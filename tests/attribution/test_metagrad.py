"""metagrad, unroll's linearisation in reverse mode: the candidates' effects equal unroll's at every horizon, a row's
metagradient is the derivative a real rerun with that row's loss weight at 1 ± ε measures, the replay is the twin's
(a wrong seed, a foreign or corrupted prefix refused), checkpoint-and-recompute changes no bit, and bad input is one
line, exit 2, nothing written."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from seedlab.attribution.estimators.attribute import attribute
from seedlab.attribution.bank.run import run_bank
from seedlab.attribution.bank.config import AttributionConfig

from seedlab.attribution.estimators.metagrad import COLUMNS, adjoints, bank_metagrad, replay_check, rows_frame
from seedlab.attribution.bank.rundir import BankDir, open_bank
from seedlab.config import load_config
from seedlab.errors import SeedlabError
from seedlab.forks.prefix import read_prefix
from seedlab.lm.batches import get_batch
from seedlab.lm.trainer import Trainer
from seedlab.store import read_verified, write_safetensors
from seedlab.measures.text import text_ce

pytestmark = pytest.mark.usefixtures("one_thread")

HORIZONS = [1, 3, "end"]  # s+1 (no step between: λ = ∇L_q), s+3, the end (s = 4, 14 updates)


@pytest.fixture(scope="module")
def bank(tmp_path_factory, twins_inputs, bank_design, one_thread):
    """TINY_BANK on one seed at three horizons, attributed by unroll and metagrad. Read it, never change it."""
    base = tmp_path_factory.mktemp("metagrad")
    cfg, folder = load_config(AttributionConfig, "attribution",
                              bank_design.write(base, twins_inputs[0], seeds=[0], horizons=HORIZONS))
    run_bank(cfg, base / "bank", base=folder, progress=False)
    attribute(base / "bank", estimators=["unroll", "metagrad"], progress=False)
    return base / "bank"


def _copy(bank, tmp_path):
    shutil.copytree(bank, tmp_path / "bank")
    return tmp_path / "bank"


def _trainer(b, seed: int = 0, *, prefix: bool = False) -> Trainer:
    t = Trainer(b.cfg.model_copy(update={"device": "cpu"}), b.inputs.gcfg, seed, b.inputs.corpus.train)
    if prefix:
        read_prefix(t, b.dir.prefix(0), b.cfg.injection_step)
    return t


def _queries(b) -> dict:
    return {n: t.tokens for n, t in b.inputs.queries.items()}


def test_reverse_mode_equals_unroll_at_every_horizon(bank):
    # two modes of one linearisation: ⟨∇L_q(θ_h), J_{h-1}⋯J_{s+1}Δz⟩ = ⟨J_{s+1}ᵀ⋯J_{h-1}ᵀ∇L_q(θ_h), Δz⟩, the same
    # float32 Jacobians at the same (hash-checked) states, multiplied in the other order: they differ by float32
    # round-off only (measured ≤ 1e-7 of the largest effect at 9 steps); 1e-5 leaves room for more steps' rounding
    df = pd.read_parquet(BankDir(bank).attribution)
    keys = ["seed", "candidate", "query", "horizon"]
    u = df[df.estimator == "unroll"].set_index(keys).estimate
    m = df[df.estimator == "metagrad"].set_index(keys).estimate
    assert len(u) and u.index.sort_values().equals(m.index.sort_values())
    m = m.reindex(u.index)
    assert sorted(u.index.get_level_values("horizon").unique()) == [5, 7, 14]
    for h in (5, 7, 14):
        uh, mh = u.xs(h, level="horizon"), m.xs(h, level="horizon")
        assert np.abs(uh).max() > 1e-3  # effects well above round-off
        err = np.abs(mh - uh).max() / np.abs(uh).max()
        assert err < 1e-5, (h, err)
    own = m[m.index.get_level_values("candidate") == "own-row"]
    assert len(own) and (own == 0).all()  # Δz = 0 exactly: the own-row control
    assert set(df[df.estimator == "metagrad"].estimator_label) == {"reference"}


def test_a_rows_metagradient_is_the_rerun_derivative_of_its_loss_weight(design):
    # a real rerun of the training from step 0 with row i of step t weighed 1 ± ε (its gradient (w − 1)·∇ℓ_i/N
    # added to the raw batch gradient before the clip and AdamW), float64 weights (the trainer's CE stays
    # float32), central difference at ε = 1e-3. Measured agreement ≤ 6e-4 of the largest |value| of the row:
    # O(ε²) curvature (AdamW's first steps are sign-like: v = 0 at step 0) and the float32 CE's rounding / ε;
    # the tolerance 3e-3 is 5x that
    cfg, base = design(seeds=[0])
    from seedlab.attribution.bank.texts import load_inputs

    inputs = load_inputs(cfg, base)
    queries = {n: t.tokens for n, t in inputs.queries.items()}
    H, eps = 8, 1e-3

    def fresh() -> Trainer:
        t = Trainer(cfg.model_copy(update={"device": "cpu"}), inputs.gcfg, 0, inputs.corpus.train)
        t.model.double()
        return t

    adj = adjoints(fresh(), queries, [H], first=0, every=3)

    def rerun(step: int, row: int, w: float) -> np.ndarray:
        tr = fresh()
        while tr.step < H:
            delta = None
            if tr.step == step:
                x, y = get_batch(tr.tokens, tr.seed, tr.step, cfg.batch_size, inputs.gcfg.block_size)
                g, _ = tr._row_gradient(x[row : row + 1], y[row : row + 1], torch.ones(1, x.shape[1], dtype=torch.bool),
                                        x.numel())
                delta = [(w - 1) * gi for gi in g]
            tr.advance(grad_delta=delta)
        return np.array([text_ce(tr.model, ids) for ids in queries.values()])

    for step, row in [(0, 1), (3, 2), (7, 3)]:
        fd = (rerun(step, row, 1 + eps) - rerun(step, row, 1 - eps)) / (2 * eps)
        mg = adj.rows[H][:, step, row]
        assert np.abs(mg).max() > 1e-4
        err = np.abs(fd - mg).max() / np.abs(mg).max()
        assert err < 3e-3, (step, row, fd, mg)


def test_plain_sgd_and_a_clip_that_acts_reverse_equals_forward(design):
    # the one-channel state z = θ (plain SGD) and torch's clip active at every step (grad_clip far below ‖g‖):
    # the same linearisation both ways, through the clip's derivative, to float32 round-off
    from seedlab.attribution.estimators.builtin import Case, Gradients
    from seedlab.attribution.estimators.metagrad import metagrad
    from seedlab.attribution.bank.texts import load_inputs
    from seedlab.attribution.estimators.unroll import unroll

    cfg, base = design(seeds=[0], optimizer="sgd", grad_clip=0.05)
    inputs = load_inputs(cfg, base)
    tr = Trainer(cfg.model_copy(update={"device": "cpu"}), inputs.gcfg, 0, inputs.corpus.train)
    while tr.step < cfg.injection_step:
        tr.advance()
    cands = {n: t.tokens for n, t in inputs.candidates_of(0).items()}
    case = Case.of(*inputs.ordinary_batch(0), cfg.injection_row, cands,
                   cands | {n: t.tokens for n, t in inputs.queries.items()}, inputs.pad_id)
    grads = Gradients(tr.model, case)
    u, m = unroll(grads, tr, [5, 14]), metagrad(grads, tr, [5, 14], every=3)
    for h in (5, 14):
        assert np.abs(u[h]).max() > 1e-5
        assert np.abs(m[h] - u[h]).max() < 1e-5 * np.abs(u[h]).max(), h


def test_checkpoint_and_recompute_changes_no_bit(bank):
    b = open_bank(bank)
    queries, hs = _queries(b), [5, 7, 14]
    check = replay_check(b, 0, hs)
    one = adjoints(_trainer(b), queries, hs, first=0, every=1, check=check)
    four = adjoints(_trainer(b), queries, hs, first=0, every=4, check=check)
    default = adjoints(_trainer(b), queries, hs, first=0)  # all 14 states fit metagrad.STATE_BUDGET: k = 1
    for h in hs:
        assert np.array_equal(one.rows[h], four.rows[h]) and np.array_equal(one.rows[h], default.rows[h])
        assert one.rows[h].shape == (len(queries), h, b.cfg.batch_size)
    assert default.every == 1 and default.replayed == 14 and four.every == 4
    assert one.replayed == 14 and four.replayed == 14 + 10  # k = 4: every segment's 3 states recomputed (2 in the last)
    assert one.held == 14 and four.held <= -(-14 // 4) + 4 - 1  # O(T/k + k) states
    # from the kept prefix (t₀ = s): the same rows at every step from s, bit for bit
    s = b.cfg.injection_step
    late = adjoints(_trainer(b, prefix=True), queries, hs, first=s, every=2, check=check)
    for h in hs:
        assert np.array_equal(late.rows[h], one.rows[h][:, s:])
    assert np.abs(one.rows[14]).max() > 0 and not np.isnan(one.rows[14]).any()


def test_the_replay_is_checked_against_the_twin(bank, tmp_path):
    b = open_bank(bank)
    queries, hs = _queries(b), [5, 7, 14]
    # another seed, from step 0: its state at s is not the kept prefix's
    with pytest.raises(SeedlabError, match=r"^seed 0: the run replayed for metagrad differs from the kept prefix "
                                           r"\(prefix.safetensors\) at step 4 in tensor"):
        adjoints(_trainer(b, seed=1), queries, hs, first=0, check=replay_check(b, 0, hs))
    # another seed from the kept prefix: other batches, so not the twin at s+1
    wrong = _trainer(b, seed=1)
    read_prefix(wrong, b.dir.prefix(0), 4)
    with pytest.raises(SeedlabError, match="differs from the bank's twin at step 5 in tensor"):
        adjoints(wrong, queries, hs, first=4, check=replay_check(b, 0, hs))
    # a foreign prefix, consistent with its own hashes (one weight moved): refused from step 0 and from s
    root = _copy(bank, tmp_path)
    rd = BankDir(root)
    tensors, meta = read_verified(rd.prefix(0))
    name = next(k for k in tensors if k.startswith("model."))
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1e-3
    write_safetensors(rd.prefix(0), tensors, {"step": meta["step"]}, hashed=True)
    with pytest.raises(SeedlabError, match=f"differs from the kept prefix \\(prefix.safetensors\\) at step 4 in tensor '{name}'"):
        bank_metagrad(root, first=0, progress=False)
    with pytest.raises(SeedlabError, match="differs from the bank's twin at step 4 in tensor"):
        bank_metagrad(root, first=4, progress=False)
    assert not rd.metagrad.exists()


def test_bank_metagrad_writes_every_row_and_a_corrupted_prefix_is_one_line(bank, tmp_path, seedlab_main):
    root = _copy(bank, tmp_path)
    rd, b = BankDir(root), open_bank(root)
    rc, out, err = seedlab_main("attribution", "metagrad", str(root), "--t0", "2", "--horizon", "s+3", "--horizon", "end",
                               "--every", "3", "--no-progress")
    assert rc == 0, err
    df = pd.read_parquet(rd.metagrad)
    assert list(df.columns) == COLUMNS
    Q, B = len(b.inputs.queries), b.cfg.batch_size
    assert len(df) == Q * B * ((7 - 2) + (14 - 2)) and set(df.horizon) == {7, 14} and df.step.min() == 2
    assert df.groupby(["query", "horizon", "step", "row"]).size().max() == 1
    # the same numbers as the adjoints computed here
    direct = rows_frame(0, adjoints(_trainer(b), _queries(b), [7, 14], first=2, every=3))
    pd.testing.assert_frame_equal(df, direct)
    rd.metagrad.unlink()
    rd.metagrad_json.unlink()
    # a corrupted prefix (one byte of its tensors flipped): one line, exit 2, nothing written
    data = bytearray(rd.prefix(0).read_bytes())
    data[-8] ^= 0xFF
    rd.prefix(0).write_bytes(bytes(data))
    rc, out, err = seedlab_main("attribution", "metagrad", str(root), "--no-progress")
    assert rc == 2 and err.count("\n") == 1 and "corrupted checkpoint" in err, err
    assert not rd.metagrad.exists() and not rd.metagrad_json.exists()


@pytest.mark.parametrize("kwargs, match", [
    ({"first": -1}, r"^--t0: must be in 0 \.\. 5"),
    ({"first": 6}, r"^--t0: must be in 0 \.\. 5"),
    ({"first": 8, "horizons": ["end"]}, None),  # after the first horizon asked for is fine when it is the only one
    ({"horizons": ["s+2"]}, r"^--horizon: must be one of the bank's horizons s\+1 \(5\), s\+3 \(7\), end \(14\), got 's\+2'"),
    ({"horizons": ["9"]}, r"^--horizon: must be one of the bank's horizons"),
    ({"every": 0}, r"^--every: at least 1"),
    ({"query_chunk": 0}, r"^--query-chunk: at least 1"),
    ({"jobs": 0}, r"^--jobs: at least 1"),
])
def test_bad_input_is_one_line_and_writes_nothing(bank, tmp_path, kwargs, match):
    root = _copy(bank, tmp_path)
    if match is None:
        df = bank_metagrad(root, progress=False, **kwargs)
        assert set(df.horizon) == {14} and df.step.min() == 8
        return
    with pytest.raises(SeedlabError, match=match) as e:
        bank_metagrad(root, progress=False, **kwargs)
    assert "\n" not in str(e.value)
    assert not BankDir(root).metagrad.exists() and not BankDir(root).metagrad_json.exists()


def test_cli_bad_t0_is_exit_2(bank, tmp_path, seedlab_main):
    root = _copy(bank, tmp_path)
    rc, _, err = seedlab_main("attribution", "metagrad", str(root), "--t0", "-1", "--no-progress")
    assert rc == 2 and err.startswith("error: --t0: must be in 0 .. 5") and err.count("\n") == 1
    assert not BankDir(root).metagrad.exists()


def test_the_comparison_script_finds_the_two_modes_equal(bank):
    # experiments/metagrad_vs_unroll.py: its frame is the one the test above asserts, per seed and horizon
    import importlib.util

    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "metagrad_vs_unroll", Path(__file__).resolve().parents[2] / "experiments" / "metagrad_vs_unroll.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    df = mod.compare(bank, [0])
    assert list(df.columns) == mod.COLUMNS and sorted(df.horizon) == [5, 7, 14] and set(df.seed) == {0}
    assert (df.max_abs_unroll > 1e-3).all() and (df.max_rel < 1e-5).all()
    assert (df.unroll_s > 0).all() and (df.metagrad_s > 0).all()
    assert mod.main([str(bank), "--seeds", "x"]) == 2


@pytest.mark.parametrize("over", [{}, {"grad_clip": 0.05}, {"optimizer": "sgd", "grad_clip": 0.05}],
                         ids=["adamw", "adamw-clipped", "sgd-clipped"])
def test_the_hand_written_adjoint_is_torch_funcs_vjp(design, over):
    # Update.pull writes the adjoint of the clip and AdamW by hand and leaves only the gradient to autograd; the
    # reference is torch.func's VJP of the whole step (WeightedStep.pull). float64 weights: the parts that are
    # elementwise (m, v) agree to float64 round-off; the θ part and the rows' weights go through the float32 CE
    # (masked_ce_sum's .float(), in both), differently ordered: measured ≤ 3e-8 relative, tolerance 1e-6
    from seedlab.attribution.bank.texts import load_inputs
    from seedlab.attribution.estimators.metagrad import Update, WeightedStep, _Saved

    cfg, base = design(seeds=[0], **over)
    inputs = load_inputs(cfg, base)
    tr = Trainer(cfg.model_copy(update={"device": "cpu"}), inputs.gcfg, 0, inputs.corpus.train)
    tr.model.double()
    for _ in range(3):
        tr.advance()
    up, ref = Update(tr), WeightedStep(tr)
    g = torch.Generator().manual_seed(0)
    lam = tuple(tuple(torch.randn(3, *p.shape, generator=g, dtype=torch.float64) for p in part) for part in ref.state)
    flat = [torch.cat([x.reshape(3, -1) for x in part], 1) for part in lam]
    dw, new = up.pull(tr, _Saved.of(tr), tuple(flat))
    dw_ref, lam_ref = ref.pull(lam)
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max())
    assert len(new) == (1 if over.get("optimizer") == "sgd" else 3) == len(lam_ref)
    assert rel(dw, dw_ref) < 1e-6
    for k, (a, b) in enumerate(zip(new, lam_ref)):
        b = torch.cat([x.reshape(3, -1) for x in b], 1)
        assert rel(a, b) < (1e-6 if k == 0 else 1e-12), k


def test_query_chunks_change_no_bit(bank):
    # each cotangent's VJP is its own backward in a fresh buffer, the query gradients and the hand-written adjoint
    # elementwise: a query's rows and adjoints are bitwise the same in chunks of 1, 2 or all 3, with every state kept
    # or recomputed in segments of 4 (the kept states then serve every chunk)
    b = open_bank(bank)
    queries, hs = _queries(b), [5, 7, 14]
    runs = [adjoints(_trainer(b), queries, hs, first=0, keep={5, 10}, **kw)
            for kw in ({}, {"query_chunk": 1}, {"query_chunk": 2, "every": 4})]
    assert [r.query_chunk for r in runs] == [3, 1, 2] and runs[2].every == 4
    assert runs[1].vjps == 3 * 14 and runs[2].replayed == 14 + 2 * 10  # each chunk its own pass and recomputation
    for r in runs[1:]:
        for h in hs:
            assert np.array_equal(r.rows[h], runs[0].rows[h])
        assert r.at.keys() == runs[0].at.keys() == {5, 10}
        for t in r.at:
            assert r.at[t].keys() == runs[0].at[t].keys()
            for h in r.at[t]:
                assert all(torch.equal(x, y) for x, y in zip(r.at[t][h], runs[0].at[t][h]))
                assert r.at[t][h][0].shape[0] == len(queries)


def test_the_memory_budget_sets_the_spacing_and_the_chunks():
    from seedlab.attribution.estimators import metagrad as mg

    p = mg.plan(0, 11, [50, 100, 200], state_bytes=mg.STATE_BUDGET // 200, adjoint_bytes=mg.ADJOINT_BUDGET // 100)
    assert p.every == 1 and p.needed == 200 and p.held == 200 and p.recompute == 0  # all 200 states fit
    assert p.query_chunk == 11 and p.chunks == 1  # 11 × 3 adjoints of 1/100 of the budget
    p = mg.plan(0, 11, [200], state_bytes=mg.STATE_BUDGET // 40, adjoint_bytes=mg.ADJOINT_BUDGET // 2)
    assert p.every == 6 and p.held == 34 + 5 and p.recompute == 200 - 34  # ⌈200/6⌉ + 5 = 39 ≤ 40; k = 5: 40 + 4
    assert p.query_chunk == 2 and p.chunks == 6
    p = mg.plan(0, 3, [200], state_bytes=mg.STATE_BUDGET, adjoint_bytes=2 * mg.ADJOINT_BUDGET)
    assert p.every == 15 and p.query_chunk == 1  # nothing fits: the fewest states (⌈√200⌉), one query at a time
    p = mg.plan(0, 2, [20, 60], first=10, window=10)  # the rows of steps 10 .. 19 and 50 .. 59: every state kept
    assert p.firsts == {20: 10, 60: 50} and p.segments == [(t, t + 1) for t in [*range(10, 20), *range(50, 60)]]
    assert p.needed == 20 and p.replay == 60
    p = mg.plan(0, 2, [20, 60], first=10, window=10, every=4)
    assert p.segments == [(10, 14), (14, 18), (18, 20), (50, 54), (54, 58), (58, 60)]
    for kw, match in (({"every": 0}, "every"), ({"query_chunk": 0}, "query_chunk"), ({"window": 0}, "window")):
        with pytest.raises(SeedlabError, match=f"^metagrad: {match} must be at least 1"):
            mg.plan(0, 1, [5], **kw)


def test_truncated_metagrad_is_metagrad_inside_its_window_and_costs_less(bank, tmp_path):
    # the window W carries each horizon's adjoint back W steps: rows younger than W at h get metagrad's values bit for
    # bit (each cotangent's VJP its own), older rows none (0 as a row score); fewer VJPs (here 8 steps of 12)
    from seedlab.attribution.estimators.metagrad import TRUNCATED, truncated_rows

    b = open_bank(bank)
    queries, hs, W = _queries(b), [5, 7, 14], 3
    full = adjoints(_trainer(b), queries, hs, first=2)
    trunc = adjoints(_trainer(b), queries, hs, first=2, window=W)
    assert trunc.firsts == {5: 2, 7: 4, 14: 11} and full.firsts == {5: 2, 7: 2, 14: 2}
    for h in hs:
        assert np.array_equal(trunc.rows[h], full.rows[h][:, trunc.firsts[h] - 2 :])
    assert (full.vjps, trunc.vjps) == (12, 8) and trunc.replayed == full.replayed == 14
    df = rows_frame(0, trunc)
    assert (df.horizon - df.step).between(1, W).all() and len(df) == len(queries) * 4 * (3 + 3 + 3)
    # as a row estimator (rowscores.py's frame): every row before the horizon, −metagrad inside W, 0 outside
    rows = [(t, i) for t in (2, 4, 6, 12) for i in range(4)]
    f = truncated_rows(b, 0, rows, hs, torch.device("cpu"), window=W)
    assert set(f.estimator) == {TRUNCATED} and set(f.unit) == {"nats/token"}
    mg = rows_frame(0, full).set_index(["query", "horizon", "step", "row"]).value
    got = f.set_index(["query", "horizon", "step", "row"]).value
    assert len(got) == len(queries) * 4 * (2 + 3 + 4)  # the rows before 5, 7 and 14
    age = got.index.get_level_values("horizon") - got.index.get_level_values("step")
    inside = got[age <= W]
    assert np.array_equal(inside.to_numpy(), -mg.reindex(inside.index).to_numpy()) and (inside != 0).any()
    assert (got[age > W] == 0).all()
    # the estimator on the swapped row (attribute): metagrad at s + 1 and s + 3 (within W = 3 of s = 4), 0 at the end
    root = _copy(bank, tmp_path)
    attribute(root, estimators=[TRUNCATED], progress=False, add=True, settings=["attribute.metagrad_window=3"])
    df = pd.read_parquet(BankDir(root).attribution)
    keys = ["seed", "candidate", "query", "horizon"]
    m = df[df.estimator == "metagrad"].set_index(keys).estimate
    t = df[df.estimator == TRUNCATED].set_index(keys).estimate.reindex(m.index)
    h = m.index.get_level_values("horizon")
    assert np.array_equal(t[h <= 7].to_numpy(), m[h <= 7].to_numpy()) and (m[h <= 7] != 0).any()
    assert (t[h == 14] == 0).all() and (m[h == 14] != 0).any()
    assert set(df[df.estimator == TRUNCATED].estimator_label) == {"variant"}
