"""The single-example counterfactual ("twins"): seed-matched GPT pre-training runs that differ in
one row of one batch. In the order a design runs: config.py (what is trained and measured),
rundir.py (the run folder), passages.py + train.py (``seedlab twins run``), measure.py with
metrics.py (``measure``), gradmatch.py (``gradmatch``), stats.py, report.py + figures.py (``report``).
The GPT, its trainer and the corpus are shared: seedlab.lm and seedlab.corpus."""
