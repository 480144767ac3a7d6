"""Op coverage part B beyond the shared one-node cases (tests/helpers/op_cases.py, opset
18, four input dtypes): ops of newer opsets (Gelu-20, GroupNormalization-21), the bitwise
ops on every integer dtype, the NonZero and float16-on-cpu refusals, and the Resize
reference against ONNX's own reference implementation."""
from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import hidetc
from hidetc.errors import HidetcError, ShapeError
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.ops import get_op
from hidetc.graph.reference import run_graph

R = np.random.default_rng(7)
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _model(nodes, inputs: dict, outputs: dict, opset: int, constants: dict | None = None):
    tensor = helper.np_dtype_to_tensor_dtype
    graph = helper.make_graph(
        nodes, "part_b",
        [helper.make_tensor_value_info(k, tensor(v.dtype), v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(k, tensor(np.dtype(d)), s)
         for k, (d, s) in outputs.items()],
        [numpy_helper.from_array(v, k) for k, v in (constants or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _compile_and_check(model, inputs, tmp_path, target="cpu", rtol=1e-4, atol=1e-5):
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    if target == "cpu":
        hidetc.compile_model(path, tmp_path / "out", target="cpu")
        got = hidetc.load(tmp_path / "out").run(inputs)
    else:
        hidetc.compile_model(path, tmp_path / "out", target="cuda", arch="sm_90")
        got = hidetc.load(tmp_path / "out", emulate=True).run(inputs)
    expected = run_graph(load_model(path), inputs)
    for name, want in expected.items():
        assert got[name].dtype == want.dtype
        np.testing.assert_allclose(got[name], want, rtol=rtol, atol=atol)
    return got


def _targets():
    cuda = pytest.param("cuda", marks=pytest.mark.skipif(shutil.which("nvcc") is None,
                                                         reason="nvcc not installed"))
    return ["cpu", cuda]


@pytest.mark.parametrize("target", _targets())
def test_gelu_and_groupnorm_new_opsets(target, tmp_path):
    x = R.standard_normal((2, 6, 5, 3)).astype(np.float32) * 3 + 1
    nodes = [helper.make_node("Gelu", ["x"], ["g"]),
             helper.make_node("Gelu", ["x"], ["t"], approximate="tanh"),
             helper.make_node("GroupNormalization", ["x", "s", "b"], ["n"], num_groups=3,
                              epsilon=1e-3)]
    shape = list(x.shape)
    model = _model(nodes, {"x": x}, {k: ("float32", shape) for k in "gtn"}, 21,
                   {"s": R.standard_normal(6).astype(np.float32),
                    "b": R.standard_normal(6).astype(np.float32)})
    _compile_and_check(model, {"x": x}, tmp_path, target)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_bitwise_every_int_dtype_cpu(dtype, tmp_path):
    info = np.iinfo(dtype)
    a = R.integers(info.min, info.max, (3, 5), dtype=dtype, endpoint=True)
    b = R.integers(info.min, info.max, (5,), dtype=dtype, endpoint=True)
    a.flat[:4] = [info.min, info.max, 0, info.max]
    nodes = [helper.make_node(op, ["a", "b"], [op.lower()])
             for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")]
    nodes.append(helper.make_node("BitwiseNot", ["a"], ["bitwisenot"]))
    outputs = {n.output[0]: (dtype, [3, 5]) for n in nodes}
    got = _compile_and_check(_model(nodes, {"a": a, "b": b}, outputs, 18), {"a": a, "b": b},
                             tmp_path, rtol=0, atol=0)
    np.testing.assert_array_equal(got["bitwiseand"], a & b)
    np.testing.assert_array_equal(got["bitwisexor"], a ^ b)
    np.testing.assert_array_equal(got["bitwisenot"], ~a)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_bitwise_uint64_int16_cuda(tmp_path):
    a = R.integers(0, 2**64 - 1, (2, 7), dtype="uint64", endpoint=True)
    b = R.integers(0, 2**64 - 1, (7,), dtype="uint64", endpoint=True)
    c = R.integers(-2**15, 2**15 - 1, (9,), dtype="int16", endpoint=True)
    nodes = [helper.make_node("BitwiseXor", ["a", "b"], ["x"]),
             helper.make_node("BitwiseNot", ["c"], ["n"])]
    outputs = {"x": ("uint64", [2, 7]), "n": ("int16", [9])}
    inputs = {"a": a, "b": b, "c": c}
    got = _compile_and_check(_model(nodes, inputs, outputs, 18), inputs, tmp_path, "cuda",
                             rtol=0, atol=0)
    np.testing.assert_array_equal(got["x"], a ^ b)
    np.testing.assert_array_equal(got["n"], ~c)


def test_float16_max_on_cpu(tmp_path):
    a = np.array([1.5, -2.0, np.nan], np.float16)
    b = np.array([0.25, -1.0, 3.0], np.float16)
    model = _model([helper.make_node("Max", ["a", "b"], ["y"])], {"a": a, "b": b},
                   {"y": ("float16", [3])}, 13)
    onnx.save(model, tmp_path / "m.onnx")
    hidetc.compile_model(tmp_path / "m.onnx", tmp_path / "out", target="cpu")
    got = hidetc.load(tmp_path / "out").run({"a": a, "b": b})
    np.testing.assert_array_equal(next(iter(got.values())), np.maximum(a, b))


def test_nonzero_needs_a_constant_and_folds_one(tmp_path):
    cond = np.array([[1, 0, 2], [0, 0, 3]], np.float32)
    model = _model([helper.make_node("NonZero", ["c"], ["y"])], {"c": cond},
                   {"y": ("int64", None)}, 13)
    onnx.save(model, tmp_path / "dynamic.onnx")
    with pytest.raises(HidetcError, match="data-dependent shapes"):
        load_model(tmp_path / "dynamic.onnx")
    opdef = get_op("NonZero")
    (t,) = opdef.infer([onnx_type(cond)], {}, [cond])
    assert t.shape == (2, 3) and t.dtype == "int64"
    np.testing.assert_array_equal(opdef.reference([cond], {})[0], np.array(np.nonzero(cond)))
    with pytest.raises(ShapeError):
        opdef.infer([onnx_type(cond)], {}, [None])


def onnx_type(array):
    from hidetc.graph.ir import TensorType
    return TensorType(str(array.dtype), array.shape)


RESIZE_CASES = [
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, [1, 1, 1.7, 0.55], None),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None,
     [1, 3, 1, 6]),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
     [1, 1, 0.7, 2.3], None),
    ({"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 0.8, 1.9], None),
    ({"mode": "cubic", "antialias": 1}, [1, 1, 0.45, 0.7], None),
    ({"mode": "linear", "antialias": 1, "exclude_outside": 1}, None, [2, 3, 3, 2]),
    ({"mode": "nearest", "axes": [3, 1], "keep_aspect_ratio_policy": "not_smaller"}, None,
     [5, 4]),
]


@pytest.mark.parametrize("k", range(len(RESIZE_CASES)))
def test_resize_reference_matches_onnx(k):
    attrs, scales, sizes = RESIZE_CASES[k]
    x = R.standard_normal((2, 3, 7, 5)).astype(np.float32)
    scales = None if scales is None else np.array(scales, np.float32)
    sizes = None if sizes is None else np.array(sizes, np.int64)
    node = helper.make_node("Resize", ["x", "", "sc" if scales is not None else "",
                                       "sz" if sizes is not None else ""], ["y"], **attrs)
    feeds = {"x": x, **({"sc": scales} if scales is not None else {}),
             **({"sz": sizes} if sizes is not None else {})}
    model = _model([node], feeds, {"y": ("float32", None)}, 19)
    (expected,) = ReferenceEvaluator(model).run(None, feeds)
    (got,) = get_op("Resize").reference([x, None, scales, sizes], attrs)
    assert got.shape == expected.shape
    # (ONNX's reference computes the cubic coefficients in float32: its cubic_coeff_a is a
    # float32 attribute; ours are float64, hence the cubic tolerance)
    tolerance = 1e-5 if attrs["mode"] == "cubic" else 1e-6
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)
