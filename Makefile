# make run    train the embedded default (tiny MoE, Megatron-Core, this machine)
# make test   the test suite
# Both create .venv on first use. Inside an NGC container, skip the venv: pip install -e ".[train,test]".
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0  # the CPU wheel; a plain `torch` would pull a multi-GB CUDA build
	$(BIN)/pip install -q -e ".[train,test]"
	touch $@

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m moe_hydra $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=40 $(ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/plan_latency.py

clean:
	rm -rf $(VENV) outputs/runs outputs/multirun
