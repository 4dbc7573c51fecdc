"""The held-out split's uses in a twins design, in one place: the evaluation rows, the probe rows and the
reserved slice the ordinary-row nulls are drawn from, which no evaluation or probe row touches.

    heldout = corpus.heldout                     n tokens, never trained on
    [0, n − R)    evaluation rows                measure.heldout_rows rows of block_size + 1 tokens (x and its
                                                 shifted targets y), lm/batches.py get_batch on this part alone,
                                                 seeded by measure.seed: the barrier and the held-out CE
                  probe rows                     the first measure.probe_rows of them: CKA's residual streams
    [n − R, n)    reserved                       R = RESERVED_ROWS × (block_size + 1) tokens: the ordinary rows,
                                                 nulls.ordinary_rows stretches as long as the fabricated passage,
                                                 on a grid of that length (disjoint), chosen by
                                                 random.Random(nulls.ordinary_row_seed); with
                                                 nulls.ordinary_rows_per_seed each training seed draws its
                                                 own from the same slice (:func:`ordinary_draw`)

So an ordinary row's own text is never among the targets it is judged on. The twins study reads the held-out split nowhere else (its
passages are its own texts; it has no query rows: those are the attribution study's, drawn in its own
attribution/bank/texts.py for its own designs). ``twins.measure.Evaluator`` draws its rows with
:func:`evaluation_rows`, ``twins.passages`` the ordinary rows with :func:`ordinary_rows`.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from seedlab.errors import SeedlabError
from seedlab.lm.batches import batch_indices, get_batch

#: rows of block_size + 1 tokens at the end of the held-out split kept for the ordinary rows (module doc)
RESERVED_ROWS = 32


def reserved(n_tokens: int, block_size: int) -> range:
    """The token positions of the reserved slice: the last ``RESERVED_ROWS × (block_size + 1)`` of the split;
    a split too short to hold it and one evaluation row besides is a one-line error."""
    r = RESERVED_ROWS * (block_size + 1)
    if n_tokens - r < block_size + 1:
        raise SeedlabError(f"corpus: its held-out split has {n_tokens} tokens; the ordinary rows' reserved slice takes "
                           f"{r} ({RESERVED_ROWS} rows of block_size + 1 = {block_size + 1}) and the evaluation rows need "
                           f"at least one row more (a larger --heldout-fraction, or a shorter block_size)")
    return range(n_tokens - r, n_tokens)


def evaluation_part(n_tokens: int, block_size: int) -> range:
    """The token positions the evaluation (and probe) rows are drawn from: everything before the reserved slice."""
    return range(0, reserved(n_tokens, block_size).start)


def evaluation_rows(heldout: np.ndarray, seed: int, rows: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) [rows, block_size]: the evaluation rows, drawn as lm/batches.py ``get_batch`` draws a batch, from
    the part before the reserved slice only (the probe rows are the first of them)."""
    part = evaluation_part(len(heldout), block_size)
    return get_batch(heldout[part.start:part.stop], seed, 0, rows, block_size)


def evaluation_ranges(n_tokens: int, seed: int, rows: int, block_size: int) -> list[range]:
    """The token positions each evaluation row reads (its x and y: block_size + 1 tokens), in row order."""
    part = evaluation_part(n_tokens, block_size)
    offsets = batch_indices(seed, 0, n_tokens=len(part), batch_size=rows, block_size=block_size)
    return [range(part.start + int(o), part.start + int(o) + block_size + 1) for o in offsets]


def ordinary_draw(row_seed: int, seed: int | None = None) -> int | str:
    """What ``random.Random`` draws the ordinary rows from: ``nulls.ordinary_row_seed`` (every seed the same rows), or
    with a training seed (``nulls.ordinary_rows_per_seed``) the text ``"ordinary-row <row_seed> seed <seed>"``: Python
    hashes a text seed with SHA-512, so every (row seed, training seed) pair draws its own rows, the same on every
    machine and Python."""
    return row_seed if seed is None else f"ordinary-row {row_seed} seed {seed}"


def ordinary_ranges(n_tokens: int, block_size: int, length: int, k: int, seed: int | str, *,
                    per_seed: bool = False) -> list[range]:
    """The token positions of the ``k`` ordinary rows, each ``length`` tokens: ``k`` distinct slots of a grid
    of that length over the reserved slice, chosen by ``random.Random(seed)`` (so they never overlap); more
    rows than the slice holds is a one-line error (``per_seed``: the rows one training seed draws)."""
    res = reserved(n_tokens, block_size)
    slots = len(res) // length
    if k > slots:
        each = " a seed (nulls.ordinary_rows_per_seed)" if per_seed else ""
        raise SeedlabError(f"nulls.ordinary_rows: {k} ordinary rows{each} of {length} tokens do not fit the held-out "
                           f"split's reserved slice ({len(res)} tokens: at most {slots}; twins.heldout.RESERVED_ROWS)")
    chosen = random.Random(seed).sample(range(slots), k)
    return [range(res.start + c * length, res.start + (c + 1) * length) for c in chosen]


def ordinary_rows(heldout: np.ndarray, block_size: int, length: int, k: int, seed: int | str, *,
                  per_seed: bool = False) -> list[list[int]]:
    """The token ids of the ``k`` ordinary rows (:func:`ordinary_ranges`)."""
    ranges = ordinary_ranges(len(heldout), block_size, length, k, seed, per_seed=per_seed)
    return [[int(t) for t in heldout[r.start:r.stop]] for r in ranges]
