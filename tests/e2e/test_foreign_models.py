"""Models nobody here wrote (issue 34): the shapes of graph that other projects' test
suites hold and that used to crash or be refused where ONNX Runtime runs them, each
compiled for the cpu with the defaults and compared with ONNX Runtime.

- MatMul on int32 / int64 / uint32 / uint64, exact with wraparound (operands drawn over
  the whole range, so products and sums overflow), batched and broadcast, 1-D operands;
- an If whose outputs nobody can read (none declared) is dead code; an If without its
  condition input is a one-line error;
- a Loop whose body declares its iteration number [1] (a Squeeze with axes on it);
- LayerNormalization of ONNX Runtime's pre-17 form, Scale and B of another float type
  than X (Y of Scale's type), both ways round;
- the default domain imported at opset 0 by a graph that uses none of its operators;
- input dimensions declared -1: bound with --shape, a one-line error without.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import hidetc
from hidetc.driver.verify import run_onnxruntime
from hidetc.errors import ModelError
from hidetc.tools.cli import main as cli

V = helper.make_tensor_value_info


def _save(path, nodes, inputs, outputs, inits=(), opset=17, ir=8):
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    onnx.save(model, path)
    return path


def _matches_ort(path, out, feeds, ref=None) -> None:
    hidetc.compile_model(path, out, target="cpu")
    got = hidetc.load(out).run(feeds)
    ref = ref or run_onnxruntime(path, feeds)
    for name, value in ref.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        if np.issubdtype(value.dtype, np.floating):
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(got[name], value)


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint32", "uint64"])
@pytest.mark.parametrize("a_shape,b_shape", [((3, 4), (4, 5)), ((2, 3, 7), (7, 2)),
                                             ((2, 1, 3, 4), (5, 4, 6)), ((4,), (4, 3)),
                                             ((2, 5), (5,)), ((1, 0), (0, 3))])
def test_integer_matmul_wraps_as_onnx_runtime(tmp_path, dtype, a_shape, b_shape):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    path = _save(tmp_path / "mm.onnx", [helper.make_node("MatMul", ["a", "b"], ["y"])],
                 [V("a", elem, a_shape), V("b", elem, b_shape)], [V("y", elem, None)])
    rng, info = np.random.default_rng(0), np.iinfo(dtype)
    feeds = {n: rng.integers(info.min, info.max, s, dtype=dtype, endpoint=True)
             for n, s in (("a", a_shape), ("b", b_shape))}
    # ONNX Runtime fails an unsigned MatMul with K = 0 (a type mismatch in its kernel)
    numpy = {"y": np.matmul(feeds["a"], feeds["b"])} if 0 in a_shape else None
    _matches_ort(path, tmp_path / "out", feeds, numpy)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "uint16"])
def test_narrow_integer_matmul_as_numpy(tmp_path, dtype):
    """Not ONNX's types (ONNX Runtime refuses them), but numpy's: no crash, numpy's
    wrapped result (the reference interpreter verifies it)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    path = _save(tmp_path / "mm.onnx", [helper.make_node("MatMul", ["a", "b"], ["y"])],
                 [V("a", elem, [3, 9]), V("b", elem, [9, 4])], [V("y", elem, [3, 4])])
    rng, info = np.random.default_rng(4), np.iinfo(dtype)
    feeds = {n: rng.integers(info.min, info.max, s, dtype=dtype, endpoint=True)
             for n, s in (("a", (3, 9)), ("b", (9, 4)))}
    _matches_ort(path, tmp_path / "out", feeds, {"y": np.matmul(feeds["a"], feeds["b"])})


def test_integer_matmul_with_constant_weights(tmp_path):
    rng = np.random.default_rng(1)
    w = rng.integers(-2**31, 2**31 - 1, (16, 8), dtype=np.int32)
    path = _save(tmp_path / "mm.onnx", [helper.make_node("MatMul", ["a", "w"], ["y"])],
                 [V("a", TensorProto.INT32, [5, 16])], [V("y", TensorProto.INT32, [5, 8])],
                 [numpy_helper.from_array(w, "w")])
    feeds = {"a": rng.integers(-2**31, 2**31 - 1, (5, 16), dtype=np.int32)}
    _matches_ort(path, tmp_path / "out", feeds)


def test_if_without_outputs_is_dead_code(tmp_path):
    empty = helper.make_graph([], "branch", [], [])
    path = _save(tmp_path / "if.onnx",
                 [helper.make_node("If", ["c"], [], then_branch=empty, else_branch=empty),
                  helper.make_node("Relu", ["x"], ["y"])],
                 [V("x", TensorProto.FLOAT, [3]), V("c", TensorProto.BOOL, [])],
                 [V("y", TensorProto.FLOAT, [3])])
    hidetc.compile_model(path, tmp_path / "out", target="cpu")
    x = np.array([-1, 0, 2], np.float32)
    got = hidetc.load(tmp_path / "out").run({"x": x, "c": np.array(True)})
    np.testing.assert_array_equal(got["y"], np.maximum(x, 0))


def test_if_without_condition_is_one_line(tmp_path):
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "b", [],
                               [V("t", TensorProto.FLOAT, [3])])
    node = helper.make_node("If", [], ["y"], then_branch=branch, else_branch=branch)
    path = _save(tmp_path / "if.onnx", [node], [V("x", TensorProto.FLOAT, [3])],
                 [V("y", TensorProto.FLOAT, [3])])
    with pytest.raises(ModelError, match=r"If.*no condition input"):
        hidetc.compile_model(path, tmp_path / "out", target="cpu")


def test_loop_counter_declared_as_one_element(tmp_path):
    axes = helper.make_node("Constant", [], ["axes"],
                            value=numpy_helper.from_array(np.array([0], np.int64)))
    body = helper.make_graph(
        [axes, helper.make_node("Squeeze", ["i", "axes"], ["i0"]),
         helper.make_node("Cast", ["i0"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["acc", "f"], ["acc2"]),
         helper.make_node("Identity", ["cond"], ["cond2"])], "body",
        [V("i", TensorProto.INT64, [1]), V("cond", TensorProto.BOOL, []),
         V("acc", TensorProto.FLOAT, [2])],
        [V("cond2", TensorProto.BOOL, []), V("acc2", TensorProto.FLOAT, [2])])
    path = _save(tmp_path / "loop.onnx", [helper.make_node("Loop", ["M", "", "x"], ["y"],
                                                           body=body)],
                 [V("x", TensorProto.FLOAT, [2])], [V("y", TensorProto.FLOAT, [2])],
                 [numpy_helper.from_array(np.array(4, np.int64), "M")])
    _matches_ort(path, tmp_path / "out", {"x": np.array([1, 2], np.float32)})


@pytest.mark.parametrize("x_type,scale_type", [("float32", "float16"),
                                               ("float16", "float32")])
def test_layer_norm_scale_of_another_type(tmp_path, x_type, scale_type):
    rng = np.random.default_rng(2)
    elem = {t: helper.np_dtype_to_tensor_dtype(np.dtype(t)) for t in (x_type, scale_type)}
    inits = [numpy_helper.from_array(rng.random(16).astype(scale_type), n) for n in "sb"]
    path = _save(tmp_path / "ln.onnx",
                 [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)],
                 [V("x", elem[x_type], [4, 16])], [V("y", elem[scale_type], [4, 16])], inits,
                 opset=13, ir=7)
    _matches_ort(path, tmp_path / "out", {"x": rng.standard_normal((4, 16)).astype(x_type)})


def test_opset_zero_for_a_graph_without_default_ops(tmp_path):
    path = _save(tmp_path / "pass.onnx", [], [V("x", TensorProto.FLOAT, [2, 3])],
                 [V("x", TensorProto.FLOAT, [2, 3])], opset=0)
    _matches_ort(path, tmp_path / "out", {"x": np.ones((2, 3), np.float32)})
    used = _save(tmp_path / "relu.onnx", [helper.make_node("Relu", ["x"], ["y"])],
                 [V("x", TensorProto.FLOAT, [2])], [V("y", TensorProto.FLOAT, [2])], opset=0)
    with pytest.raises(ModelError, match="opset 0 is not supported"):
        hidetc.compile_model(used, tmp_path / "out2", target="cpu")


def test_dims_declared_minus_one_are_free(tmp_path):
    path = _save(tmp_path / "neg.onnx", [helper.make_node("Relu", ["x"], ["y"])],
                 [V("x", TensorProto.FLOAT, [-1, 4])], [V("y", TensorProto.FLOAT, [-1, 4])])
    unbound = CliRunner().invoke(cli, ["compile", str(path), "-o", str(tmp_path / "a"),
                                       "--target", "cpu"])
    assert unbound.exit_code == 2 and unbound.output.count("\n") == 1
    assert "dim 0 is unknown" in unbound.output and "--shape" in unbound.output
    bound = CliRunner().invoke(cli, ["compile", str(path), "-o", str(tmp_path / "b"),
                                     "--target", "cpu", "--shape", "x=3x4"])
    assert bound.exit_code == 0, bound.output
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(hidetc.load(tmp_path / "b").run({"x": x})["y"],
                                  np.maximum(x, 0))


def test_weights_made_by_constant_of_shape(tmp_path):
    """onnx's "light" model-zoo models generate their weights with ConstantOfShape, too
    big to fold into the artifact: the fill runs as an Expand kernel."""
    shape = numpy_helper.from_array(np.array([64, 16, 5, 5], np.int64), "wshape")
    fill = helper.make_node("ConstantOfShape", ["wshape"], ["w"],
                            value=numpy_helper.from_array(np.array([0.01], np.float32)))
    small = helper.make_node("ConstantOfShape", ["bshape"], ["b"],
                             value=numpy_helper.from_array(np.array([0.5], np.float32)))
    path = _save(tmp_path / "light.onnx",
                 [fill, small, helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[2] * 4)],
                 [V("x", TensorProto.FLOAT, [1, 16, 9, 9])], [V("y", TensorProto.FLOAT, None)],
                 [shape, numpy_helper.from_array(np.array([64], np.int64), "bshape")])
    x = np.random.default_rng(5).standard_normal((1, 16, 9, 9)).astype(np.float32)
    _matches_ort(path, tmp_path / "out", {"x": x})


@pytest.mark.parametrize("attrs", [{"output_shape": [10, 10]}, {"auto_pad": "SAME_UPPER"},
                                   {"auto_pad": "SAME_LOWER"}, {"pads": [1, 0, 1, 0]}])
def test_conv_transpose_before_opset_11(tmp_path, attrs):
    """ConvTranspose-1 (opsets 1-10) as ONNX Runtime runs it: version 11's padding split."""
    rng = np.random.default_rng(6)
    w = numpy_helper.from_array(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "w")
    path = _save(tmp_path / "ct.onnx", [helper.make_node("ConvTranspose", ["x", "w"], ["y"],
                                                         strides=[2, 2], **attrs)],
                 [V("x", TensorProto.FLOAT, [1, 3, 5, 5])], [V("y", TensorProto.FLOAT, None)],
                 [w], opset=9, ir=7)
    _matches_ort(path, tmp_path / "out", {"x": rng.standard_normal((1, 3, 5, 5))
                                          .astype(np.float32)})


LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(LIGHT.glob("*.onnx")), ids=lambda p: p.stem)
def test_light_model_zoo(tmp_path, path):
    """onnx's "light" model-zoo CNNs (weights generated by ConstantOfShape) compile with
    the defaults and verify against ONNX Runtime."""
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "passed"
