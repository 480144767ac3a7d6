"""Quantized models compiled for the cuda target (cross-compiled: nvcc builds the cubins,
no GPU needed), their MatMulInteger launches on the int8 tensor-core template
(`cuda.matmul_int8_tc`), then run in the emulator from the artifact's own .cu sources,
sanitized (`hidetc.load(..., emulate=True, sanitize=True)`: red zones around every
tensor, shared-memory race checks, async copies landing only when waited for), against
ONNX Runtime on the same model:

- a hand-built integer model: MatMulInteger on a constant int8 weight with a per-column
  zero point and a run-time activation zero point, Cast and Mul grafted on as its
  epilogue (float output), and MatMulInteger on a run-time uint8 B with both zero points
  as graph inputs (int32 output); both outputs equal ONNX Runtime's bit for bit;
- a tiny MLP quantized by ONNX Runtime's `quantize_dynamic` (DynamicQuantizeLinear +
  MatMulInteger + the scale multiplications), int8 and uint8 weights: within the f32
  bound (the integer products exact; the float steps around them in another order).
"""
from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

import hidetc
from hidetc.driver.verify import compare, run_onnxruntime

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
TEMPLATE = "cuda.matmul_int8_tc"


def compile_cuda(path, out, **options) -> dict:
    """Cross-compile for sm_80 with the default configs (no GPU here: no tuning, no
    verification); the manifest."""
    result = hidetc.compile_model(path, out, target="cuda", arch="sm_80", space=0, tune=False,
                                  **options)
    assert result.manifest["target"] == "cuda"
    return result.manifest


def integer_launches(manifest: dict) -> list[dict]:
    return [k for k in manifest["kernels"] if k["op"] == "MatMulInteger"]


def integer_model(path) -> None:
    rng = np.random.default_rng(3)
    w = rng.integers(-128, 128, (70, 45)).astype(np.int8)
    w_zero = rng.integers(-5, 6, 45).astype(np.int8)
    scale = rng.uniform(1e-4, 1e-2, 45).astype(np.float32)
    nodes = [
        helper.make_node("MatMulInteger", ["a", "w", "a_zero", "w_zero"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["acc_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["acc_f", "scale"], ["y"]),
        helper.make_node("MatMulInteger", ["a", "b", "a_zero", "b_zero"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes, "int8_cuda",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 37, 70]),
         helper.make_tensor_value_info("a_zero", TensorProto.UINT8, []),
         helper.make_tensor_value_info("b", TensorProto.UINT8, [70, 52]),
         helper.make_tensor_value_info("b_zero", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 37, 45]),
         helper.make_tensor_value_info("z", TensorProto.INT32, [2, 37, 52])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w_zero, "w_zero"),
         numpy_helper.from_array(scale, "scale")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def test_integer_model_matches_onnxruntime_exactly(tmp_path):
    path = tmp_path / "int8.onnx"
    integer_model(path)
    manifest = compile_cuda(path, tmp_path / "out")
    launches = integer_launches(manifest)
    assert len(launches) == 2 and all(k["template"] == TEMPLATE for k in launches), launches
    model = hidetc.load(tmp_path / "out", emulate=True, sanitize=True)
    rng = np.random.default_rng(4)
    for extreme in (False, True):        # random, then the ends: 255 x -128 / 255
        a = (rng.choice([0, 255], (2, 37, 70)) if extreme
             else rng.integers(0, 256, (2, 37, 70))).astype(np.uint8)
        b = (np.full((70, 52), 255) if extreme else rng.integers(0, 256, (70, 52))).astype(np.uint8)
        inputs = {"a": a, "a_zero": np.array(rng.integers(0, 256), np.uint8), "b": b,
                  "b_zero": np.array(rng.integers(0, 256), np.uint8)}
        got, want = model.run(inputs), run_onnxruntime(path, inputs)
        assert got["z"].dtype == np.int32 and got["y"].dtype == np.float32
        np.testing.assert_array_equal(got["z"], want["z"])
        np.testing.assert_array_equal(got["y"], want["y"])


def mlp(path, batch=5) -> None:
    """x [batch, 64] -> MatMul, Add, Relu, MatMul, Add -> y [batch, 10] (`batch` a number
    or a symbol)."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2, name)
             for name, shape in (("w1", (64, 96)), ("b1", (96,)), ("w2", (96, 10)),
                                 ("b2", (10,)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h0"]),
             helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]),
             helper.make_node("MatMul", ["h", "w2"], ["y0"]),
             helper.make_node("Add", ["y0", "b2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


@pytest.mark.parametrize("weight_type", [QuantType.QInt8, QuantType.QUInt8],
                         ids=["s8-weights", "u8-weights"])
def test_dynamically_quantized_mlp(weight_type, tmp_path):
    src, dst = tmp_path / "mlp.onnx", tmp_path / "mlp-dynamic.onnx"
    mlp(src)
    quantize_dynamic(src, dst, weight_type=weight_type)
    assert any(n.op_type == "MatMulInteger" for n in onnx.load(dst).graph.node)
    manifest = compile_cuda(dst, tmp_path / "out")
    launches = integer_launches(manifest)
    assert len(launches) == 2 and all(k["template"] == TEMPLATE for k in launches), launches
    model = hidetc.load(tmp_path / "out", emulate=True, sanitize=True)
    inputs = {"x": np.random.default_rng(6).standard_normal((5, 64)).astype(np.float32)}
    report = compare(model.run(inputs), run_onnxruntime(dst, inputs), rtol=1e-4)
    assert report["status"] == "passed", report


@pytest.mark.slow      # (the suite's time: make test-slow runs it)
def test_dynamically_quantized_mlp_over_a_range_of_batches(tmp_path):
    """One artifact for batch 1..40 (the kernels take M as a size parameter; its
    predicated tiles hold at every size), run at three sizes."""
    src, dst = tmp_path / "mlp.onnx", tmp_path / "mlp-dynamic.onnx"
    mlp(src, batch="batch")
    quantize_dynamic(src, dst, weight_type=QuantType.QUInt8)
    manifest = compile_cuda(dst, tmp_path / "out", dims={"batch": "1..40"})
    assert all(k["template"] == TEMPLATE for k in integer_launches(manifest))
    model = hidetc.load(tmp_path / "out", emulate=True, sanitize=True)
    for batch in (1, 7, 40):
        inputs = {"x": np.random.default_rng(batch).standard_normal((batch, 64))
                  .astype(np.float32)}
        report = compare(model.run(inputs), run_onnxruntime(dst, inputs), rtol=1e-4)
        assert report["status"] == "passed", (batch, report)
