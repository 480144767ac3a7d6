#!/usr/bin/env bash
# The one-shot GPU check (bench/gpu_check.py says what it runs and writes). From anywhere:
#
#     bash bench/gpu_check.sh [--dry-run] [--results DIR] [--budget S] [--only PATTERN,...]
#
# On the GPU machine, through the device tool, with the pycuda wheels carried in .whl/
# (see ../shared/device/README.md):  bash bench/gpu_check.sh   (results under $OUT/gpu)
# Here, before those minutes count:   OUT=/tmp/g bash bench/gpu_check.sh --dry-run
# The interpreter is $PYTHON, else .venv/bin/python where `make venv` made one, else python3.
set -u
cd "$(dirname "$0")/.." || exit 2
py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
fi
exec "$py" bench/gpu_check.py --python "$py" "$@"
