# Every target bootstraps .venv from nothing. PyTorch defaults to the CPU build;
# GPU users: make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON     ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV       := .venv
BIN        := $(VENV)/bin

.PHONY: demo attribution-demo test bench claims clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[dev,attribution,dattri]'
	$(BIN)/pip install -q --no-deps kronfluence==1.0.1
	touch $@

# Both studies end to end in under 10 minutes on 2 cores: each preset made smaller, so the
# demo's numbers are a preview, not the ones docs/results.md reports (those commands are there):
#   shortcut: the preset quick with 8 seeds per cell (quick: 16) and gradients every 50 epochs (25)
#   twins:    the preset mini ended at step 200 (mini: 300): the injection at 100, the end at s + 100; 3 seeds (mini: 4);
#             the fluent passages and the nulls: 2 ordinary rows (mini: 4), the nudge, matched-gradient (mini also has
#             random-chars and the weight kick)
demo: $(VENV)/.installed runs/corpus-embedded-bpe/meta.json
	$(BIN)/seedlab shortcut sweep quick --out runs/demo-shortcut --set grid.seed=8 --set train.gradients.every=50
	$(BIN)/seedlab shortcut analyze runs/demo-shortcut --n 64   # rows per member and split: the analyses cost ~linear in it
	$(BIN)/seedlab shortcut report runs/demo-shortcut
	$(BIN)/seedlab twins run mini --out runs/demo-twins --set steps=200 --set "seeds=[0,1,2]" \
	    --set "conditions=[twin,fluent-fabricated,fluent-attested,ordinary-row,nudge,matched-gradient]" --set nulls.ordinary_rows=2
	$(BIN)/seedlab twins measure runs/demo-twins
	$(BIN)/seedlab twins report runs/demo-twins
	@echo "shortcut demo report: runs/demo-shortcut/report.md"
	@echo "twins demo report:    runs/demo-twins/report.md"

# the attribution bank at CPU scale (bank + attribute + report, ~10 min on 2 cores): runs/attribution-mini/report.md
attribution-demo: $(VENV)/.installed runs/corpus-embedded-bpe/meta.json
	$(BIN)/seedlab attribution bank mini --out runs/attribution-mini
	$(BIN)/seedlab attribution attribute runs/attribution-mini
	$(BIN)/seedlab attribution report runs/attribution-mini
	@echo "attribution demo report: runs/attribution-mini/report.md"

# the twins study's default corpus: docstrings of Python's standard library (no network), BPE tokens
runs/corpus-embedded-bpe/meta.json: | $(VENV)/.installed
	rm -rf runs/corpus-embedded-bpe
	$(BIN)/seedlab corpus prepare embedded --out runs/corpus-embedded-bpe --tokenizer bpe --vocab-size 2048

# the suite in two phases: two worker processes (pytest-xdist, one a core, one torch thread each, a test file to a
# worker), then the tests marked serial alone (they start processes of their own: gloo ranks, a Ray cluster)
test: $(VENV)/.installed
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -m serial

# README's "What we found", docs/results.md's index and each results page's claims table, rendered from the
# ledger docs/claims/<study>.yaml (seedlab claims check: every rule of the ledger; a test runs it too)
claims: $(VENV)/.installed
	$(BIN)/seedlab claims render

bench: $(VENV)/.installed runs/corpus-embedded-bpe/meta.json
	$(BIN)/python benchmarks/shortcut_trainer.py --members 8 --plain-members 2 --epochs 3 --profile
	$(BIN)/python benchmarks/twins_trainer.py --corpus runs/corpus-embedded-bpe
	$(BIN)/python benchmarks/attribution_bank.py --corpus runs/corpus-embedded-bpe

# the wheels the lent GPU machine's image lacks (seedlab's, its missing dependencies', CPython 3.12 manylinux), into
# .whl/ (git-ignored; the device tool carries it): docs/benchmarks.md, "The GPU check", has the command to run there
gpu-wheels: $(VENV)/.installed
	$(BIN)/python benchmarks/gpu_wheels.py --out .whl

clean:
	rm -rf $(VENV) runs
