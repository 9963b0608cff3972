#!/usr/bin/env bash
# Every GPU check of moe_hydra in one go, on a machine with one NVIDIA GPU and no network; results packed into one
# archive. What such a machine needs (docs/cpu.md, "GPU check"): torch with CUDA; the rest of the [train] extra as
# wheels in $WHEELHOUSE (megatron-core, hydra-core, omegaconf, antlr4-python3-runtime, submitit,
# hydra-submitit-launcher), installed with --no-index into a private site directory when they are missing.
#
#   bash benchmarks/gpu_check.sh                 # on the GPU machine: writes $OUT/gpu_check.tgz
#   bash benchmarks/gpu_check.sh --dry-run       # here, on the CPU: the same steps, each on the CPU where it can run
#   BUDGET_S=540 bash benchmarks/gpu_check.sh    # every step inside 540 s together: a step's limit is cut to what is
#                                                # left (20 s kept for the archive), a step with under 15 s is skipped
#
# Steps, each under its own timeout (a step that fails or times out is recorded, the next runs):
#   env        nvidia-smi, torch / CUDA / package versions
#   memory     tests/test_memory.py's GPU test: tiny_moe's max_memory_allocated against the estimate
#   runs       stage=run of tiny_moe (contract.window=auto, 20 steady steps) and of Qwen3-30B-A3B cut to 4 layers
#              (seq 1024, GBS 8; auto, 10 steady steps)
#              at MBS 1 and 4, local
#              spec (no Transformer Engine): results.json with step time, TFLOP/s, the allocator's peak and the
#              memory phases (after the first step, forward/backward, optimizer step)
#   profile    tiny_moe with profile=window: profile.json with CUDA activities, kernel time > 0, walls summing
#              to the window
#   calibrate  stage=calibrate of tiny_moe and of the Qwen3 slice on this GPU (its layout, its variants)
#   rows       benchmarks/gpu_rows.py: those runs as rows of benchmarks/data/measured_runs.yaml (source moe-hydra-gpu),
#              each predicted from its model's calibration as held out (|ln| per run, median and worst)
#   harness    benchmarks/harness_overhead.py on the GPU: moe_hydra's step against a bare Megatron-Core loop (last:
#              measured before, on 2026-11-30, so the first a spent budget skips)
# Then: $OUT/gpu_check.tgz holds logs/, runs/, junit.xml, measured_rows.yaml, summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0; [[ ${1:-} == --dry-run ]] && DRY=1
OUT=${OUT:-$PWD/outputs/gpu_check}
PY=${PYTHON:-python3}
BUDGET=${BUDGET_S:-0}  # 0: no limit on the steps together
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" "$OUT/runs"
: >"$OUT/summary.txt"

step() {  # step NAME TIMEOUT_S COMMAND...: run, log, record the outcome
  local name=$1 limit=$2; shift 2
  if (( BUDGET )); then
    local left=$((BUDGET - SECONDS - 20))
    if (( left < 15 )); then
      printf '%-28s skipped: %ds of the %ds budget left\n' "$name" "$((BUDGET - SECONDS))" "$BUDGET" | tee -a "$OUT/summary.txt"
      return 0
    fi
    (( limit > left )) && limit=$left
  fi
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  local rc=$?
  printf '%-28s rc=%-3s %4ds  %s\n' "$name" "$rc" "$((SECONDS - t0))" "$*" | tee -a "$OUT/summary.txt"
  return 0
}

# ---------------------------------------------------------------- environment and packages
step env 60 bash -c "nvidia-smi || echo 'no nvidia-smi'; $PY -c 'import sys, torch; print(sys.version); print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"available\", torch.cuda.is_available()); print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no GPU\")'"
if ! "$PY" -c "import megatron.core, hydra, omegaconf, submitit" 2>/dev/null; then
  if [[ -n ${WHEELHOUSE:-} ]]; then
    step wheels 300 "$PY" -m pip install --no-index --no-deps --target /tmp/moe_hydra_site "$WHEELHOUSE"/*.whl
    export PYTHONPATH=/tmp/moe_hydra_site:$PWD:$PWD/launchers${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "megatron-core / hydra missing and no WHEELHOUSE: the runs will fail (see docs/cpu.md)" | tee -a "$OUT/summary.txt"
  fi
fi
export PYTHONPATH=${PYTHONPATH:-$PWD:$PWD/launchers}
"$PY" -c "import moe_hydra.core.versions as v; print(v.mcore_facts())" >>"$OUT/logs/env.log" 2>&1

# ---------------------------------------------------------------- the GPU memory test
step memory_test 900 "$PY" -m pytest -q -p no:cacheprovider tests/test_memory.py -k on_a_gpu -rs --junitxml "$OUT/junit.xml"

# ---------------------------------------------------------------- real runs with the memory phases
LOCAL=(hardware.transformer_engine=false kernels.moe_grouped_gemm=false logger=none)
if (( DRY )); then
  GPU=(hardware=local_cpu); SLICE_STAGE=stage=plan  # the slices are too large for a CPU: plan them only
else
  GPU=(hardware=h200_sxm hardware.devices_per_node=1); SLICE_STAGE=stage=run
fi
SLICE=(model=qwen3_30b_a3b model.num_layers=4 model.seq_length=1024 train.global_batch_size=8)
# the measured windows are found, not declared (contract.window=auto: each run steps until its step times have a
# steady segment, moe_hydra.core.steady): on the H200 (2026-12-04) a run's steps fell for about six steps, so the
# declared window of then, steps 4-10, measured the warm-up. The caps bound a run that never settles.
STEADY_TINY=(contract.window=auto contract.steady_steps=20 train.train_iters=200)
STEADY_SLICE=(contract.window=auto contract.steady_steps=10 train.train_iters=60)
step run_tiny_moe 600 "$PY" -m moe_hydra stage=run "${GPU[@]}" "${LOCAL[@]}" "${STEADY_TINY[@]}" \
  "hydra.run.dir=$OUT/runs/tiny_moe"
for mbs in 1 4; do
  step "run_qwen3_30b_slice_mbs$mbs" 600 "$PY" -m moe_hydra "$SLICE_STAGE" "${GPU[@]}" "${LOCAL[@]}" "${SLICE[@]}" \
    "${STEADY_SLICE[@]}" "train.micro_batch_size=$mbs" "hydra.run.dir=$OUT/runs/qwen3_30b_slice_mbs$mbs"
done

# ---------------------------------------------------------------- the profile stage with CUDA activities
step run_profile_tiny_moe 600 "$PY" -m moe_hydra stage=run "${GPU[@]}" "${LOCAL[@]}" "${STEADY_TINY[@]}" profile=window \
  "hydra.run.dir=$OUT/runs/profile_tiny_moe"
step profile_check 60 "$PY" - "$OUT/runs/profile_tiny_moe/profile.json" "$DRY" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); s = d["slowest_rank"]; gpu = sys.argv[2] == "0"
exclusive = sum(s[k] for k in ("compute_ms", "exposed_communication_ms", "memcpy_ms", "host_ms", "idle_ms"))
print(json.dumps({k: s[k] for k in ("device", "wall_ms", "compute_ms", "communication_ms", "exposed_communication_ms",
                                    "memcpy_ms", "host_ms", "idle_ms")}), d["activities"], d["step_time_ms"])
assert abs(exclusive - s["wall_ms"]) <= 0.01 * s["wall_ms"], "the walls do not sum to the window"
assert not gpu or (d["activities"] == ["CPU", "CUDA"] and s["device"] == "cuda" and s["compute_ms"] > 0), "no kernels"
# the walls span the profiled steps (the host's annotations, not their projections onto a stream) and see the host
assert s["wall_ms"] / len(s["steps"]) >= 0.8 * d["step_time_ms"]["profiled"], "the walls miss part of the steps"
assert not gpu or s["host_ms"] > 0, "no host time on a GPU: the host's threads were not read"
print("top kernels:", s["top_compute"][:5])
PY

# ---------------------------------------------------------------- calibrate this device; its predictions held out
# the runs above never ran in a calibration: each calibrated model's runs are predicted from it (rows step)
CALS=()
if (( DRY )); then CALIBRATE=(tiny_moe); else CALIBRATE=(tiny_moe qwen3_30b_slice); fi
for name in "${CALIBRATE[@]}"; do
  # the slice's steps are long: its own layout and settings, 3 rounds (about a minute on an H200)
  if [[ $name == tiny_moe ]]; then MODEL=(); else MODEL=("${SLICE[@]}" "calibrate.variants=[]" calibrate.step_repeats=3); fi
  step "calibrate_$name" 420 "$PY" -m moe_hydra stage=calibrate "${GPU[@]}" "${LOCAL[@]}" "${MODEL[@]}" \
    calibrate.layouts=plan "hydra.run.dir=$OUT/runs/calibration_$name"
  CALS+=(--calibration "$OUT/runs/calibration_$name/calibration.json")
done

# ---------------------------------------------------------------- the runs as dataset rows
step rows 300 "$PY" benchmarks/gpu_rows.py "$OUT/runs" "$OUT/measured_rows.yaml" "${CALS[@]}"

# ---------------------------------------------------------------- the harness against a bare Megatron-Core loop
if (( DRY )); then HARNESS=(--repeats 1 --steps 12); else HARNESS=(--repeats 3 --hardware h200_sxm); fi
step harness_overhead 900 "$PY" benchmarks/harness_overhead.py --procs 1 "${HARNESS[@]}"

# ---------------------------------------------------------------- the archive
tar czf "$OUT/gpu_check.tgz" -C "$OUT" logs runs summary.txt $(cd "$OUT" && ls junit.xml measured_rows.yaml 2>/dev/null)
echo "packed $OUT/gpu_check.tgz"
