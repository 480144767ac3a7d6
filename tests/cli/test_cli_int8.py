"""The int8 features in the machine model: a quantized model cross-compiled for a named
int8 ISA (`--cpu-isa avx2_vnni | avx512_vnni | amx_int8`) records the block's feature in
the manifest's `cpu_features` and the tuning records' key; a host without it refuses
the artifact in one line; an f32 model records none."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml
from helpers.cli import invoke
from onnx import TensorProto, helper, numpy_helper

from hidetc import cpu_isa
from hidetc.backends.runtime.select import make_executor
from hidetc.driver.tune.keys import cpu_arch
from hidetc.errors import ArtifactError
from hidetc.target import detect_cpu


@pytest.fixture
def quantized(tmp_path):
    """x (uint8) -> MatMulInteger with int8 weights and x's zero point -> Cast -> Mul."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.integers(-128, 127, (64, 32)).astype(np.int8), "w")
    zero = numpy_helper.from_array(np.array(3, np.uint8), "xz")
    scale = numpy_helper.from_array(np.array(0.01, np.float32), "s")
    nodes = [helper.make_node("MatMulInteger", ["x", "w", "xz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "s"], ["y"])]
    graph = helper.make_graph(nodes, "q", [helper.make_tensor_value_info(
        "x", TensorProto.UINT8, [8, 64])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [8, 32])], [w, zero, scale])
    path = tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def flags(monkeypatch):
    def set_flags(*names):
        monkeypatch.setattr(cpu_isa, "host_flags", lambda: frozenset(names))
    return set_flags


@pytest.mark.parametrize("isa, feature", [("avx2_vnni", "avx_vnni"),
                                          ("avx512_vnni", "avx512_vnni"),
                                          ("amx_int8", "amx_int8")])
def test_a_named_int8_isa_is_recorded_and_refused_without_it(quantized, tmp_path, flags,
                                                               isa, feature):
    out = tmp_path / "out"
    result = invoke("compile", quantized, "-o", out, "--target", "cpu", "--cpu-isa", isa,
                    "--no-verify", "--no-tune")
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert manifest["cpu_features"] == [feature]
    assert f"+{feature}" in cpu_arch(detect_cpu(isa=isa))
    flags("avx2", "fma", "avx512f")         # the ISA, not the int8 feature
    with pytest.raises(ArtifactError, match=f"kernels use {feature}, which this CPU lacks"):
        make_executor(out, manifest)


def test_without_an_int8_feature_the_exact_avx2_block_needs_none(quantized, tmp_path):
    out = tmp_path / "out"
    result = invoke("compile", quantized, "-o", out, "--target", "cpu", "--cpu-isa", "avx2")
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert manifest["cpu_features"] == [] and manifest["verification"]["status"] == "passed"
