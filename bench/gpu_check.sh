#!/usr/bin/env bash
# The one-shot GPU check, for the GPU machine (see ../shared/device/README.md). From the
# repository root:
#
#     bash bench/gpu_check.sh RESULTS_DIR [MODEL ...]
#
# Everything fits in GPU_CHECK_BUDGET_S seconds (default 450: the session's ~15 min of
# device time also pays the machine's start and one possible rerun). Every step is
# bounded by `timeout` and by the deadline; results are written as they come
# (RESULTS_DIR/results.json, results.md, cuda_ops.json, cuda_ops.md, steps.tsv, logs/),
# so a timeout keeps what was measured.
#
# Steps, in order, with their caps (typical times on the H200 in brackets):
#   install_pycuda   60 s  [~5]   pip install the carried .whl/ into /tmp/site
#   pycuda_autoinit  30 s  [~3]   `import pycuda.autoinit`; the script stops if it fails
#   env              30 s  [~2]   GPU, driver, package versions -> results.json
#   pytest_gpu       60 s  [~10]  `pytest -m gpu` (the runtime's GPU tests)
#   model_NAME       an equal share of what is left after the ops reserve, per model
#                    (~65 s each): compile f16 + f32 in parallel, check both against
#                    ONNX Runtime, time both, then the PyTorch peers (bench/gpu_check.py)
#   cuda_ops         what is left (>= GPU_CHECK_OPS_S, default 90 s) [60-90]: every
#                    template case beside cuBLAS/cuDNN (bench/cuda_ops.py), default
#                    configs first, then GPU_CHECK_OPS_CONFIGS (default 4) searched
#                    configs per case in the time left
#   report           results.md (models, then the ops table)
# Why this order: the five models in f16 and f32 against the fastest PyTorch peer are
# the headline result, so they go first; each model step boxes itself (its --seconds),
# and time it leaves flows to the next. The template cases are cheap and predictable
# (~60 s without search) and get a reserve the model shares leave alone, so they run;
# their config search, the least valuable part, absorbs whatever is left. Inside a
# model step the peers run cheapest-and-likely-fastest first (CUDA-graph replays, then
# torch.compile f16, which costs tens of seconds to compile); torch.compile f32 is last
# and is skipped when the box is full.
#
# Knobs: GPU_CHECK_BUDGET_S (450), GPU_CHECK_OPS_S (90), GPU_CHECK_OPS_CONFIGS (4),
# GPU_CHECK_STEPS (default "pytest models ops": a rerun can take a subset),
# GPU_CHECK_ARGS (extra options for each model, e.g. "--tiny --repeat 10" for a dry
# run), GPU_CHECK_OPS_ARGS (extra options for cuda_ops.py, e.g. "--only matmul"),
# GPU_CHECK_COMPILE_ARGS (options for `hidetc compile`; default --no-tune where the CLI
# has a tuner, so the templates' default configs are measured; see gpu_check.py).
# Before carrying this to the GPU machine, `python bench/cuda_ops.py DIR --dry-run
# --configs 4` here builds exactly the kernels the ops step will build (the search
# sample is seeded per case), so nvcc surprises show up here, not there.
# Exit status: 0 unless pycuda cannot be imported.
set -u
results=${1:?usage: bash bench/gpu_check.sh RESULTS_DIR [MODEL ...]}
shift
models=${*:-resnet50 inception_v3 mobilenet_v2 bert_base gpt2}
py=${PYTHON:-python3}
steps_wanted=" ${GPU_CHECK_STEPS:-pytest models ops} "
ops_reserve=${GPU_CHECK_OPS_S:-90}
case "$steps_wanted" in *" ops "*) ;; *) ops_reserve=0 ;; esac
deadline=$(( $(date +%s) + ${GPU_CHECK_BUDGET_S:-450} ))
mkdir -p "$results/logs"
steps="$results/steps.tsv"
work=${HIDETC_GPU_WORK:-/tmp/hidetc-gpu-check}
export HIDETC_GPU_WORK=$work

left() { echo $(( deadline - $(date +%s) )); }
wanted() { case "$steps_wanted" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# step NAME LIMIT_S CMD...: run CMD bounded by LIMIT_S and the deadline, log its output
# to logs/NAME.log, append "NAME rc seconds" to steps.tsv, show the log's last lines.
step() {
  local name=$1 limit=$2 remaining t0 rc
  shift 2
  remaining=$(left)
  if [ "$remaining" -lt 20 ]; then
    printf '%s\tskipped: out of time\t0s\n' "$name" >> "$steps"
    return 124
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$results/logs/$name.log" 2>&1
  rc=$?
  printf '%s\trc=%s\t%ss\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$steps"
  tail -n 4 "$results/logs/$name.log" | sed "s/^/[$name] /"
  return $rc
}

if ls .whl/*.whl > /dev/null 2>&1; then
  step install_pycuda 60 "$py" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! step pycuda_autoinit 30 "$py" -c "import pycuda.autoinit as a; print(a.device.name(), a.device.compute_capability())"; then
  echo "pycuda cannot be imported: see $results/logs/pycuda_autoinit.log"
  exit 1
fi
step env 30 "$py" bench/gpu_check.py env "$results"
if wanted pytest; then
  step pytest_gpu 60 "$py" -m pytest -q -p no:cacheprovider -m gpu -rs \
    --continue-on-collection-errors tests
fi

if wanted models; then
  set -- $models
  while [ $# -gt 0 ]; do
    share=$(( ($(left) - ops_reserve - 10) / $# ))
    [ "$share" -lt 30 ] && share=30
    step "model_$1" $(( share + 15 )) "$py" bench/gpu_check.py model "$1" "$results" \
      --seconds "$share" ${GPU_CHECK_ARGS:-}
    shift
  done
fi

if wanted ops; then
  ops=$(( $(left) - 15 ))
  step cuda_ops $(( ops + 10 )) "$py" bench/cuda_ops.py "$results" --budget-s "$ops" \
    --configs "${GPU_CHECK_OPS_CONFIGS:-4}" --work "$work/cubins" ${GPU_CHECK_OPS_ARGS:-}
fi

"$py" bench/gpu_check.py report "$results" > /dev/null 2>&1
cat "$results/results.md" 2>/dev/null
cat "$steps"
exit 0
