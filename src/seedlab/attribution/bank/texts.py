"""The bank's texts: the candidates that replace the injected row, and the queries.

Candidates (one forked run each, per seed):

- ``passage``: the passages of ``candidates.file`` — a ``.jsonl`` file (one JSON object per
  line: ``{"text": ..., "name": optional}``) or any other text file (passages separated by
  blank lines); named by their ``name`` or ``passage-<i>``;
- ``heldout``: ``candidates.heldout`` rows of the held-out split, ``block_size + 1`` tokens each
  (ordinary data, never trained on), named ``heldout-<i>``;
- ``control``: with ``candidates.own_row``, ``own-row``: the replaced row itself (a different
  text for every seed), whose runs must be bitwise the twin's.

With ``candidates.replicate_row``, every candidate is also trained in a second arm, its
*replicate* ``replicate.<name>`` (:func:`replicate`): the same text in row ``replicate_row`` of
the same batch; names beginning ``replicate.`` are therefore reserved.

With ``candidates.pairs`` (:func:`pairs_of`), a few arms carry two candidates at once, the first
in row ``injection_row``, the second in row ``replicate_row``: ``pair.<first>..<second>``
(:func:`pair`; an arm's name is a folder name, so no '+'). An int P draws P disjoint pairs of the
non-control candidates of distinct texts, seeded by ``candidates.seed`` alone (the same pairs for
every training seed); a list names them (the own-row control may be one of the two). Names
beginning ``pair.`` are reserved too.

Queries: each candidate's own text (``self``: self-influence), ``queries.heldout`` held-out rows
(``query-<i>``, disjoint from the candidate rows) and the probe texts of ``queries.probes``
(same formats, named ``probe-<i>`` or by their ``name``).

Held-out rows are whole ``block_size + 1``-token slots of the held-out split, in the order of
one seeded permutation (``candidates.seed``): the first ``queries.heldout`` slots are the query
rows, the next ``candidates.heldout`` the candidate rows — so a longer candidate list keeps the
same queries and the first candidates. Every text is checked before anything is written: a
candidate must give one next-token target and fit a row, and so must a query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from seedlab.attribution.bank.config import AttributionConfig
from seedlab.attribution.bank.kinds import NUDGE, PAIR, PAIR_SEP, REPLICATE, RESERVED, WEIGHTED  # the arm kinds' names
from seedlab.corpus.sources import jsonl_objects, read_txt
from seedlab.errors import SeedlabError
from seedlab.forks.folders import corpus_record
from seedlab.forks.arms import NAME
from seedlab.lm.batches import check_passage, get_batch
from seedlab.lm.model import GPTConfig

OWN_ROW = "own-row"
SELF = "self"


def weight_label(w: float) -> str:
    """A weight as its arm and folder name write it (``%g``: 0.25, 0.0625, 1e-05)."""
    return f"{w:g}"


def weighted(w: float, name: str) -> str:
    """The arm of candidate ``name`` at loss weight ``w`` (< 1; w = 1 is the candidate's own arm)."""
    return f"{WEIGHTED}{weight_label(w)}.{name}"


def nudged(tensor: str) -> str:
    """The arm nudging ``tensor`` by one ulp at s."""
    return NUDGE + tensor


def weight_and_candidate(arm: str) -> tuple[str, str]:
    """A weighted arm's (w as :func:`weight_label` writes it, candidate): ``weight.<w>.<candidate>``."""
    m = re.match(r"^weight\.(\d+(?:\.\d+)?(?:e-\d+)?)\.(.+)$", arm)
    if m is None:
        raise SeedlabError(f"weighted arm: expected weight.<w>.<candidate>, got {arm!r}")
    return m.group(1), m.group(2)


def candidate_of(arm: str) -> str:
    """The candidate an arm carries in one row: a candidate's own arm, its replicate's or a weighted one's."""
    if arm.startswith(WEIGHTED):
        return weight_and_candidate(arm)[1]
    return arm.removeprefix(REPLICATE)


def replicate(name: str) -> str:
    """The arm of candidate ``name``'s replicate (its text in row ``candidates.replicate_row``)."""
    return REPLICATE + name


def pair(first: str, second: str) -> str:
    """The arm of the pair (``first`` in row ``injection_row``, ``second`` in row ``replicate_row``)."""
    return f"{PAIR}{first}{PAIR_SEP}{second}"


@dataclass(frozen=True)
class Text:
    kind: str  # candidates: passage | heldout | control; queries: heldout | probe
    tokens: tuple[int, ...]
    text: str

    def record(self, name: str) -> dict:
        return {"name": name, "kind": self.kind, "text": self.text, "tokens": list(self.tokens)}


@dataclass
class Inputs:
    """Everything a bank reads, checked: the corpus, the GPT's config and the texts."""

    cfg: AttributionConfig
    corpus: object
    gcfg: GPTConfig
    candidates: dict[str, Text]  # without the own-row control (it depends on the seed)
    queries: dict[str, Text]

    @property
    def pad_id(self) -> int:
        """What fills a short candidate's row (masked out of the loss): the corpus's end-of-text id."""
        return self.corpus.eot_id

    def ordinary_batch(self, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The twin's batch of the injection step (x, y) [B, T]."""
        c = self.cfg
        return get_batch(self.corpus.train, seed, c.injection_step, c.batch_size, self.gcfg.block_size)

    def candidates_of(self, seed: int) -> dict[str, Text]:
        """The seed's candidates, in order: the file's passages, the held-out rows, the own-row control."""
        out = dict(self.candidates)
        if self.cfg.candidates.own_row:
            x, y = self.ordinary_batch(seed)
            r = self.cfg.injection_row
            ids = tuple(int(t) for t in torch.cat([x[r], y[r, -1:]]))
            out[OWN_ROW] = Text("control", ids, self.corpus.decode(ids))
        return out

    @cached_property
    def pairs(self) -> dict[str, tuple[str, str]]:
        """``{arm: (first, second)}`` of ``candidates.pairs`` (:func:`pairs_of`), the same for every seed."""
        return pairs_of(self.cfg, self.candidates)

    def record(self) -> dict:
        """What inputs.json holds (the design's texts; checked when a bank resumes)."""
        return {
            **corpus_record(self.corpus),
            "candidates": [t.record(k) for k, t in self.candidates.items()],  # lists: the design's order
            "queries": [t.record(k) for k, t in self.queries.items()],
        }


def load_inputs(cfg: AttributionConfig, base: Path, *, corpus: str | Path | None = None, verify: bool = True) -> Inputs:
    """The corpus (hashes checked when ``verify``) and every text, all checked before a folder is
    touched. ``base``: the config's folder (the candidate and probe files are relative to it)."""
    from seedlab.corpus import load

    c = load(Path(corpus or cfg.corpus), verify=verify)  # like --out: relative to the current folder
    gcfg = cfg.gpt_config(c.vocab_size)
    T = gcfg.block_size
    queries_rows, cand_rows = heldout_rows(c.heldout, T + 1, cfg.queries.heldout, cfg.candidates.heldout,
                                           cfg.candidates.seed)
    candidates: dict[str, Text] = {}
    if cfg.candidates.file:
        for name, text in read_texts(base / cfg.candidates.file, "candidates.file", "passage"):
            candidates[name] = Text("passage", tuple(c.encode(text)), text)
    for i, ids in enumerate(cand_rows):
        candidates[f"heldout-{i}"] = Text("heldout", ids, c.decode(ids))
    queries = {f"query-{i}": Text("heldout", ids, c.decode(ids)) for i, ids in enumerate(queries_rows)}
    if cfg.queries.probes:
        for name, text in read_texts(base / cfg.queries.probes, "queries.probes", "probe"):
            queries[name] = Text("probe", tuple(c.encode(text)), text)
    for kind, texts in (("candidates", candidates), ("queries", queries)):
        for name, t in texts.items():
            check_passage(len(t.tokens), T, f"{kind}.{name}")  # empty, one token, or longer than a row
            if not NAME.match(name):
                raise SeedlabError(f"{kind}.{name}: a name is letters, digits, '.', '_' and '-' (a folder name)")
    names = set(candidates) | set(queries)
    clash = sorted((set(candidates) & set(queries)) | ({OWN_ROW, SELF} & names)
                   | {n for n in names if n.startswith(RESERVED)})
    if clash:
        raise SeedlabError(f"names: {clash[0]!r} is taken (candidates and queries need distinct names, "
                           f"{OWN_ROW!r} and {SELF!r} are reserved, and so are the prefixes "
                           f"{', '.join(repr(p) for p in RESERVED)})")
    if not candidates and not cfg.candidates.own_row:
        raise SeedlabError("candidates: none (a file with passages, or candidates.heldout > 0)")
    pairs_of(cfg, candidates)  # checked now, before a folder is touched
    return Inputs(cfg, c, gcfg, candidates, queries)


def pairs_of(cfg: AttributionConfig, candidates: dict[str, Text]) -> dict[str, tuple[str, str]]:
    """``candidates.pairs`` resolved against the candidates (without the own-row control, which
    depends on the seed): ``{arm name: (first, second)}``, in the config's (or the draw's) order.

    An int P: the non-control candidates of distinct texts (the first of each text, in the design's
    order), permuted by ``default_rng([candidates.seed, 1])``; pair i is positions (2i, 2i + 1) while
    2P fits them (disjoint pairs); a larger P takes the first P of every unordered pair of them,
    permuted by ``default_rng([candidates.seed, 2])`` (distinct pairs, each candidate in several).
    A list: each name a candidate (or ``own-row`` when ``candidates.own_row``), the two texts
    different. Bad input is a one-line error (config.py checks a name given twice)."""
    want = cfg.candidates.pairs
    if isinstance(want, int):
        firsts: dict[tuple[int, ...], str] = {}
        for name, t in candidates.items():
            firsts.setdefault(t.tokens, name)
        distinct = list(firsts.values())
        n = len(distinct)
        if want > n * (n - 1) // 2:
            raise SeedlabError(f"candidates.pairs: {want} distinct pairs need more candidates of distinct texts (the "
                               f"own-row control aside) than this bank's {n} ({n * (n - 1) // 2} pairs at most)")
        if 2 * want <= n:
            order = np.random.default_rng([cfg.candidates.seed, 1]).permutation(n)
            chosen = [(distinct[order[2 * i]], distinct[order[2 * i + 1]]) for i in range(want)]
        else:
            every = [(distinct[i], distinct[j]) for i in range(n) for j in range(i + 1, n)]
            order = np.random.default_rng([cfg.candidates.seed, 2]).permutation(len(every))
            chosen = [every[k] for k in order[:want]]
    else:
        chosen = list(want)
        known = {*candidates, *([OWN_ROW] if cfg.candidates.own_row else [])}
        for first, second in chosen:
            bad = next((n for n in (first, second) if n not in known), None)
            if bad is not None:
                some = sorted(known)
                raise SeedlabError(f"candidates.pairs: {bad!r} is not a candidate (candidates: {', '.join(some[:8])}"
                                   f"{', …' if len(some) > 8 else ''})")
            if first in candidates and second in candidates and candidates[first].tokens == candidates[second].tokens:
                raise SeedlabError(f"candidates.pairs: a pair of identical candidates ({first!r} and {second!r} "
                                   "have the same text)")
    out: dict[str, tuple[str, str]] = {}
    for first, second in chosen:
        name = pair(first, second)
        if not NAME.match(name):
            raise SeedlabError(f"candidates.pairs: the arm name {name!r} is too long for a folder name (100 characters)")
        if name in out:
            raise SeedlabError(f"candidates.pairs: ({first!r}, {second!r}) and {out[name]!r} make the same arm name "
                               f"{name!r} (a name with {PAIR_SEP!r} in it)")
        out[name] = (first, second)
    return out


def read_texts(path: Path, field: str, prefix: str) -> list[tuple[str, str]]:
    """(name, text) of every passage of a .jsonl or plain text file (see the module doc)."""
    if not path.is_file():
        raise SeedlabError(f"{field}: no such file {str(path)!r}")
    out: list[tuple[str, str]] = []
    if path.suffix == ".jsonl":
        try:
            for n, obj in jsonl_objects(path):
                name = obj.get("name", f"{prefix}-{len(out)}")
                if not obj["text"].strip():
                    raise SeedlabError(f"{path}:{n}: {name!r} is an empty passage")
                out.append((str(name), obj["text"].strip()))
        except SeedlabError as err:
            raise SeedlabError(f"{field}: {err}") from None
    else:
        out = [(f"{prefix}-{i}", p) for i, p in enumerate(read_txt(path))]  # paragraphs, as a corpus's documents
    if not out:
        raise SeedlabError(f"{field}: {path} holds no passage")
    names = [name for name, _ in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise SeedlabError(f"{field}: the name {dup!r} is used twice in {path}")
    return out


def heldout_rows(heldout: np.ndarray, length: int, n_queries: int, n_candidates: int,
                 seed: int) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """(query rows, candidate rows): disjoint ``length``-token slots of the held-out split (module doc)."""
    slots = len(heldout) // length
    if n_queries + n_candidates > slots:
        raise SeedlabError(f"candidates.heldout + queries.heldout: {n_queries + n_candidates} rows of {length} tokens "
                           f"do not fit the held-out split ({len(heldout)} tokens, {slots} rows)")
    order = np.random.default_rng(seed).permutation(slots)
    rows = [tuple(int(t) for t in heldout[o * length : (o + 1) * length]) for o in order[: n_queries + n_candidates]]
    return rows[:n_queries], rows[n_queries:]
