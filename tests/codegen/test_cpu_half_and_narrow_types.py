"""float16/bfloat16 tensors and the narrow ONNX types (float8, float4, float8e8m0,
int4/uint4/int2/uint2) on the cpu target: small ONNX models compiled through the ONNX
backend and compared with numpy/ml_dtypes and onnx.reference.

Half arithmetic is checked bit-exactly where numpy's semantics are exact (one rounding
per operation, sums accumulated in float32); math functions within the f16 tolerance
(1e-3 relative) of the reference; the narrow conversions bit-exactly (NaN payloads
aside) against `reference_cast`, itself checked against onnx.reference's Cast.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from helpers import targets
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from hidetc.compute.narrow_types import FLOAT8, NARROW_DTYPES, reference_cast
from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.graph.passes import widen_half_cpu
from hidetc.schedules import cpu
from hidetc.tools import onnx_backend

ELEM = {np.dtype(n): helper.np_dtype_to_tensor_dtype(np.dtype(n)) for n in
        ("float32", "float16", "bfloat16", "bool", *NARROW_DTYPES)}


def _model(nodes, inputs: dict, outputs: dict, inits: dict | None = None, opset: int = 25):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(k, ELEM[v.dtype], v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, ELEM[np.dtype(d)], s) for k, (d, s) in
         outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 11
    return model


def _run(model, inputs: dict) -> list[np.ndarray]:
    return list(onnx_backend.prepare(model, "CPU").run(list(inputs.values())))


def _reference(model, inputs: dict) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(None, inputs)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal dtype and bytes, except that any NaN matches any NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want.astype(np.float32)) if want.dtype.name not in \
        ("int4", "uint4", "int2", "uint2") else np.zeros(want.shape, bool)
    got_bits, want_bits = (a.view(f"u{a.dtype.itemsize}") for a in (got, want))
    assert np.array_equal(np.isnan(got.astype(np.float32)) & nan, nan)
    assert np.array_equal(got_bits[~nan], want_bits[~nan]), (got, want)


# float16 / bfloat16 arithmetic -------------------------------------------------------------
def _chain(dtype: str):
    """y = (a * b + c) / d, Max(y, a) and Relu(a - c): fused into one kernel."""
    shape = [3, 37]
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Add", ["m", "c"],
                                                                       ["s"]),
             helper.make_node("Div", ["s", "d"], ["y"]), helper.make_node("Max", ["y", "a"],
                                                                          ["z"]),
             helper.make_node("Sub", ["a", "c"], ["t"]), helper.make_node("Relu", ["t"], ["r"])]
    rng = np.random.default_rng(0)
    inputs = {k: (rng.standard_normal(shape) * 4).astype(dtype) for k in "abcd"}
    return _model(nodes, inputs, {"y": (dtype, shape), "z": (dtype, shape),
                                  "r": (dtype, shape)}), inputs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_arithmetic_rounds_each_operation(dtype):
    model, inputs = _chain(dtype)
    # ties: with one rounding (a*b + c in float) 1 + 2^-11 + 2^-11 would not round to 1
    inputs["a"][0, :2] = 1
    inputs["b"][0, :2] = 2.0 ** -11 if dtype == "float16" else 2.0 ** -8
    inputs["c"][0, :2] = inputs["b"][0, :2]
    inputs["d"][0, :2] = 1
    a, b, c, d = (inputs[k] for k in "abcd")
    y = (a * b + c) / d           # numpy/ml_dtypes: each operation rounded to the dtype
    want = [y, np.maximum(y, a), np.maximum(a - c, np.array(0, dtype))]
    for got, ref in zip(_run(model, inputs), want):
        _same_bits(got, ref.astype(dtype))


@pytest.mark.parametrize("op", ["Sigmoid", "Exp", "Tanh", "Sqrt", "Erf"])
def test_float16_math_functions(op):
    x = np.linspace(-4 if op != "Sqrt" else 0, 4, 97).astype(np.float16)
    model = _model([helper.make_node(op, ["x"], ["y"])], {"x": x}, {"y": ("float16", [97])})
    got, = _run(model, {"x": x})
    want, = _reference(model, {"x": x})
    assert got.dtype == np.float16
    # one libm call rounded once: within 1e-3; Sigmoid is the formula 1 / (1 + exp(-x)),
    # three float16 roundings (as numpy evaluates it): within two float16 ulps
    rtol = 2 * 2.0 ** -10 if op == "Sigmoid" else 1e-3
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=rtol,
                               atol=1e-7)


def test_bfloat16_math_and_special_values():
    x = np.array([0.5, -2, 3.25, 0, -0.0, np.inf, -np.inf, np.nan, 100, -7.75],
                 ml_dtypes.bfloat16)
    model = _model([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Neg", ["x"], ["n"]),
                    helper.make_node("IsNaN", ["x"], ["isnan"])],
                   {"x": x}, {"e": ("bfloat16", [10]), "n": ("bfloat16", [10]),
                              "isnan": ("bool", [10])})
    e, n, isnan = _run(model, {"x": x})
    want = np.exp(x.astype(np.float32)).astype(ml_dtypes.bfloat16)
    _same_bits(e, want)
    _same_bits(n, -x)
    assert np.array_equal(isnan, np.isnan(x.astype(np.float32)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_reductions_and_softmax_accumulate_in_float32(dtype):
    rng = np.random.default_rng(1)
    x = rng.random((4, 300)).astype(dtype)
    axes = np.array([1], np.int64)
    model = _model([helper.make_node("ReduceSum", ["x", "axes"], ["s"]),
                    helper.make_node("Softmax", ["x"], ["p"], axis=1)],
                   {"x": x}, {"s": (dtype, [4, 1]), "p": (dtype, [4, 300])},
                   inits={"axes": axes}, opset=18)
    s, p = _run(model, {"x": x})
    wide = x.astype(np.float32)
    _same_bits(s, wide.sum(axis=1, keepdims=True).astype(dtype))   # numpy sums f16 so
    top = x.max(axis=1, keepdims=True)
    e = np.exp((x - top).astype(np.float32)).astype(dtype)             # rounded per op
    want = (e / e.astype(np.float32).sum(axis=1, keepdims=True).astype(dtype)).astype(dtype)
    np.testing.assert_allclose(p.astype(np.float32), want.astype(np.float32), rtol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_matmul_and_conv_are_computed_in_float32(dtype):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((5, 33)).astype(dtype)
    w = rng.standard_normal((33, 7)).astype(dtype)       # a constant weight
    img = rng.standard_normal((1, 3, 9, 9)).astype(dtype)
    k = rng.standard_normal((4, 3, 3, 3)).astype(dtype)
    model = _model([helper.make_node("MatMul", ["a", "w"], ["y"]),
                    helper.make_node("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1])],
                   {"a": a, "img": img}, {"y": (dtype, [5, 7]), "c": (dtype, [1, 4, 9, 9])},
                   inits={"w": w, "k": k}, opset=18)
    y, c = _run(model, {"a": a, "img": img})
    rtol = 1e-3 if dtype == "float16" else 2.0 ** -7
    want_y = (a.astype(np.float32) @ w.astype(np.float32)).astype(dtype)
    np.testing.assert_allclose(y.astype(np.float32), want_y.astype(np.float32), rtol=rtol,
                               atol=1e-3)
    assert y.dtype == np.dtype(dtype) and c.dtype == np.dtype(dtype)
    conv_f32 = model_conv_f32(img, k)
    np.testing.assert_allclose(c.astype(np.float32), conv_f32.astype(dtype).astype(np.float32),
                               rtol=rtol, atol=1e-2)


def model_conv_f32(img: np.ndarray, k: np.ndarray) -> np.ndarray:
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    model = helper.make_model(helper.make_graph(
        [node], "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, img.shape),
                      helper.make_tensor_value_info("w", TensorProto.FLOAT, k.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 18)])
    return ReferenceEvaluator(model).run(None, {"x": img.astype(np.float32),
                                                "w": k.astype(np.float32)})[0]


def test_widen_half_cpu_pass():
    t16 = TensorType("float16", (2, 2))
    graph = Graph(("a",), ("y",), (Node.make("MatMul", ("a", "w"), ("y",), name="mm"),),
                  {"a": t16, "w": t16, "y": t16}, {"w": np.eye(2, dtype=np.float16)})
    out = widen_half_cpu.run(graph)
    assert [n.op for n in out.nodes] == ["Cast", "MatMul", "Cast"]
    mm = out.nodes[1]
    assert all(out.types[v].dtype == "float32" for v in (*mm.inputs, *mm.outputs))
    assert out.constants[mm.inputs[1]].dtype == np.float32      # the weight converted once
    assert out.types["y"].dtype == "float16" and out.outputs == ("y",)
    t = TensorType("float16", (2,))
    relu = Graph(("a",), ("y",), (Node.make("Relu", ("a",), ("y",), name="r"),),
                 {"a": t, "y": t}, {})
    assert widen_half_cpu.run(relu) is relu


def test_templates_refuse_half_tasks_cleanly():
    t = TensorType("float16", (4, 4))
    task = Task("MatMul", (t, t), (t,), (), (None, None))
    with pytest.raises(UnsupportedOpError, match="MatMul: dtype float16 .*float32 only"):
        cpu.kernel_choice(task, targets.CPU)
    with pytest.raises(UnsupportedOpError, match="float32 only"):
        cpu.build_kernel(task, "mm", targets.CPU)
    n = TensorType("float8_e4m3fn", (4,))
    with pytest.raises(UnsupportedOpError, match="only supported by Cast"):
        cpu.check_dtypes(Task("Relu", (n,), (n,), (), (None,)))


# narrow types -----------------------------------------------------------------------------
def _float_samples() -> np.ndarray:
    rng = np.random.default_rng(3)
    special = [0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-7, -1e-7, 448, 464, 465, 480,
               240, 248, 57344, 61440, 61441, 6, 7, 0.25, 0.75, 1.5, -3.5, 2.0 ** -9,
               2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -17, 2.0 ** -126, 2.0 ** -127, 3e38, -9,
               -8.5, 15, 16, 300, 7.7]
    grid = np.concatenate([rng.standard_normal(400) * s for s in (1e-3, 1, 30, 3000)])
    return np.concatenate([special, grid]).astype(np.float32)


def test_reference_cast_matches_onnx_reference():
    x = _float_samples()
    for to in NARROW_DTYPES:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(to))
        for saturate in (0, 1):
            for mode in (("up", "down", "nearest") if to == "float8_e8m0fnu" else ("up",)):
                attrs = {"to": elem, "saturate": saturate}
                if to == "float8_e8m0fnu":
                    attrs["round_mode"] = mode
                model = _model([helper.make_node("Cast", ["x"], ["y"], **attrs)], {"x": x},
                               {"y": (to, [x.size])})
                want, = _reference(model, {"x": x})
                _same_bits(reference_cast(x, to, bool(saturate), mode), want)


@pytest.mark.parametrize("source", ["float32", "float16"])
def test_casts_to_narrow_types(source):
    x = _float_samples().astype(source)
    nodes, outputs, want = [], {}, {}
    for to in NARROW_DTYPES:
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(to))
        for saturate in (0, 1):
            modes = ("up", "down", "nearest") if to == "float8_e8m0fnu" else ("up",)
            for mode in modes:
                name = f"{to}_{saturate}_{mode}"
                attrs = {"to": elem, "saturate": saturate}
                if to == "float8_e8m0fnu":
                    attrs["round_mode"] = mode
                nodes.append(helper.make_node("Cast", ["x"], [name], **attrs))
                outputs[name] = (to, [x.size])
                want[name] = reference_cast(x, to, bool(saturate), mode)
    model = _model(nodes, {"x": x}, outputs)
    for name, got in zip(outputs, _run(model, {"x": x})):
        _same_bits(got, want[name])


def test_casts_from_narrow_types():
    inputs = {}
    for t in NARROW_DTYPES:
        width = 4 if t in ("int4", "uint4", "float4_e2m1fn") else 2 if t in ("int2", "uint2") \
            else 8
        inputs[t.replace("float", "f")] = np.arange(1 << width, dtype=np.uint8).view(t)
    nodes, outputs = [], {}
    for name, a in inputs.items():
        for to in ("float32", "float16"):
            nodes.append(helper.make_node("Cast", [name], [f"{name}_{to}"],
                                          to=helper.np_dtype_to_tensor_dtype(np.dtype(to))))
            outputs[f"{name}_{to}"] = (to, [a.size])
    # narrow -> narrow and a data-movement op on a narrow tensor
    nodes.append(helper.make_node("Cast", ["f8_e5m2"], ["e5_to_e4"], to=TensorProto.FLOAT8E4M3FN))
    outputs["e5_to_e4"] = ("float8_e4m3fn", [256])
    nodes.append(helper.make_node("Transpose", ["int4"], ["int4_t"]))
    outputs["int4_t"] = ("int4", [16])
    model = _model(nodes, inputs, outputs)
    got = dict(zip(outputs, _run(model, inputs)))
    for name, a in inputs.items():
        for to in ("float32", "float16"):
            _same_bits(got[f"{name}_{to}"], a.astype(to))
    _same_bits(got["e5_to_e4"], reference_cast(inputs["f8_e5m2"].astype(np.float32),
                                                "float8_e4m3fn"))
    _same_bits(got["int4_t"], inputs["int4"])


def test_narrow_constants_round_trip_through_the_weights_file():
    w = np.array([0.5, -448, 3, np.nan], np.float32).astype(ml_dtypes.float8_e4m3fn)
    x = np.zeros(4, np.float32)
    model = _model([helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
                    helper.make_node("Add", ["x", "wf"], ["y"])], {"x": x},
                   {"y": ("float32", [4])}, inits={"w": w})
    y, = _run(model, {"x": x})
    np.testing.assert_array_equal(y, w.astype(np.float32))


def test_float8_saturation_table():
    """The ONNX Cast table (saturate=1): +-inf and out-of-range values -> +-max."""
    x = np.array([np.inf, -np.inf, 1e6, -1e6], np.float32)
    for to in FLOAT8:
        m = float(ml_dtypes.finfo(to).max)
        assert reference_cast(x, to).astype(np.float32).tolist() == [m, -m, m, -m]
    assert np.isnan(reference_cast(x, "float8_e4m3fn", saturate=False).astype(np.float32)).all()
    assert onnx.TensorProto.FLOAT8E4M3FN == ELEM[np.dtype("float8_e4m3fn")]


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("int32", "float32"),
                                     ("float64", "int64"), ("float16", "uint16"),
                                     ("uint16", "bfloat16"), ("uint8", "bool"),
                                     ("int16", "uint16")])
def test_bitcast_in_the_ir_interpreter_and_in_c(src, dst):
    """`compute.bitcast.bitcast` run by the IR interpreter and compiled by gcc: both the
    numpy view, bit for bit (signed zeros, infinities, NaN payloads)."""
    from hidetc.backends.codegen.c import print_c_module
    from hidetc.backends.toolchain.gcc import build_shared_library
    from hidetc.compute.bitcast import bitcast
    from hidetc.tir.builder import KernelBuilder
    from hidetc.tir.evaluate import run_function
    from hidetc.tir.pipeline import lower

    raw = np.array([0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7F800001,
                    0xFFC00000, 0x3FF0000000000000], np.uint64)
    width = np.dtype(src).itemsize
    x = (raw & np.uint64((1 << (8 * width)) - 1)).astype(f"uint{8 * width}").view(src)
    want = x.view(np.uint8) != 0 if dst == "bool" else x.view(dst)
    kb = KernelBuilder("bc")
    a, out = kb.buffer("a", src, x.shape), kb.buffer("out", dst, x.shape)
    with kb.for_range(x.size, name="i") as i:
        kb.store(out, (i,), bitcast(a[i], dst))
    fn = lower(kb.finish())
    got = np.zeros_like(want)
    if src != "bfloat16" and dst != "bfloat16":     # the interpreter has no bfloat16 bits
        run_function(fn, [x.copy(), got])
        assert got.tobytes() == want.tobytes(), (got, want)
    import ctypes
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = Path(tmp) / "bc.so"
        build_shared_library({"bc.c": print_c_module([fn])}, lib_path)
        lib = ctypes.CDLL(str(lib_path))
        got = np.zeros_like(want)
        lib.bc(ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(got.ctypes.data))
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (got, want)
