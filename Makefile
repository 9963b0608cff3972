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
	@$(BIN)/python -I -c "import os, sys, moe_hydra; sys.exit(os.path.dirname(os.path.dirname(os.path.realpath(moe_hydra.__file__))) != os.path.realpath('.'))" 2>/dev/null \
	  || $(BIN)/pip install -q --no-deps -e .

run: setup
	$(BIN)/python -m moe_hydra $(ARGS)

# Three parts: the tests that neither judge measured step times nor use the local Slurm cluster, JOBS at a time
# (pytest-xdist, a file to a worker, the longest first: tests/conftest.py; most tests keep one core busy); beside
# them, in a process of their own, the `slurm` ones (they mostly wait on the cluster: its output is shown when it
# ends); then the `serial` ones, alone (a second test's load would move a verdict). A part that ARGS leaves empty
# (pytest's exit code 5) is not a failure. Each part prints its time; MOE_HYDRA_TEST_DURATIONS=FILE collects every
# test's time per file (.ci/run prints the slowest files).
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n < 4 ? n : 4 )))
# The slurm and serial parts collect only the files that hold their marker (collecting every file imports torch and
# Megatron-Core for each: ~10-25 s of the two cores); with ARGS, what ARGS names
SLURM_FILES := $(if $(ARGS),,$(shell grep -l 'mark\.slurm' tests/test_*.py))
SERIAL_FILES := $(if $(ARGS),,$(shell grep -l 'mark\.serial' tests/test_*.py))
test: setup
	@ok() { [ $$1 -eq 0 ] || [ $$1 -eq 5 ]; }; start=$$(date +%s); log=$$(mktemp); \
	$(BIN)/python -m pytest -q -p no:xdist -m "slurm" --durations=15 $(ARGS) $(SLURM_FILES) > $$log 2>&1 & slurm=$$!; \
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile --no-loadscope-reorder -m "not serial and not slurm" \
	  --durations=25 $(ARGS); rc=$$?; \
	echo "make test: parallel part: $$(( $$(date +%s) - start )) s"; \
	wait $$slurm; src=$$?; echo "make test: the slurm part, beside it:"; cat $$log; rm -f $$log; \
	echo "make test: slurm part: $$(( $$(date +%s) - start )) s from the start"; \
	ok $$rc || exit $$rc; ok $$src || exit $$src; \
	start=$$(date +%s); \
	$(BIN)/python -m pytest -q -m "serial and not slurm" --durations=15 $(ARGS) $(SERIAL_FILES); rc=$$?; \
	echo "make test: serial part: $$(( $$(date +%s) - start )) s"; \
	ok $$rc || exit $$rc

bench: setup
	$(BIN)/python benchmarks/plan_latency.py

clean:
	rm -rf $(VENV) outputs/runs outputs/multirun
