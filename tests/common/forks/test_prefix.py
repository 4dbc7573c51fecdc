"""forks/prefix.py: the shared prefix (trained once, kept, forked), advance_to's injection and stops,
the replica control and the hash comparisons."""

from types import SimpleNamespace

import numpy as np
import pytest

from seedlab.errors import SeedlabError
from seedlab.lm.distributed import World
from seedlab.forks.arms import injection
from seedlab.forks.prefix import SharedPrefix, advance_to, check_identical, first_difference, read_prefix, replica_control
from seedlab.lm.model import GPTConfig
from seedlab.lm.trainer import Trainer
from seedlab.store import tensor_hashes

pytestmark = pytest.mark.usefixtures("one_thread")
CFG = SimpleNamespace(steps=12, batch_size=2, micro_batch=None, peak_lr=1e-2, min_lr=0.0, weight_decay=0.1, beta1=0.9,
                      beta2=0.95, grad_clip=1.0, device="cpu", precision="fp32", warmup_steps=4)
GCFG = GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)
TOKENS = np.random.default_rng(0).integers(0, 16, 400).astype(np.uint16)


def _new() -> Trainer:
    return Trainer(CFG, GCFG, 0, TOKENS)


def test_the_prefix_is_trained_once_saved_and_forked(tmp_path):
    steps = []
    prefix = SharedPrefix(tmp_path / "prefix.safetensors", _new, 4, on_step=lambda: steps.append(1))
    a, losses = prefix.fork()
    b, _ = prefix.fork()
    assert (a.step, b.step, len(losses), len(steps)) == (4, 4, 4, 4) and prefix.saved
    advance_to(a, 6)  # a fork moves alone
    kept, _ = prefix.kept()
    assert kept.step == 4 and tensor_hashes(b.weights()) == tensor_hashes(kept.weights())
    again = SharedPrefix(tmp_path / "prefix.safetensors", _new, 4)  # read back, not trained
    assert tensor_hashes(again.fork()[0].weights()) == tensor_hashes(kept.weights())
    with pytest.raises(SeedlabError, match="holds the state after 4 updates, not 5"):
        SharedPrefix(tmp_path / "prefix.safetensors", _new, 5).kept()


def test_read_prefix_checks_the_step_and_the_manifest(tmp_path):
    """The one reader of a kept prefix (the prefix itself, gradmatch, the estimators): the state at the
    fork step, every tensor's hash checked, its weights also against a run's manifest when given."""
    path = tmp_path / "prefix.safetensors"
    kept, losses = SharedPrefix(path, _new, 4).kept()
    trainer = _new()
    assert read_prefix(trainer, path, 4) == losses and tensor_hashes(trainer.weights()) == tensor_hashes(kept.weights())
    with pytest.raises(SeedlabError, match=rf"^{path}: holds the state after 4 updates, not 5$"):
        read_prefix(_new(), path, 5)
    read_prefix(_new(), path, 4, {"4": tensor_hashes(kept.weights())})
    with pytest.raises(SeedlabError, match=r"do not match manifest.json \(corrupted checkpoint\)"):
        read_prefix(_new(), path, 4, {"4": {k: "0" * 64 for k in tensor_hashes(kept.weights())}})


@pytest.mark.serial  # two gloo ranks of its own
def test_under_torchrun_only_rank_0_writes_the_prefix(tmp_path):
    path = tmp_path / "prefix.safetensors"
    trainer, losses = SharedPrefix(path, _new, 4, world=World(rank=1, size=2)).kept()
    assert (trainer.step, len(losses)) == (4, 4) and not path.exists()  # trained, kept, not written


def test_injection_stops_and_the_replica_control():
    prefix = SharedPrefix(None, _new, 4)
    seen, record = [], {}

    def visit(tr):
        seen.append(tr.step)
        record[str(tr.step)] = tensor_hashes(tr.weights())

    twin, _ = prefix.fork()
    advance_to(twin, 8, stops={4, 5, 8}, visit=visit)
    assert seen == [4, 5, 8]
    assert replica_control(prefix.fork()[0], record, 8, what="the replica") == [4, 5, 8]
    injected, _ = prefix.fork()
    advance_to(injected, 5, arm=injection("x", [1, 2, 3], 4, 0))
    assert first_difference(record["5"], tensor_hashes(injected.weights())) is not None
    assert first_difference(record["4"], record["4"]) is None
    record["8"] = dict(record["8"], **{"wte.weight": "0" * 64})
    with pytest.raises(SeedlabError, match=r"the replica differs from the run it repeats at step 8 in tensor 'wte.weight'"):
        replica_control(prefix.fork()[0], record, 8, what="the replica")
    with pytest.raises(SeedlabError, match=r"^seed 0: the replica control differs from the twin at step 8 in tensor"):
        replica_control(prefix.fork()[0], record, 8, what="seed 0: the replica control", repeats="the twin")


def test_check_identical_names_the_first_difference():
    a = {"x": "1", "y": "2"}
    check_identical({"twin": a, "other": dict(a)}, "seed 0")
    with pytest.raises(SeedlabError, match=r"seed 0: other differs from twin in tensor 'y'"):
        check_identical({"twin": a, "other": {"x": "1", "y": "3"}}, "seed 0")
    with pytest.raises(SeedlabError, match=r"^seed 0: other differs from twin at step 8 in tensor 'y'"):
        check_identical({"twin": a, "other": {"x": "1", "y": "3"}}, "seed 0", 8)
