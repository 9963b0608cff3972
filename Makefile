# make run    train the embedded default (tiny MoE, Megatron-Core, this machine)
# make test   the test suite
# Both create the venv (VENV, default .venv) on first use, and install into it again only when pyproject.toml has
# changed (the stamp is named by its hash); a venv another checkout made gets this checkout installed (editable) in
# a few seconds. Inside an NGC container, skip the venv: pip install -e ".[train,test]".
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PYPROJECT_HASH := $(shell $(PY) -c "import hashlib; print(hashlib.sha256(open('pyproject.toml','rb').read()).hexdigest()[:16])")
STAMP := $(VENV)/.installed-$(PYPROJECT_HASH)

.PHONY: setup run test bench clean

$(STAMP):
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0  # the CPU wheel; a plain `torch` would pull a multi-GB CUDA build
	$(BIN)/pip install -q -e ".[train,test]"
	rm -f $(VENV)/.installed-*
	touch $@

# the venv's moe_hydra is this checkout (a venv shared between checkouts, as CI's cached one, points at the last)
setup: $(STAMP)
	@$(BIN)/python -I -c "import os, sys, moe_hydra; sys.exit(os.path.dirname(os.path.dirname(os.path.realpath(moe_hydra.__file__))) != os.path.realpath('.'))" \
	  || $(BIN)/pip install -q --no-deps -e .

run: setup
	$(BIN)/python -m moe_hydra $(ARGS)

# Two parts: the tests that neither judge measured step times nor hold the local Slurm cluster's nodes, JOBS at a
# time (pytest-xdist, a file to a worker, the longest first: tests/conftest.py; most tests keep one core busy); then
# the `serial` ones, alone. A part that ARGS leaves empty (pytest's exit code 5) is not a failure. Each part prints
# its time; MOE_HYDRA_TEST_DURATIONS=FILE collects every test's time per file (.ci/run prints the slowest files).
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
test: setup
	@start=$$(date +%s); \
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder -m "not serial" --durations=25 \
	  $(ARGS); rc=$$?; \
	  echo "make test: parallel part: $$(( $$(date +%s) - start )) s"; \
	  [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc; \
	start=$$(date +%s); \
	$(BIN)/python -m pytest -q -m serial --durations=15 $(ARGS); rc=$$?; \
	  echo "make test: serial part: $$(( $$(date +%s) - start )) s"; \
	  [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc

bench: setup
	$(BIN)/python benchmarks/plan_latency.py

clean:
	rm -rf $(VENV) outputs/runs outputs/multirun
