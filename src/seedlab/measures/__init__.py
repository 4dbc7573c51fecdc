"""What several studies measure, below the studies: a new fork design reuses these without
importing a study. Each module computes one kind of measure and reads or writes no file.

- weights.py   two models of one architecture (state dicts): the straight line between them
               (``interpolate``), the loss along it (``loss_path``), the interpolation barrier
               (``barrier_curve``, ``barrier``), bitwise identity (``identical``) and the weight distance
               per layer group (``weight_distance``), raw or after weight matching
               (``aligned_distance``: lm/align.py permutes the GPT's residual features, heads and MLP units)
- cka.py       linear CKA between two representations of the same examples (``linear_cka``)
- text.py      a text's mean next-token cross-entropy under a model (``text_ce``)
- paired.py    paired statistics over seeds: a comparison row with both tests, the interval and
               the MDE (``paired_row``), and the one-sided sign-flip test (``one_sided_sign_flip``)

Imports: the core (seedlab.stats, errors) and lm; no study, and not forks or corpus.
"""
