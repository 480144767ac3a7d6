"""`--precision f32|f16|bf16` on the command line and in the config: the tolerance
follows the precision unless `rtol` is given, f16 is refused for the cpu target with one
line, and an f16 cuda artifact cross-compiles, records its precision (`inspect`) and
runs in the emulator with float32 inputs and outputs. bf16 (issue 37, the ISA's fact so
far): the machine records AVX512_BF16 (and AMX-BF16, VNNI), `--cpu-isa avx512_bf16`
names it for a cross-compile, a bf16 compile for a machine without it is one line
naming the missing feature, and an artifact whose kernels use a feature this CPU lacks
is refused with one line; a bf16 cuda artifact cross-compiles like an f16 one (bfloat16
storage: tests/e2e/test_precision_bf16_cuda.py).
The cpu bf16 kernels: tests/schedules/test_cpu_bf16.py."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import yaml
from helpers.cli import assert_one_line_error, invoke
from onnx import TensorProto, helper, numpy_helper

from hidetc import cpu_isa
from hidetc.backends.runtime.select import gpu_available, make_executor
from hidetc.driver.config import CompileConfig, load_preset, make_config
from hidetc.driver.context import CompileContext
from hidetc.errors import ArtifactError, ConfigError
from hidetc.target import detect_cpu

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
    assert CompileConfig(precision="bf16").tolerance == 2e-2
    with pytest.raises(ConfigError, match="precision: expected one of f32, f16, bf16"):
        CompileConfig(precision="fp8")


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
def inspected_and_emulated(out, tmp_path, precision: str, dtype: str):
    """`inspect --json` of a cuda cross-compile of the model (its precision, float32
    interface, a MatMul task in `dtype`) and its output in the emulator: (y, want)."""
    summary = json.loads(invoke("inspect", out, "--json").output)
    assert summary["precision"] == precision
    assert [(s["name"], s["dtype"]) for s in summary["inputs"]] == [("x", "float32")]
    assert [(s["name"], s["dtype"]) for s in summary["outputs"]] == [("y", "float32")]
    assert any(f"MatMul({dtype}" in k["task"] for k in summary["kernels"])
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ran = invoke("run", out, "--emulate", "--input", tmp_path / "x.npy", "--output",
                 tmp_path / "y.npz", "--repeat", 1)
    assert ran.exit_code == 0, ran.output + str(ran.exception)
    y = np.load(tmp_path / "y.npz")["y"]
    assert y.dtype == np.float32
    return y, np.maximum(x @ W, 0)


def test_f16_cuda_cross_compile_inspect_and_emulate(model, tmp_path):
    out = tmp_path / "out"
    result = invoke("compile", model, "-o", out, "--target", "cuda", "--precision", "f16",
                    "--arch", "sm_80", "--no-verify")
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "precision f16" in result.output
    text = invoke("inspect", out)
    assert text.exit_code == 0 and "target cuda, precision f16" in text.output
    y, want = inspected_and_emulated(out, tmp_path, "f16", "float16")
    assert np.linalg.norm(y - want) <= 1e-2 * np.linalg.norm(want)


# ---------------------------------------------------------------- bf16: the ISA's fact


@pytest.fixture
def flags(monkeypatch):
    """Set this host's CPU flags (cpu_isa reads /proc/cpuinfo once, cached)."""
    def set_flags(*names):
        monkeypatch.setattr(cpu_isa, "host_flags", lambda: frozenset(names))
    return set_flags


def test_bf16_without_avx512_bf16_names_the_missing_feature(model, tmp_path, flags):
    flags("avx2", "avx512f")
    result = invoke("compile", model, "-o", tmp_path / "out", "--target", "cpu",
                    "--precision", "bf16")
    assert_one_line_error(result, "--precision bf16 needs AVX512_BF16 (vdpbf16ps)",
                          "which this CPU lacks (it has avx512)", "--precision f32",
                          "--cpu-isa avx512_bf16")
    result = invoke("compile", model, "-o", tmp_path / "out", "--target", "cpu",
                    "--precision", "bf16", "--cpu-isa", "avx2")
    assert_one_line_error(result, "which --cpu-isa avx2 lacks (it has avx2)")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_bf16_cuda_cross_compile_records_precision_and_emulates(model, tmp_path):
    out = tmp_path / "out"
    result = invoke("compile", model, "-o", out, "--target", "cuda", "--precision", "bf16",
                    "--arch", "sm_80")
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "precision bf16" in result.output
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert manifest["precision"] == "bf16" and manifest["config"]["precision"] == "bf16"
    assert manifest["verification"]["status"] == "skipped"     # no GPU: cross-compiled
    y, want = inspected_and_emulated(out, tmp_path, "bf16", "bfloat16")
    assert not np.array_equal(y, want)     # really rounded
    assert np.linalg.norm(y - want) <= 2e-2 * np.linalg.norm(want)


def test_the_machine_records_its_features_and_cpu_isa_names_them(model, tmp_path, flags):
    flags("avx2", "avx512f", "avx512_bf16", "amx_bf16")
    assert detect_cpu().features == ("avx512_bf16", "amx_bf16")
    assert detect_cpu(isa="avx512").features == ()          # a named ISA: its features
    named = detect_cpu(isa="avx512_bf16")
    assert (named.isa, named.features) == ("avx512", ("avx512_bf16",))
    out = tmp_path / "out"
    result = invoke("compile", model, "-o", out, "--target", "cpu", "--cpu-isa",
                    "avx512_bf16")
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert manifest["machine"]["features"] == ["avx512_bf16"]
    assert manifest["cpu_isa"] == "avx512" and manifest["cpu_features"] == []   # f32 kernels


def test_an_artifact_using_a_feature_this_cpu_lacks_is_refused(model, tmp_path, flags):
    out = tmp_path / "out"
    assert invoke("compile", model, "-o", out, "--target", "cpu").exit_code == 0
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    manifest["cpu_features"] = ["avx512_bf16"]          # what a bf16 artifact records
    flags("avx2", "avx512f")
    with pytest.raises(ArtifactError, match=r"kernels use avx512_bf16, which this CPU "
                                            r"lacks: compile it here"):
        make_executor(out, manifest)
