"""Every op the CPU target compiles, end to end: a one-node ONNX model is compiled with
hidetc (which verifies against ONNX Runtime at the f32 tolerance, 1e-4 norm-wise) and
the artifact's outputs are also checked against our numpy reference interpreter.
Shapes are awkward on purpose: 1, primes, broadcasts."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers.onnx_util import bitcast_model, one_node_model
from helpers.op_cases import CASES, N_OUTPUTS

import hidetc
from hidetc.errors import HidetcError
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.reference import run_graph


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_compiles_and_matches(case, tmp_path):
    op, inputs, attrs, constants = CASES[case]
    outputs = [f"out{i}" for i in range(N_OUTPUTS.get(case, 1))]
    model = one_node_model(op, inputs, outputs, attrs, constants)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "passed"
    got = hidetc.load(tmp_path / "out").run(inputs)
    expected = run_graph(load_model(path), inputs)
    for name in outputs:
        assert got[name].dtype == expected[name].dtype
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)


def test_constant_conv_weights_are_packed_at_compile_time(tmp_path):
    """A Conv's constant weights reach its kernel pre-packed (only the packed copy is
    stored); weights given as a graph input are read as they come."""
    for case, packed in (("conv_ragged", True), ("conv_weights_input", False)):
        op, inputs, attrs, constants = CASES[case]
        path = tmp_path / f"{case}.onnx"
        onnx.save(one_node_model(op, inputs, ["out0"], attrs, constants), path)
        result = hidetc.compile_model(path, tmp_path / case, target="cpu", layout="nchw")
        (kernel,) = [k for k in result.manifest["kernels"] if k["op"] == "Conv"]
        weight = kernel["args"][1]
        assert weight.startswith("w.packed_mr") == packed, kernel["args"]
        stored = set(result.manifest["weights"]["entries"])
        assert ("w" in stored) == (not packed and "w" in constants), stored
        got = hidetc.load(tmp_path / case).run(inputs)["out0"]
        expected = run_graph(load_model(path), inputs)["out0"]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    # channels-last (the cpu default): the OHWI constant packed into W^T panels
    result = hidetc.compile_model(tmp_path / "conv_ragged.onnx", tmp_path / "nhwc", target="cpu")
    (kernel,) = [k for k in result.manifest["kernels"] if k["op"] == "ConvNHWC"]
    assert any(a.startswith("w_ohwi.packed_t") for a in kernel["args"]), kernel["args"]
    assert result.manifest["verification"]["status"] == "passed"


POOL_CASES = sorted(c for c in CASES if "pool" in c and not c.startswith("global"))


@pytest.mark.parametrize("case", POOL_CASES + ["global_avgpool"])
def test_pools_after_an_nhwc_conv_run_channels_last(case, tmp_path):
    """Each pool case behind a 1x1 conv from 8 to 9 channels: on the cpu the conv goes
    NHWC and the pool follows it (MaxPoolNHWC / AveragePoolNHWC / ReduceMean), verified
    against ONNX Runtime and our reference."""
    from onnx import helper, numpy_helper

    op, inputs, attrs, _ = CASES[case]
    rng = np.random.default_rng(1)
    n, _, h, wd = inputs["x"].shape
    x = rng.standard_normal((n, 8, h, wd)).astype(np.float32)
    inputs = {"x": x}
    w = rng.standard_normal((9, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node(op, ["c"], ["out0"], **attrs)]
    graph = helper.make_graph(
        nodes, "pool_nhwc", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("out0", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    ops = {k["op"] for k in result.manifest["kernels"]}
    assert ops & {"MaxPoolNHWC", "AveragePoolNHWC", "ReduceMean"}, ops
    assert result.manifest["verification"]["status"] == "passed"
    got = hidetc.load(tmp_path / "out").run(inputs)["out0"]
    expected = run_graph(load_model(path), inputs)["out0"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_tensor_scatter_writes_the_cache_in_one_kernel(tmp_path):
    """TensorScatter-24 (a KV-cache update) is read as Where(valid, GatherElements(update,
    ...), past): one injective kernel writes the cache (the circular write positions,
    [batch, 1, seq, 1], may be a kernel of their own); a circular decode write that
    wraps past the cache's end, verified against ONNX Runtime and the reference."""
    rng = np.random.default_rng(2)
    inputs = {"past": rng.standard_normal((2, 3, 7, 5)).astype(np.float32),
              "update": rng.standard_normal((2, 3, 3, 5)).astype(np.float32),
              "write": np.array([5, 1], np.int64)}
    model = one_node_model("TensorScatter", inputs, ["out0"], {"mode": "circular"}, opset=24)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "passed"
    tasks = [k["task"] for k in result.manifest["kernels"]]
    assert sum("[2,3,7,5]" in t for t in tasks) == 1 and len(tasks) <= 2, tasks
    got = hidetc.load(tmp_path / "out").run(inputs)["out0"]
    expected = inputs["past"].copy()
    for s in range(3):
        for b, w in enumerate(inputs["write"]):
            expected[b, :, (w + s) % 7] = inputs["update"][b, :, s]
    np.testing.assert_array_equal(got, expected)


def _bitcast_inputs():
    """Bit patterns worth reinterpreting: signed zeros, infinities, NaNs, subnormals,
    integer extremes."""
    f32 = np.array([0.0, -0.0, 1.5, -np.inf, np.inf, np.nan, 1e-45, -3.4e38], np.float32)
    with np.errstate(over="ignore"):
        f16 = f32.astype(np.float16)     # -3.4e38 -> -inf
    return {
        ("float32", "int32"): f32,
        ("int32", "float32"): np.array([0, -1, 2**31 - 1, -2**31, 0x3FC00000, 0x7F800001,
                                        1, 0x00400000], np.int32),
        ("float64", "uint64"): f32.astype(np.float64) * 3,
        ("int64", "float64"): np.array([-1, 0, 2**62, -2**63, 0x7FF0000000000000], np.int64),
        ("float16", "int16"): f16,
        ("uint16", "float16"): np.array([0, 0x8000, 0x7C00, 0x7E00, 1, 0x3C00, 65535],
                                        np.uint16),
        ("int8", "uint8"): np.array([-128, -1, 0, 1, 127], np.int8),
        ("bool", "uint8"): np.array([True, False, True]),
        ("uint8", "bool"): np.array([0, 1, 2, 255], np.uint8),
        ("uint32", "int32"): np.array([0, 1, 2**31, 2**32 - 1], np.uint32),
    }


@pytest.mark.parametrize("src,dst", sorted(_bitcast_inputs()))
def test_bitcast_compiles_and_keeps_the_bits(src, dst, tmp_path):
    """BitCast-26 compiled for the cpu: verified against ONNX Runtime, and bit for bit
    the numpy view (NaN payloads, -0, subnormals and integer extremes kept)."""
    x = _bitcast_inputs()[(src, dst)].reshape(1, -1)
    path = tmp_path / "model.onnx"
    onnx.save(bitcast_model(x, dst), path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "passed"
    got = hidetc.load(tmp_path / "out").run({"x": x})["out0"]
    expected = x.view(np.uint8) != 0 if dst == "bool" else x.view(dst)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("src,dst,values", [
    ("float8_e4m3fn", "uint8", [0x00, 0x80, 0x7F, 0x3C, 0x01]),
    ("uint8", "float8_e5m2", [0x00, 0x7C, 0xFF, 0x3C]),
    ("int4", "uint4", [-8, -1, 0, 7]),
    ("bfloat16", "float16", [0x3F80, 0x8000, 0x7F80, 0x0001])])
def test_bitcast_of_narrow_and_bfloat16_storage(src, dst, values, tmp_path):
    """The types ONNX Runtime has no BitCast for (checked against the numpy view only):
    a float8 or sub-byte value is its stored byte, a bfloat16 its 16 bits."""
    import ml_dtypes  # noqa: F401  (registers the narrow dtype names)
    raw = np.array(values)
    x = (raw.astype(np.uint16).view(src) if src == "bfloat16" else
         raw.astype(np.uint8).view(src) if src.startswith("float8") else
         raw.astype(src)).reshape(1, -1)
    path = tmp_path / "model.onnx"
    onnx.save(bitcast_model(x, dst, src), path)
    hidetc.compile_model(path, tmp_path / "out", target="cpu", verify=False)
    got = hidetc.load(tmp_path / "out").run({"x": x})["out0"]
    assert got.dtype == np.dtype(dst) and got.tobytes() == x.view(dst).tobytes()


def test_bitcast_of_different_widths_is_refused(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(bitcast_model(np.zeros((2,), np.float32), "int16"), path)
    with pytest.raises(HidetcError, match=r"BitCast.*float32 \(32 bits\) and "
                       r"to=int16 is 16 bits: BitCast needs the same width"):
        hidetc.compile_model(path, tmp_path / "out", target="cpu")
