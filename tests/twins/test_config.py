"""The twins config: the shipped presets, and the GPT a design trains."""

import pytest

from seedlab.twins.config import TwinsConfig


@pytest.mark.parametrize("name", ["mini", "mini-long", "gpt2-124m"])
def test_shipped_twins_configs_are_valid(name):
    """Every preset parses, its passages exist, and its checkpoints include the paper's time points."""
    from seedlab.config import load_config

    cfg, base = load_config(TwinsConfig, "twins", name)
    for cond in ("fluent-fabricated", "fluent-attested"):
        assert (base / cfg.passages[cond]).is_file()
    s = cfg.injection_step
    assert {s, s + 50, cfg.mid, cfg.steps} <= set(cfg.checkpoint_steps())
    for cond, subject in cfg.subjects.items():  # each passage is about the subject the config names
        from seedlab.corpus import whole_word

        assert whole_word(subject).search((base / cfg.passages[cond]).read_text()), (cond, subject)
    if name == "gpt2-124m":  # the paper's protocol
        assert (len(cfg.seeds), cfg.steps, cfg.batch_size, s, cfg.peak_lr, cfg.mid) == (8, 9536, 256, 200, 6e-4, 5050)
        assert cfg.micro_batch * cfg.gpt_config(50257).block_size * 50257 * 4 < 8e9  # one micro-batch's fp32 logits
        assert cfg.batch_size % cfg.micro_batch == 0


def test_the_gpt2_passages_have_the_papers_length():
    """194 GPT-2 tokens each, as the paper's passages."""
    from seedlab.config import load_config
    from seedlab.corpus.tokenizers import TiktokenGPT2

    pytest.importorskip("tiktoken")
    cfg, base = load_config(TwinsConfig, "twins", "gpt2-124m")
    gpt2 = TiktokenGPT2()
    for cond in ("fluent-fabricated", "fluent-attested"):
        assert len(gpt2.encode((base / cfg.passages[cond]).read_text().strip())) == 194, cond


def test_gpt_config_is_the_preset_with_the_corpus_vocabulary():
    from seedlab.lm.model import PRESETS

    cfg = TwinsConfig(corpus="c", model="mini")
    assert cfg.gpt_config(2048) == PRESETS["mini"].model_copy(update={"vocab_size": 2048})
    short = TwinsConfig(corpus="c", model="mini", block_size=64).gpt_config(257)
    assert (short.vocab_size, short.block_size, short.n_layer) == (257, 64, PRESETS["mini"].n_layer)


@pytest.mark.parametrize("name", ["mini", "mini-long", "gpt2-124m"])
def test_the_presets_nulls(name):
    """Four ordinary rows (a distribution), gradient noise (the default noise null) and the weight kick
    beside it, the nudge; the TOST margin of "any row's" pre-registered (in preregistration()'s measure settings)."""
    from seedlab.config import load_config

    cfg, _ = load_config(TwinsConfig, "twins", name)
    assert cfg.nulls.ordinary_rows == 4 and {"ordinary-row", "nudge", "matched-gradient", "weight-kick"} <= set(cfg.conditions)
    assert [a for a in cfg.arm_names if a.startswith("ordinary-row")] == [f"ordinary-row.{i}" for i in range(4)]
    assert cfg.preregistration()["measure"]["ordinary_margin"] == cfg.measure.ordinary_margin == 0.25


def test_the_renamed_noise_null_is_refused_by_name_and_the_arms_are_named():
    from seedlab.config import parse
    from seedlab.errors import SeedlabError

    with pytest.raises(SeedlabError, match=r"^conditions: 'matched-noise' is no longer a condition \(the noise null was split by channel\): name "
                                           r"'matched-gradient' .* and/or 'weight-kick'"):
        parse(TwinsConfig, {"corpus": "c", "conditions": ["twin", "fluent-fabricated", "matched-noise"]})
    with pytest.raises(SeedlabError, match=r"^nulls.noise_like: matched-gradient takes its size from 'fluent-fabricated'"):
        parse(TwinsConfig, {"corpus": "c", "conditions": ["twin", "matched-gradient"]})
    one = parse(TwinsConfig, {"corpus": "c", "conditions": ["twin", "ordinary-row", "nudge"], "nulls": {"ordinary_rows": 1}})
    assert one.arm_names == ["twin", "ordinary-row.0", "nudge"]
    assert parse(TwinsConfig, {"corpus": "c", "measure": {"ordinary_margin": None}}).measure.ordinary_margin is None
    with pytest.raises(SeedlabError, match=r"^measure.ordinary_margin: Input should be greater than 0"):
        parse(TwinsConfig, {"corpus": "c", "measure": {"ordinary_margin": 0}})


@pytest.mark.parametrize("over, message", [({"seeds": [0, 0]}, "seeds: seed 0 is named twice"),
                                           ({"seeds": [0, 1], "replicas": [1, 1]}, "replicas: seed 1 is named twice")])
def test_a_seed_named_twice_is_refused_before_anything_runs(seedlab_main, tmp_path, over, message):
    """`twins run mini --set seeds=[0,0]` stops with one line and exit 2 (it once started training)."""
    sets = [a for k, v in over.items() for a in ("--set", f"{k}={v}")]
    code, out, err = seedlab_main("twins", "run", "mini", "--out", "runs/x", *sets)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()
