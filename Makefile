# Every target bootstraps .venv from nothing. PyTorch defaults to the CPU build;
# GPU users: make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON     ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV       := .venv
BIN        := $(VENV)/bin

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.installed
	$(BIN)/seedlab shortcut train configs/shortcut/demo.yaml --out runs/demo --force
	$(BIN)/python -c "import pandas as pd; print(pd.read_parquet('runs/demo/summary.parquet').groupby(['ratio'])['generalized'].agg(['mean','count']))"

test: $(VENV)/.installed
	$(BIN)/python -m pytest

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/shortcut_trainer.py

clean:
	rm -rf $(VENV) runs
