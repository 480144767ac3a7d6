"""The five benchmark models end to end on the CPU target: compile (which verifies
against ONNX Runtime, f32 tolerance 1e-4 norm-wise), load through the Python API, run on
the builders' realistic sample inputs and compare with ONNX Runtime again, and run
through the artifact's own `bin/hidetc-run` (the C runtime, no Python): the same bits.
Tiny variants run in the default suite; the full-size models are marked slow. Each also
in bf16 where this CPU has AVX512_BF16 (the bf16 tolerance, 2e-2)."""
from __future__ import annotations

import numpy as np
import pytest
from helpers.c_runtime_twin import assert_runner_matches

import hidetc
import models
from hidetc import cpu_isa
from hidetc.driver.config import TOLERANCES
from hidetc.driver.verify import compare, run_onnxruntime

NAMES = sorted(models.REGISTRY)


def _compile_and_check(name: str, tiny: bool, tmp_path, precision: str = "f32") -> dict:
    proto = models.build(name, tiny=tiny)
    path = tmp_path / f"{name}.onnx"
    models.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu", precision=precision)
    assert result.manifest["verification"]["status"] == "passed"
    model = hidetc.load(tmp_path / "out")
    inputs = models.sample_inputs(proto, seed=1)
    outputs = model.run(inputs)
    report = compare(outputs, run_onnxruntime(path, inputs),
                     rtol=TOLERANCES["bf16"] if precision == "bf16" else 1e-4)
    assert report["status"] == "passed", report
    for array in outputs.values():
        assert np.all(np.isfinite(array))
    # the artifact's C runtime in a process without Python: the same bits
    assert_runner_matches(tmp_path / "out", inputs, outputs, tmp_path / "runner")
    return result.manifest


@pytest.mark.parametrize("name", NAMES)
def test_tiny_model(name, tmp_path):
    manifest = _compile_and_check(name, True, tmp_path)
    ops = {k["op"] for k in manifest["kernels"]}
    assert "BatchNormalization" not in ops and "Gemm" not in ops


NO_BF16 = pytest.mark.skipif(cpu_isa.BF16 not in cpu_isa.host_features(),
                             reason="this CPU lacks AVX512_BF16")


@NO_BF16
@pytest.mark.parametrize("name", NAMES)
def test_tiny_model_in_bf16(name, tmp_path):
    """--precision bf16: the GEMM anchors on bf16 kernels, verified at 2e-2."""
    manifest = _compile_and_check(name, True, tmp_path, "bf16")
    assert any(k["template"].endswith(".bf16") for k in manifest["kernels"])


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_full_model(name, tmp_path):
    _compile_and_check(name, False, tmp_path)


@pytest.mark.slow
@NO_BF16
@pytest.mark.parametrize("name", NAMES)
def test_full_model_in_bf16(name, tmp_path):
    _compile_and_check(name, False, tmp_path, "bf16")


def test_external_data_model(tmp_path):
    proto = models.build("resnet50", tiny=True)
    path = tmp_path / "ext.onnx"
    models.save(proto, path, external_data=True)
    assert (tmp_path / "ext.data").is_file()
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "passed"
