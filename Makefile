# hidetc: `make demo` and `make test` set up everything they need in .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_MODEL ?= resnet50
DEMO_DIR := demo

.PHONY: demo test test-slow test-farm lint venv clean gpu-check gpu-check-dry bench

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m models $(DEMO_MODEL) -o $(DEMO_DIR)/$(DEMO_MODEL).onnx
	$(VENV)/bin/hidetc compile $(DEMO_DIR)/$(DEMO_MODEL).onnx -o $(DEMO_DIR)/$(DEMO_MODEL).out --target auto
	$(PY) -m models --sample $(DEMO_DIR)/$(DEMO_MODEL).onnx -o $(DEMO_DIR)/input.npz
	$(VENV)/bin/hidetc run $(DEMO_DIR)/$(DEMO_MODEL).out --input $(DEMO_DIR)/input.npz --compare $(DEMO_DIR)/$(DEMO_MODEL).onnx

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

# The slow tests also need PyTorch, onnxscript and transformers (tests/zoo: the
# transformers zoo through both torch.onnx exporters); `make test` never installs them.
ZOO_STAMP := $(VENV)/.zoo-installed
ZOO_PACKAGES := torch==2.13.0 onnxscript==0.7.2 'transformers>=5.25,<5.26'

$(ZOO_STAMP): $(STAMP)
	$(PY) -m pip install -q $(ZOO_PACKAGES)
	touch $(ZOO_STAMP)

test-slow: $(ZOO_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow

# The tuning farm's tests start local Ray clusters (two simulated nodes; a node killed
# mid-tune; a driver restarted): they need the `ray` extra, which `make test` never
# installs.
FARM_STAMP := $(VENV)/.farm-installed

$(FARM_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[ray,dev]'
	touch $(FARM_STAMP)

test-farm: $(FARM_STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m farm

# The five models beside ONNX Runtime on this machine's target (tuned; records reused).
BENCH_JSON ?= bench/results/$(shell date -u +%Y-%m-%d)-bench-$(shell uname -m).json
bench: $(STAMP)
	$(VENV)/bin/hidetc bench --work bench-work --json $(BENCH_JSON) $(BENCH_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check hidetc tests models bench
	$(PY) -m pytest -q -p no:cacheprovider tests/architecture

# The ONNX node tests, then onnx's small model tests (--suite models), through hidetc's
# compiled CPU path (hidetc/tools/conformance): prints the
# pass/fail/error/crash/skip counts and the failure causes ranked, writes per-case
# results to $(CONFORMANCE_OUT)/results.json, and compares with
# tests/conformance/expected_failures.yaml (exit 1 on a regression or an unexpected pass).
CONFORMANCE_OUT ?= build/conformance
CONFORMANCE_JOBS ?= 2
.PHONY: conformance
conformance: $(STAMP)
	$(PY) -m hidetc.tools.conformance --jobs $(CONFORMANCE_JOBS) --out $(CONFORMANCE_OUT)
	$(PY) -m hidetc.tools.conformance --suite models --jobs $(CONFORMANCE_JOBS) --out $(CONFORMANCE_OUT)/models

# The one-shot GPU check (bench/gpu_check.py): on the GPU machine, through the device
# tool, with the pycuda wheels carried in .whl/ (README, "On a GPU"); results under
# $OUT/gpu when OUT is set, else GPU_RESULTS, else bench/results/gpu-DATE.
# `make gpu-check-dry` runs it here first, without a GPU (tiny models, the emulator).
gpu-check:
	bash bench/gpu_check.sh $(if $(GPU_RESULTS),--results $(GPU_RESULTS)) $(GPU_CHECK_ARGS)

gpu-check-dry: $(STAMP)
	PYTHON=$(PY) bash bench/gpu_check.sh --dry-run $(if $(GPU_RESULTS),--results $(GPU_RESULTS),--results build/gpu-dry-run) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_DIR) bench-work
