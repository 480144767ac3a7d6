"""The five benchmark models end to end on the CPU target: compile (which verifies
against ONNX Runtime, f32 tolerance 1e-4 norm-wise), load through the Python API, run on
the builders' realistic sample inputs and compare with ONNX Runtime again.
Tiny variants run in the default suite; the full-size models are marked slow."""
from __future__ import annotations

import numpy as np
import pytest

import hidetc
import models
from hidetc.driver.verify import compare, run_onnxruntime

NAMES = sorted(models.REGISTRY)


def _compile_and_check(name: str, tiny: bool, tmp_path) -> dict:
    proto = models.build(name, tiny=tiny)
    path = tmp_path / f"{name}.onnx"
    models.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "passed"
    model = hidetc.load(tmp_path / "out")
    inputs = models.sample_inputs(proto, seed=1)
    outputs = model.run(inputs)
    report = compare(outputs, run_onnxruntime(path, inputs), rtol=1e-4)
    assert report["status"] == "passed", report
    for array in outputs.values():
        assert np.all(np.isfinite(array))
    return result.manifest


@pytest.mark.parametrize("name", NAMES)
def test_tiny_model(name, tmp_path):
    manifest = _compile_and_check(name, True, tmp_path)
    ops = {k["op"] for k in manifest["kernels"]}
    assert "BatchNormalization" not in ops and "Gemm" not in ops


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_full_model(name, tmp_path):
    _compile_and_check(name, False, tmp_path)


def test_external_data_model(tmp_path):
    proto = models.build("resnet50", tiny=True)
    path = tmp_path / "ext.onnx"
    models.save(proto, path, external_data=True)
    assert (tmp_path / "ext.data").is_file()
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "passed"
