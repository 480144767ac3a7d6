"""`--precision f32|f16` on the command line and in the config: the tolerance follows
the precision unless `rtol` is given, f16 is refused for the cpu target with one line,
and an f16 cuda artifact cross-compiles, records its precision (`inspect`) and runs in
the emulator with float32 inputs and outputs."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import yaml
from helpers.cli import assert_one_line_error, invoke
from onnx import TensorProto, helper, numpy_helper

from hidetc.backends.runtime.select import gpu_available
from hidetc.driver.config import CompileConfig, load_preset, make_config
from hidetc.driver.context import CompileContext
from hidetc.errors import ConfigError

RNG = np.random.default_rng(1)
W = RNG.standard_normal((5, 3)).astype(np.float32)


def _mlp() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="/mm"),
             helper.make_node("Relu", ["h"], ["y"], name="/relu")]
    graph = helper.make_graph(nodes, "mlp", [x], [y], [numpy_helper.from_array(W, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(_mlp(), path)
    return path


def test_tolerance_follows_precision_unless_given():
    assert CompileConfig().tolerance == 1e-4
    assert CompileConfig(target="cuda", precision="f16").tolerance == 1e-2
    assert CompileConfig(target="cuda", precision="f16", rtol=3e-3).tolerance == 3e-3
    assert make_config("default", {"target": "cuda", "precision": "f16"}).tolerance == 1e-2
    preset = load_preset("f16")
    assert preset["precision"] == "f16" and preset["target"] == "cuda"
    with pytest.raises(ConfigError, match="rtol"):
        CompileConfig(rtol=0)
    with pytest.raises(ConfigError, match="precision: expected one of f32, f16"):
        CompileConfig(precision="bf16")


def test_f16_on_cpu_is_one_line_error(model, tmp_path):
    result = invoke("compile", model, "-o", tmp_path / "out", "--target", "cpu",
                    "--precision", "f16")
    assert_one_line_error(result, "f16 precision needs the cuda target", "--target cuda")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="needs the cuda target"):
        CompileContext.create(CompileConfig(target="cpu", precision="f16"))


@pytest.mark.skipif(gpu_available(), reason="--target auto picks cuda here")
def test_f16_with_auto_target_on_a_cpu_machine(model, tmp_path):
    result = invoke("compile", model, "-o", tmp_path / "out", "--precision", "f16")
    assert_one_line_error(result, "f16 precision needs the cuda target",
                          "--target auto picked cpu")
    assert not (tmp_path / "out").exists()


def test_unknown_precision_is_a_usage_error(model, tmp_path):
    result = invoke("compile", model, "-o", tmp_path / "out", "--precision", "f8")
    assert result.exit_code == 2 and "f8" in result.output


def test_f32_artifact_records_precision(model, tmp_path):
    result = invoke("compile", model, "-o", tmp_path / "out", "--target", "cpu")
    assert result.exit_code == 0, result.output
    assert "precision f32" in result.output and "tolerance 0.0001" in result.output
    manifest = yaml.safe_load((tmp_path / "out" / "manifest.yaml").read_text())
    assert manifest["precision"] == "f32"
    assert manifest["verification"]["tolerance"] == 1e-4
    assert json.loads(invoke("inspect", tmp_path / "out", "--json").output)["precision"] == "f32"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_f16_cuda_cross_compile_inspect_and_emulate(model, tmp_path):
    out = tmp_path / "out"
    result = invoke("compile", model, "-o", out, "--target", "cuda", "--precision", "f16",
                    "--arch", "sm_80", "--no-verify")
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "precision f16" in result.output
    text = invoke("inspect", out)
    assert text.exit_code == 0 and "target cuda, precision f16" in text.output
    summary = json.loads(invoke("inspect", out, "--json").output)
    assert summary["precision"] == "f16"
    assert [(s["name"], s["dtype"]) for s in summary["inputs"]] == [("x", "float32")]
    assert [(s["name"], s["dtype"]) for s in summary["outputs"]] == [("y", "float32")]
    assert any("MatMul(float16" in k["task"] for k in summary["kernels"])
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ran = invoke("run", out, "--emulate", "--input", tmp_path / "x.npy", "--output",
                 tmp_path / "y.npz", "--repeat", 1)
    assert ran.exit_code == 0, ran.output + str(ran.exception)
    y = np.load(tmp_path / "y.npz")["y"]
    want = np.maximum(x @ W, 0)
    assert y.dtype == np.float32
    assert np.linalg.norm(y - want) <= 1e-2 * np.linalg.norm(want)
