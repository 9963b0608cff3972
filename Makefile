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

# Two parts: the tests that neither judge measured step times nor hold the local Slurm cluster's nodes, JOBS at a
# time (pytest-xdist, a file to a worker, the longest first: tests/conftest.py; most tests keep one core busy); then
# the `serial` ones, alone. A part that ARGS leaves empty (pytest's exit code 5) is not a failure.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder -m "not serial" --durations=25 \
	  $(ARGS); rc=$$?; \
	  [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc; \
	$(BIN)/python -m pytest -q -m serial --durations=15 $(ARGS); rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc

bench: $(STAMP)
	$(BIN)/python benchmarks/plan_latency.py

clean:
	rm -rf $(VENV) outputs/runs outputs/multirun
