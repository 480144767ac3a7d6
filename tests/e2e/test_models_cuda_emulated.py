"""The five tiny benchmark models compiled for the cuda target (cross-compiled: nvcc
builds the cubins, no GPU needed), then every emitted CUDA kernel runs in the emulator
from the artifact's own .cu sources, sanitized (`hidetc.load(..., sanitize=True)`), and
the outputs match ONNX Runtime (f32, 1e-4);
ResNet-50's per-launch profile lines up with its launches."""
from __future__ import annotations

import shutil

import pytest

import hidetc
import models
from hidetc.driver.verify import compare, run_onnxruntime

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@pytest.mark.parametrize("name", sorted(models.REGISTRY))
def test_tiny_model_cuda_emulated(name, tmp_path):
    proto = models.build(name, tiny=True)
    path = tmp_path / f"{name}.onnx"
    models.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cuda", arch="sm_80,sm_90")
    manifest = result.manifest
    assert manifest["target"] == "cuda"
    assert manifest["cuda"]["archs"] == ["sm_80", "sm_90"]
    for module in manifest["cuda"]["modules"]:
        for cubin in module["cubins"].values():
            assert (tmp_path / "out" / cubin).stat().st_size > 0
    launched = {launch["kernel"] for launch in manifest["cuda"]["launches"]}
    assert launched == {k["name"] for k in manifest["kernels"]}
    model = hidetc.load(tmp_path / "out", emulate=True, sanitize=True)
    inputs = models.sample_inputs(proto, seed=2)
    report = compare(model.run(inputs), run_onnxruntime(path, inputs), rtol=1e-4)
    assert report["status"] == "passed", report
    assert not model.uses_graph and "emulated" in model.graph_unavailable
    if name == "resnet50":      # per-launch profile rows line up with the launches
        rows = model.profile(inputs, repeat=1)
        launches = manifest["cuda"]["launches"]
        assert [r["kernel"] for r in rows] == [launch["kernel"] for launch in launches]
        assert [(r["grid"], r["block"]) for r in rows] == \
            [(launch["grid"], launch["block"]) for launch in launches]
        assert all(r["ms"] > 0 for r in rows)
        assert {r["template"] for r in rows} >= {"cuda.conv_gemm"}
