"""forks/loop.py: a design no study ships, declared in a few lines of arms and run by the one loop;
bad arms refused before anything is written; the replica control failing fast; the environment."""

import json

import pytest
import torch

from seedlab.errors import SeedlabError
from seedlab.forks.arms import TWIN, Arm, Perturbation, injection
from seedlab.forks.design import ForkDesign
from seedlab.forks.folders import DesignFolder
from seedlab.machine import environment
from seedlab.forks.loop import Design, Observer, Recording, run_design
from seedlab.lm.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")
S, END = 4, 28  # the fork step and the end of the tiny design
TEXT = list(b"Gizmo Harrington mends clocks.")


@pytest.fixture(scope="module")
def corpus(twins_inputs):
    from seedlab.corpus import load

    return load(twins_inputs[0])


def design(corpus, root, arms, *, observer=None, **over):
    cfg = ForkDesign(**{"corpus": str(corpus.path), "model": "mini", "block_size": 32, "batch_size": 4, "steps": END,
                        "injection_step": S, "seeds": [0], "peak_lr": 1e-2, "threads": 1, **over})
    every = frozenset(range(S, END + 1))  # every step's hashes: where each run differs from the twin is visible
    names = {a.name for a in arms}
    return Design(cfg=cfg, gcfg=cfg.gpt_config(corpus.vocab_size), tokens=corpus.train, pad_id=corpus.eot_id,
                  folder=DesignFolder(root), arms=lambda seed: arms, recording=Recording(hashed=dict.fromkeys(names, every)),
                  observer=observer or Observer(), start=lambda: DesignFolder(root).start({"design": "test"}, {}, {}))


def first_difference_step(a: dict, b: dict) -> int | None:
    return next((int(t) for t in sorted(a, key=int) if a[t] != b[t]), None)


def test_a_passage_repeated_at_three_steps_differs_from_the_twin_exactly_there(corpus, tmp_path, monkeypatch):
    """A design no study ships, in four lines of arms: the passage at s, at s and s+10, at s, s+10 and s+20.
    Each batch the trainer saw carries the passage at exactly the arm's steps, and two arms that share
    their first injections are bitwise equal until the first step where one injects and the other does not."""
    arms = [TWIN,
            injection("once", TEXT, S, 1),
            Arm("twice", {(S, 1): TEXT, (S + 10, 1): TEXT}),
            Arm("thrice", {(S, 1): TEXT, (S + 10, 1): TEXT, (S + 20, 1): TEXT})]
    injected: dict[int, list[int]] = {}
    alive: list[Trainer] = []  # kept, so that no trainer's id is reused by a later one
    advance = Trainer.advance

    def spy(self, rows=None, **kw):
        if id(self) not in injected:
            alive.append(self)
        injected.setdefault(id(self), []).extend([self.step] if rows else [])
        return advance(self, rows, **kw)

    monkeypatch.setattr(Trainer, "advance", spy)
    integrity, losses = run_design(design(corpus, tmp_path / "d", arms, arm_batch=1))  # the serial loop (stacked: test_stacked.py)
    assert sorted(v for v in injected.values() if v) == [[S], [S, S + 10], [S, S + 10, S + 20]]
    m = {a.name: DesignFolder(tmp_path / "d").run(0, a.name).read_manifest() for a in arms}
    assert all(m[a.name][str(S)] == m["twin"][str(S)] for a in arms)  # identical at the fork
    assert first_difference_step(m["twin"], m["once"]) == S + 1  # the injected batch moves the weights of s + 1
    assert first_difference_step(m["once"], m["twice"]) == S + 11
    assert first_difference_step(m["twice"], m["thrice"]) == S + 21
    assert integrity["seeds"]["0"]["replica"]["steps_compared"] == list(range(S, END + 1))
    assert integrity["seeds"]["0"]["replica_early"]["steps_compared"] == [S, S + 1]  # right after the twin
    assert set(losses.arm) == {"twin", "once", "twice", "thrice"} and len(losses) == 4 * END


def test_a_perturbation_is_the_twin_at_s_and_differs_after(corpus, tmp_path):
    w = "blocks.0.mlp.c_fc.weight"
    nudge = Arm("nudge", perturbation=Perturbation(S, {w: torch.zeros(256, 64).index_fill_(0, torch.tensor([3]), 1e-3)}))
    run_design(design(corpus, tmp_path / "d", [TWIN, nudge]))
    m = {a: DesignFolder(tmp_path / "d").run(0, a).read_manifest() for a in ("twin", "nudge")}
    assert first_difference_step(m["twin"], m["nudge"]) == S + 1


@pytest.mark.parametrize("arms, error", [
    ([TWIN, injection("early", TEXT, S - 1, 0)], r"^arm early: injects at step 3, outside the forked run \(steps 4 \.\. 27"),
    ([TWIN, injection("late", TEXT, END, 0)], r"^arm late: injects at step 28, outside the forked run"),
    ([TWIN, injection("row", TEXT, S, 4)], r"^arm row: injects into row 4, but a batch has rows 0 \.\. 3$"),
    ([TWIN, injection("a", TEXT, S, 0), injection("a", TEXT, S, 1)], r"^arms: two arms are named 'a'"),
    ([TWIN, injection("long", list(range(40)), S, 0)], r"^arm long \(step 4, row 0\): 40 tokens do not fit"),
    ([TWIN, Arm("bad", perturbation=Perturbation(S, {"wte": torch.zeros(1)}))], r"^arm bad: a delta for 'wte' of shape"),
    ([TWIN, injection("a/b", TEXT, S, 0)], r"^arm name: letters, digits"),
    ([injection("a", TEXT, S, 0), TWIN], r"^arms: the first arm must be the twin"),
])
def test_bad_arms_are_refused_before_anything_is_written(corpus, tmp_path, arms, error):
    with pytest.raises(SeedlabError, match=error) as err:
        run_design(design(corpus, tmp_path / "d", arms))
    assert "\n" not in str(err.value) and not (tmp_path / "d").exists()


def test_the_replica_control_fails_fast(corpus, tmp_path, monkeypatch):
    """A replica that is not bitwise the twin stops the design at the twin's first recorded step after
    s, before any other arm has run."""

    class Drift(Observer):  # the replica's updates are off by a rounding error (a non-deterministic kernel)
        def run(self, label, steps, done=0):
            self.replica = "replica" in label

    drift = Drift()
    advance = Trainer.advance

    def noisy(self, rows=None, **kw):
        loss = advance(self, rows, **kw)
        if getattr(drift, "replica", False):
            with torch.no_grad():
                next(self.model.parameters()).mul_(1 + 1e-7)
        return loss

    monkeypatch.setattr(Trainer, "advance", noisy)
    arms = [TWIN, injection("other", TEXT, S, 0)]
    d = design(corpus, tmp_path / "d", arms, observer=drift, arm_batch=1)  # the serial loop (stacked: test_stacked.py)
    d.recording = Recording(hashed={"twin": frozenset({S, S + 3, END}), "other": frozenset({S, END})})
    with pytest.raises(SeedlabError, match=rf"^seed 0: the replica control differs from the twin at step {S + 3} in"):
        run_design(d)
    assert DesignFolder(tmp_path / "d").run(0, "twin").finished and not (tmp_path / "d" / "seed-0" / "other").exists()


def test_a_resume_under_another_environment_is_refused(tmp_path):
    env = environment(torch.device("cpu"), "fp32")
    assert env["device"] == "cpu" and env["threads"] == torch.get_num_threads() and env["torch"] == torch.__version__
    folder = DesignFolder(tmp_path)
    folder.check_environment(env, allow_change=False)  # nothing recorded yet
    folder.start({"design": 1}, {}, env)
    folder.check_environment(env, allow_change=False)  # the same environment resumes
    other = env | {"threads": env["threads"] + 1}
    with pytest.raises(SeedlabError, match=rf"^environment: .* was started with threads = {env['threads']}, now "
                                           rf"{env['threads'] + 1} \(bitwise identity holds on one environment only\)"):
        folder.check_environment(other, allow_change=False)
    folder.check_environment(other, allow_change=True)
    folder.start({"design": 1}, {}, other)
    record = json.loads(folder.environment.read_text())
    assert record["environment"] == env and record["changes"] == [other]
