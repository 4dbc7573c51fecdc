"""Every condition of a twins design, registered once: the twin, the passages and the nulls.

A condition is a :class:`Variant`: its name (as ``conditions`` spells it), its role (the twin; a passage,
whose own text is measured; a null, what a difference looks like without the passage), the channel it
acts through (``data``: a text in the injected row; ``gradient``: the raw batch gradient of s, so the clip
and both AdamW moments; ``weights``: the weights at s; ``optimizer``: AdamW's state at s; ``none``: the
twin), how it perturbs (``build``: its arms, forks/arms.py), the text it injects (``text``: a data
variant's token ids, recorded in inputs.json and measured on every run), its colour in every figure and
what it is, in words.

:data:`VARIANTS` holds them in the default design's order. Config validation (twins/config.py), the run's
passages and arms (twins/passages.py, twins/train.py), the statistics, the report and the figures read it:
a new null is one entry here and the function that builds its arm, e.g.

    def half_kick(inputs: ArmInputs, v: Variant) -> list[Arm]:
        from seedlab.forks.arms import weight_kick
        ...

    VARIANTS["half-kick"] = Variant("half-kick", "null", "weights", "tab:cyan", "a weight kick of half the "
                                    "passage's update size", half_kick, sized=True)

(:func:`register` does the same at run time, refusing a name taken). Nothing here imports torch: the
functions that build arms and texts import what they need when called, so the reports stay torch-free.

**Row-weight arms.** A data variant marked ``row_weighted`` (the passages and the ordinary rows) is also trained,
for every loss weight w of the design's ``row_weights``, with its first arm's text in the injected row at loss
weight w (forks/arms.py ``injection(weight=w)``): the arm ``<arm>@w<w>`` (:func:`weighted_name`:
``fluent-fabricated@w0.25``, ``ordinary-row.0@w0.5``), built by :func:`weighted_arms`, read back by
:func:`split_weight`. Such an arm belongs to its variant (:func:`variant_of`, drawn in a lighter shade of its colour)
but is none of its plain arms: a pooled variant's distribution (``ordinary-row.<i>``) does not hold it.
"""

from __future__ import annotations

import colorsys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from seedlab.errors import SeedlabError

Role = Literal["twin", "passage", "null"]
Channel = Literal["none", "data", "gradient", "weights", "optimizer"]
#: what each channel means, for the report and the docs
CHANNELS: dict[str, str] = {
    "none": "nothing differs",
    "data": "a text in the injected row of the batch of s",
    "gradient": "the raw batch gradient of s (through the clip and AdamW's moments, as a row's)",
    "weights": "the weights at s, once",
    "optimizer": "AdamW's state at s",
}

#: the two fluent passages the study compares (fabricated subject vs attested subject)
FAB, ATT = "fluent-fabricated", "fluent-attested"
FLUENT = (FAB, ATT)
#: the null whose arms are ordinary held-out rows in the passage's place (``ordinary-row.<i>``)
ORDINARY = "ordinary-row"
#: how a row-weight arm is named: ``<arm>@w<w>`` (module doc)
WEIGHT_MARK = "@w"


def weighted_name(arm: str, w: float) -> str:
    """The arm that injects ``arm``'s text at loss weight ``w``: ``<arm>@w<w>``, w as Python writes it back exactly."""
    return f"{arm}{WEIGHT_MARK}{float(w)!r}"


def split_weight(arm: str) -> tuple[str, float]:
    """(the arm it weights, the row's loss weight) of a run's condition: ``fluent-fabricated@w0.25`` ->
    (``fluent-fabricated``, 0.25); an arm without a weight -> (itself, 1.0)."""
    head, mark, w = arm.rpartition(WEIGHT_MARK)
    if not mark or not head:
        return arm, 1.0
    try:
        return head, float(w)
    except ValueError:
        return arm, 1.0


@dataclass(frozen=True)
class ArmInputs:
    """What a variant's ``build`` reads: the design (a :class:`~seedlab.twins.config.TwinsConfig`), every
    injected text (``{arm name: token ids}``, twins/passages.py ``load_passages``) and the corpus's pad id."""

    cfg: Any
    texts: Mapping[str, list[int]]
    pad_id: int

    @property
    def like(self):
        """The arm whose size a sized null takes (``nulls.noise_like``; a pooled variant: its first arm), as its
        injection of its own text; the twin when that text is not loaded."""
        from seedlab.forks.arms import TWIN, injection

        v = VARIANTS[self.cfg.nulls.noise_like]
        name = v.arm_names(self.cfg)[0] if v.count else v.name
        if name not in self.texts:
            return TWIN
        return injection(name, self.texts[name], self.cfg.injection_step, self.cfg.injection_row)


@dataclass(frozen=True)
class TextInputs:
    """What a variant's ``text`` reads: the design, the config file's folder (passage files are relative to it),
    the corpus (its tokenizer and splits) and the texts of the variants before it in :data:`VARIANTS`."""

    cfg: Any
    base: Path
    corpus: Any
    texts: Mapping[str, list[int]]
    seed: int | None = None  # the training seed whose texts are drawn (a text drawn per seed); None: the shared texts


@dataclass(frozen=True)
class Variant:
    """One condition of the design (module doc). ``label``: how the report names it in running text (default its
    name); ``sized``: it takes its size from ``nulls.noise_like``'s passage at s, which the design must then
    train; ``count``: several arms ``<name>.<i>``, i < count(cfg), compared as one distribution under the name
    ``pooled`` (the ordinary rows); ``formerly``: names it was measured under before (read as this one);
    ``row_weighted``: its first arm is also trained at each of the design's ``row_weights`` (module doc)."""

    name: str
    role: Role
    channel: Channel
    color: str
    description: str
    build: Callable[[ArmInputs, Variant], list]
    text: Callable[[TextInputs, Variant], dict[str, list[int]]] | None = None
    label: str = ""
    sized: bool = False
    count: Callable[[Any], int] | None = None
    pooled: str = ""
    formerly: tuple[str, ...] = ()
    row_weighted: bool = False

    @property
    def said(self) -> str:
        """The name the report uses in running text."""
        return self.label or self.name

    @property
    def group(self) -> str:
        """The name its arms are compared under: ``pooled`` for a pooled variant, else its name."""
        return self.pooled or self.name

    def arm_names(self, cfg) -> list[str]:
        """Its runs' folder names in the design ``cfg``: ``<name>.0`` .. for a pooled variant, else its name."""
        return [f"{self.name}.{i}" for i in range(self.count(cfg))] if self.count else [self.name]

    def weighted_names(self, cfg) -> list[str]:
        """Its row-weight arms in the design ``cfg``: its first arm at each of ``row_weights``, in that order (none
        unless ``row_weighted``)."""
        if not self.row_weighted:
            return []
        first = self.arm_names(cfg)[0]
        return [weighted_name(first, w) for w in getattr(cfg, "row_weights", [])]

    def owns(self, arm: str) -> bool:
        """Whether ``arm`` (a run's condition, as measured) is one of this variant's: its name, a former name, or
        for a pooled variant ``<name>.<i>``."""
        if arm == self.name or arm in self.formerly:
            return True
        head, _, i = arm.rpartition(".")
        return bool(self.count) and head == self.name and i.isdigit()


# ---------------------------------------------------------------- how each variant builds its arms


def twin_arm(inputs: ArmInputs, v: Variant) -> list:
    """The twin: nothing differs."""
    from seedlab.forks.arms import TWIN

    return [TWIN]


def inject_texts(inputs: ArmInputs, v: Variant) -> list:
    """A data variant: each of its arms' texts in row ``injection_row`` of the batch of s."""
    from seedlab.forks.arms import injection

    cfg = inputs.cfg
    return [injection(a, inputs.texts[a], cfg.injection_step, cfg.injection_row) for a in v.arm_names(cfg)]


def weighted_arms(inputs: ArmInputs, v: Variant) -> list:
    """A row-weighted variant's arms at the design's ``row_weights``: its first arm's text in row ``injection_row``
    of the batch of s at loss weight w (forks/arms.py ``injection``), named by :func:`weighted_name`."""
    from seedlab.forks.arms import injection

    cfg = inputs.cfg
    first = v.arm_names(cfg)[0]
    return [injection(weighted_name(first, w), inputs.texts[first], cfg.injection_step, cfg.injection_row, weight=w)
            for w in getattr(cfg, "row_weights", [])] if v.row_weighted else []


def nudge_arm(inputs: ArmInputs, v: Variant) -> list:
    """One weight element (``nulls.nudge_tensor``, ``nudge_index``) one ulp up at s."""
    from seedlab.forks.arms import nudge

    n = inputs.cfg.nulls
    return [nudge(v.name, inputs.cfg.injection_step, n.nudge_tensor, n.nudge_index)]


def matched_gradient_arm(inputs: ArmInputs, v: Variant) -> list:
    """A random direction added to the raw gradient of s, as long as ``nulls.noise_like``'s own batch-gradient
    difference: through the clip and AdamW's moments as a row."""
    from seedlab.forks.arms import matched_gradient

    cfg = inputs.cfg
    return [matched_gradient(v.name, inputs.like, cfg.injection_step, cfg.nulls.noise_seed, inputs.pad_id)]


def sign_gradient_arm(inputs: ArmInputs, v: Variant) -> list:
    """``nulls.noise_like``'s own batch-gradient difference with random signs per coordinate: its norm and its size
    in every coordinate, no direction."""
    from seedlab.forks.arms import sign_gradient

    cfg = inputs.cfg
    return [sign_gradient(v.name, inputs.like, cfg.injection_step, cfg.nulls.noise_seed, inputs.pad_id)]


def weight_kick_arm(inputs: ArmInputs, v: Variant) -> list:
    """matched-gradient's direction in the weights at s, as long as ``nulls.noise_like``'s update difference."""
    from seedlab.forks.arms import weight_kick

    cfg = inputs.cfg
    return [weight_kick(v.name, inputs.like, cfg.injection_step, cfg.nulls.noise_seed, inputs.pad_id)]


# ---------------------------------------------------------------- the texts the data variants inject


def fluent_text(t: TextInputs, v: Variant) -> dict[str, list[int]]:
    """A fluent passage: the text file ``passages.<name>`` (relative to the config's folder), which must mention
    its subject (``subjects.<name>``) as a whole word, encoded with the corpus's tokenizer."""
    from seedlab.corpus import whole_word

    cond = v.name
    if cond not in t.cfg.passages:
        raise SeedlabError(f"passages.{cond}: name a text file for this condition")
    path = t.base / t.cfg.passages[cond]
    if not path.is_file():
        raise SeedlabError(f"passages.{cond}: no such file {str(path)!r}")
    text = path.read_text().strip()
    subject = t.cfg.subjects.get(cond)
    if subject and not whole_word(subject).search(text):
        raise SeedlabError(f"passages.{cond}: {str(path)!r} does not mention its subject {subject!r} (subjects.{cond})")
    return {cond: t.corpus.encode(text)}


def random_chars_text(t: TextInputs, v: Variant) -> dict[str, list[int]]:
    """Random keyboard text (``random.Random(random_chars_seed)``) grown until it has ``random_chars_tokens``
    tokens (default: as many as the fabricated, else the attested, passage)."""
    import random
    import string

    fluent = t.texts.get(FAB) or t.texts.get(ATT)
    n = t.cfg.random_chars_tokens or (len(fluent) if fluent else None)
    if n is None:
        raise SeedlabError("random_chars_tokens: set the passage length when the design has no fluent passage")
    rng = random.Random(t.cfg.random_chars_seed)
    keys = string.ascii_letters + string.digits + string.punctuation + " "
    ids: list[int] = []
    text = ""
    while len(ids) < n:  # grow random keyboard text until it has the same token length
        text += rng.choice(keys)
        ids = t.corpus.encode(text)
    return {v.name: ids[:n]}


def ordinary_texts(t: TextInputs, v: Variant) -> dict[str, list[int]]:
    """The ordinary rows, ``{<name>.<i>: token ids}``: ``nulls.ordinary_rows`` different stretches of the held-out
    split's reserved slice (never trained on, never evaluated on: twins/heldout.py ``ordinary_rows``), each as long
    as the fabricated (else attested, else random-chars) passage, chosen by ``random.Random(nulls.ordinary_row_seed)``:
    ordinary rows of the corpus's own text in place of the passage. With ``nulls.ordinary_rows_per_seed`` each
    training seed draws its own (twins/heldout.py ``ordinary_draw``: the row seed and the training seed mixed), and
    the shared texts (``t.seed`` None) hold none."""
    from seedlab.twins.heldout import ordinary_draw, ordinary_rows

    per_seed = t.cfg.nulls.ordinary_rows_per_seed
    if per_seed and t.seed is None:
        return {}  # drawn for each training seed (twins/passages.py seed_passages)
    like = next((t.texts[c] for c in (FAB, ATT, "random-chars") if c in t.texts), None)
    n = len(like) if like else t.cfg.random_chars_tokens
    if n is None:
        raise SeedlabError(f"random_chars_tokens: set the passage length when the design has no passage ({v.name})")
    block = t.cfg.gpt_config(t.corpus.vocab_size).block_size
    draw = ordinary_draw(t.cfg.nulls.ordinary_row_seed, t.seed if per_seed else None)
    rows = ordinary_rows(t.corpus.heldout, block, n, t.cfg.nulls.ordinary_rows, draw, per_seed=per_seed)
    return dict(zip(v.arm_names(t.cfg), rows))


def _ordinary_count(cfg) -> int:
    return cfg.nulls.ordinary_rows


# ---------------------------------------------------------------- the registry

#: every condition, in the default design's order (``TwinsConfig.conditions``); the nulls in this order in the report
VARIANTS: dict[str, Variant] = {
    "twin": Variant("twin", "twin", "none", "k", "the ordinary run, every condition's baseline", twin_arm),
    FAB: Variant(FAB, "passage", "data", "tab:red", "a fluent passage about a subject the training split never "
                 "mentions", inject_texts, text=fluent_text, row_weighted=True),
    ATT: Variant(ATT, "passage", "data", "tab:blue", "a fluent passage about a subject the training split mentions",
                 inject_texts, text=fluent_text, row_weighted=True),
    "random-chars": Variant("random-chars", "passage", "data", "tab:green", "random keyboard characters, as many "
                            "tokens as the fluent passage", inject_texts, text=random_chars_text, row_weighted=True),
    ORDINARY: Variant(ORDINARY, "null", "data", "tab:orange", "the ordinary rows (any row's effect)", inject_texts,
                      text=ordinary_texts, label="the ordinary rows", count=_ordinary_count, pooled="ordinary-rows",
                      row_weighted=True),
    "nudge": Variant("nudge", "null", "weights", "tab:purple", "a one-ulp nudge (chaos alone)", nudge_arm),
    "matched-gradient": Variant("matched-gradient", "null", "gradient", "tab:brown", "gradient noise of the passage's "
                                "size (a perturbation of that size, through the clip and AdamW's moments as a row)",
                                matched_gradient_arm, sized=True),
    "sign-gradient": Variant("sign-gradient", "null", "gradient", "tab:pink", "the passage's own gradient with random "
                             "signs per coordinate (its size in every coordinate and channel, no direction)",
                             sign_gradient_arm, sized=True),
    "weight-kick": Variant("weight-kick", "null", "weights", "tab:olive", "a weight kick of the passage's update size "
                           "(once, at s)", weight_kick_arm, sized=True, formerly=("matched-noise",)),
}
#: the colour of twins of different seeds (the baseline every normalized measure divides by), in every figure
SEED_COLOR = "0.4"


def register(v: Variant) -> Variant:
    """Add ``v`` to :data:`VARIANTS` (a study or a test registering a condition of its own); a name taken, or a
    role or channel not known, is a one-line error."""
    if v.name in VARIANTS or any(v.name in w.formerly for w in VARIANTS.values()):
        raise SeedlabError(f"variant {v.name!r}: that name is registered already")
    if WEIGHT_MARK in v.name:
        raise SeedlabError(f"variant {v.name!r}: {WEIGHT_MARK!r} marks a row-weight arm and is not part of a name")
    if v.role not in ("twin", "passage", "null") or v.channel not in CHANNELS:
        raise SeedlabError(f"variant {v.name!r}: role {v.role!r} / channel {v.channel!r} (roles: twin, passage, null; "
                           f"channels: {', '.join(CHANNELS)})")
    VARIANTS[v.name] = v
    return v


def variant_of(arm: str) -> Variant | None:
    """The variant a run's condition belongs to (its name, a former name, a pooled variant's ``<name>.<i>``, or a
    row-weight arm ``<arm>@w<w>`` of one of those: :func:`split_weight`)."""
    if arm in VARIANTS:
        return VARIANTS[arm]
    base, w = split_weight(arm)
    if base != arm:
        v = variant_of(base)
        return v if v is not None and v.row_weighted else None
    return next((v for v in VARIANTS.values() if v.owns(arm)), None)


def names(role: Role) -> list[str]:
    """The registered conditions of one role, in registry order."""
    return [v.name for v in VARIANTS.values() if v.role == role]


def null_groups() -> list[str]:
    """The nulls as the statistics compare them, in registry order: a pooled null under its ``pooled`` name."""
    return [v.group for v in VARIANTS.values() if v.role == "null"]


def null_variant(group: str) -> Variant:
    """The null compared under ``group`` (:func:`null_groups`)."""
    return next(v for v in VARIANTS.values() if v.role == "null" and v.group == group)


def current_names() -> dict[str, str]:
    """Conditions as measured by an older seedlab -> today's: a former name -> its variant's, a pooled variant's
    bare name (one arm, before it became a distribution) -> ``<name>.0``."""
    old = {f: v.name for v in VARIANTS.values() for f in v.formerly}
    return old | {v.name: f"{v.name}.0" for v in VARIANTS.values() if v.count}


def _shade(color: str, i: int) -> tuple[float, float, float]:
    """The ``i``-th shade of ``color`` (0: itself): its hue at another lightness and saturation, so the arms of one
    pooled variant are told apart and read as one family. Lightness steps darker, lighter, two steps darker,
    lighter (shades 0-4), then the same five less saturated (5-9, 10-14); past 14 the lightness range is filled
    by halving (a van der Corput sequence) at the lowest saturation: every shade its own."""
    from matplotlib.colors import to_rgb

    h, l, s = colorsys.rgb_to_hls(*to_rgb(color))
    lo, hi = 0.2, 0.85
    ladder = [min(max(x, lo), hi) for x in (l, l - 0.14, l + 0.14, l - 0.26, l + 0.24)]
    tier, j = divmod(i, len(ladder))
    if tier < 3:
        return colorsys.hls_to_rgb(h, ladder[j], s * (1 - 0.3 * tier))
    k, frac, base = i - 14, 0.0, 0.5
    while k:
        frac, k, base = frac + base * (k & 1), k >> 1, base / 2
    return colorsys.hls_to_rgb(h, lo + frac * (hi - lo), s * 0.2)


def color(arm: str):
    """The one colour of a run's condition (or ``"seed"``: twins of different seeds) in every figure: its variant's;
    a pooled variant's arm ``<name>.<i>`` a shade of it of its own (:func:`_shade`), its group name the variant's; a
    row-weight arm ``<arm>@w<w>`` its arm's, mixed with white by 0.6·(1 − w)."""
    if arm == "seed":
        return SEED_COLOR
    base, w = split_weight(arm)
    if base != arm and variant_of(arm) is not None:  # a row-weight arm: its arm's colour, lighter as w is smaller
        from matplotlib.colors import to_rgb

        return tuple(c + (1 - c) * 0.6 * (1 - w) for c in to_rgb(color(base)))
    v = variant_of(arm) or next((w for w in VARIANTS.values() if w.pooled == arm), None)
    if v is None:
        raise KeyError(f"no registered variant for {arm!r}")
    head, _, i = arm.rpartition(".")
    if v.count and head == v.name and i.isdigit():
        return _shade(v.color, int(i))
    return v.color
