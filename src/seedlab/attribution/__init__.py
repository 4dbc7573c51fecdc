"""Attribution: influence estimators against *measured* single-row counterfactuals.

A bank of forked runs (twins that differ in one row of one batch) gives the measured
Δ L_query; this package's estimators predict it from gradients at the fork point:

- :mod:`~seedlab.attribution.estimators.builtin` — the case (:class:`Case`), cached flat gradients
  and the gradient-based estimators: one-step SGD, one-step AdamW (first order, with the
  real optimizer state), TracIn-CP over checkpoints, gradient cosine;
- :mod:`~seedlab.attribution.estimators.influence` — influence functions with EK-FAC / K-FAC curvature
  from kronfluence (optional: ``seedlab[attribution]``, imported only when used);
- :mod:`~seedlab.attribution.estimators.registry` — the estimators by name, :func:`estimate` (one long
  DataFrame) and :func:`run` (one [candidates × queries] array).

Sign convention everywhere: estimate = predicted L_query(run with the candidate) −
L_query(twin), nats/token; learning a candidate lowers its own loss → negative.

Nothing is imported here, so ``seedlab attribution --help`` does not load torch.
"""
