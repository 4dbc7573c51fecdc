"""Study B — the single-example counterfactual ("twins"): corpus, model, training, measures."""
