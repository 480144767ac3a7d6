#!/usr/bin/env bash
# The one-shot GPU check, for the GPU machine (see ../shared/device/README.md). From the
# repository root:
#
#     bash bench/gpu_check.sh RESULTS_DIR [MODEL ...]
#
# Installs pycuda from the carried .whl/ folder into /tmp/site (when present), checks
# `import pycuda.autoinit`, runs the GPU tests (`pytest -m gpu`), then for each model
# (default: all five) compiles it with `hidetc compile --target cuda`, checks it against
# ONNX Runtime and times it beside PyTorch (bench/gpu_check.py). Everything fits in
# GPU_CHECK_BUDGET_S seconds (default 450); every step is bounded by `timeout` and the
# results (RESULTS_DIR/results.json, results.md, steps.tsv, logs/) are written as it goes,
# so a timeout keeps what was measured. Exit status: 0 unless pycuda cannot be imported.
set -u
results=${1:?usage: bash bench/gpu_check.sh RESULTS_DIR [MODEL ...]}
shift
models=${*:-resnet50 inception_v3 mobilenet_v2 bert_base gpt2}
py=${PYTHON:-python3}
deadline=$(( $(date +%s) + ${GPU_CHECK_BUDGET_S:-450} ))
mkdir -p "$results/logs"
steps="$results/steps.tsv"

left() { echo $(( deadline - $(date +%s) )); }

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
  step install_pycuda 120 "$py" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! step pycuda_autoinit 60 "$py" -c "import pycuda.autoinit as a; print(a.device.name(), a.device.compute_capability())"; then
  echo "pycuda cannot be imported: see $results/logs/pycuda_autoinit.log"
  exit 1
fi
step env 60 "$py" bench/gpu_check.py env "$results"
step pytest_gpu 150 "$py" -m pytest -q -p no:cacheprovider -m gpu -rs \
  --continue-on-collection-errors tests

set -- $models
while [ $# -gt 0 ]; do
  share=$(( $(left) / $# ))
  # GPU_CHECK_ARGS: extra options for each model, e.g. "--tiny --repeat 10" for a dry run
  step "model_$1" $(( share + 30 )) "$py" bench/gpu_check.py model "$1" "$results" \
    --seconds "$share" ${GPU_CHECK_ARGS:-}
  shift
done
"$py" bench/gpu_check.py report "$results" > /dev/null 2>&1
cat "$results/results.md" 2>/dev/null
cat "$steps"
exit 0
