"""hidetc.tools.onnx_backend: the onnx.backend.base.Backend API over compile + run."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hidetc.tools.onnx_backend as backend
from hidetc.backends.runtime.select import gpu_available
from hidetc.errors import HidetcError


def _model(op: str = "Add", opset: int = 17) -> onnx.ModelProto:
    """y = op(x, w) + b with w an initializer; a second output z = x * 2 (Mul)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])
    w = numpy_helper.from_array(np.arange(3, dtype=np.float32), "w")
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    nodes = [helper.make_node(op, ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"]),
             helper.make_node("Mul", ["x", "two"], ["z"])]
    graph = helper.make_graph(nodes, "g", [x, helper.make_tensor_value_info(
        "w", TensorProto.FLOAT, [3]), b], [z, y], initializer=[w, two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


X = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([10, 20, 30], np.float32)


def test_prepare_run_outputs_in_graph_order():
    with backend.prepare(_model(), "CPU") as rep:
        assert rep.input_names == ("x", "b")           # the initializer is not an input
        out = rep.run([X, B])
        assert len(out) == 2
        np.testing.assert_allclose(out[0], X * 2)      # graph order: z, then y
        np.testing.assert_allclose(out[1], X + np.arange(3) + B)
        np.testing.assert_allclose(out["y"], out[1])   # namedtupledict: by name too
        by_name = rep.run({"x": X, "b": B})
        np.testing.assert_allclose(by_name[1], out[1])
        assert rep.workdir.is_dir()
    assert not rep.workdir.exists()                     # the with block cleaned up
    with pytest.raises(backend.BackendError, match="closed"):
        rep.run([X, B])


def test_run_model_and_wrong_input_count():
    out = backend.run_model(_model(), [X, B])
    np.testing.assert_allclose(out[1], X + np.arange(3) + B)
    rep = backend.prepare(_model())
    with pytest.raises(backend.BackendError, match="expected 2 input"):
        rep.run([X])
    with pytest.raises(backend.BackendError, match="dtype"):
        rep.run([X.astype(np.float64), B])
    workdir = rep.workdir
    del rep
    assert not workdir.exists()                         # finalizer on garbage collection


def test_unsupported_model_is_a_clean_error(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with pytest.raises(backend.BackendError, match=r"unsupported ops: NonMaxSuppression") as info:
        backend.prepare(_model("NonMaxSuppression"))
    assert isinstance(info.value, HidetcError) and "\n" not in str(info.value)
    with pytest.raises(backend.BackendError, match="opset 29 is not supported"):
        backend.prepare(_model(opset=29))
    assert list(tmp_path.iterdir()) == []               # nothing left behind


def test_run_node_and_options():
    node = helper.make_node("Relu", ["a"], ["r"])
    a = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    (r,) = backend.run_node(node, [a])
    np.testing.assert_array_equal(r, np.maximum(a, 0))
    (r,) = backend.run_node(node, [a], outputs_info=[(np.float32, (2, 2))], fuse=False,
                            rtol=1e-3, atol=1e-7)       # runner tolerances are ignored
    np.testing.assert_array_equal(r, np.maximum(a, 0))
    with pytest.raises(TypeError, match="unknown option"):
        backend.prepare(_model(), "CPU", fusion=False)


def test_supports_device():
    assert backend.supports_device("CPU")
    assert backend.supports_device("CUDA") == gpu_available()
    assert not backend.supports_device("TPU")
    assert backend.HidetcBackend.supports_device("CPU")
    if not gpu_available():
        with pytest.raises(backend.BackendError, match="not usable here"):
            backend.prepare(_model(), "CUDA")


def _reduce_sum_axes_input() -> onnx.ModelProto:
    """y = ReduceSum(x, axes) + 1 with `axes` a graph input (a compile-time value)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    axes = helper.make_tensor_value_info("axes", TensorProto.INT64, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
             helper.make_node("Add", ["s", "one"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x, axes], [y], initializer=[one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _reshape_shape_input() -> onnx.ModelProto:
    """y = Reshape(x, Concat(shape_head, [-1])) * 2: the shape input reaches the slot
    through a Concat; `x` also has a symbolic batch dim."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])
    head = helper.make_tensor_value_info("head", TensorProto.INT64, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
             numpy_helper.from_array(np.array(2, np.float32), "two")]
    nodes = [helper.make_node("Concat", ["head", "minus_one"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Mul", ["r", "two"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x, head], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


X3 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


def test_reduce_axes_input_specializes_per_value():
    rep = backend.prepare(_reduce_sum_axes_input())
    assert rep.specialized and rep.compile_time_inputs == ("axes",) and rep.compiles == 0
    assert rep.model is None and rep.input_names == ("x", "axes")
    for axis, compiles in [(1, 1), (1, 1), (2, 2), (1, 2), (0, 3)]:
        (y,) = rep.run([X3, np.array([axis], np.int64)])
        np.testing.assert_allclose(y, X3.sum(axis=axis) + 1, rtol=1e-6)
        assert rep.compiles == compiles, axis
    (y,) = rep.run([X3 * 2, np.array([2], np.int64)])        # new data, same axes: reused
    np.testing.assert_allclose(y, (X3 * 2).sum(axis=2) + 1, rtol=1e-6)
    assert rep.compiles == 3
    with pytest.raises(backend.BackendError, match="'axes' has dtype int32"):
        rep.run([X3, np.array([1], np.int32)])
    with pytest.raises(backend.BackendError, match="compile failed: .*out of range"):
        rep.run([X3, np.array([7], np.int64)])
    assert rep.compiles == 3
    rep.close()
    model = _reduce_sum_axes_input()
    model.graph.node.append(helper.make_node("Unique", ["x"], ["e"]))
    with pytest.raises(backend.BackendError, match="unsupported ops: Unique"):
        backend.prepare(model)                             # reported before any run


def test_reshape_shape_input_and_dynamic_batch(monkeypatch):
    monkeypatch.setattr(backend, "MAX_VARIANTS", 2)
    with backend.prepare(_reshape_shape_input()) as rep:
        assert rep.compile_time_inputs == ("head",) and rep.dynamic_inputs == ("x",)
        x = np.arange(12, dtype=np.float32).reshape(2, 6)
        runs = [(x, 3, 1), (x, 3, 1), (x, 4, 2), (np.ones((4, 6), np.float32), 3, 3),
                (x, 3, 4)]                                 # evicted (2 kept): compiled again
        for data, head, compiles in runs:
            (y,) = rep.run({"x": data, "head": np.array([head], np.int64)})
            np.testing.assert_array_equal(y, data.reshape(head, -1) * 2)
            assert rep.compiles == compiles, (data.shape, head)
            assert rep.artifact.is_dir()
        assert len(list(rep.workdir.iterdir())) == 2       # the evicted variants' dirs went
    assert not rep.workdir.exists()


def test_compile_time_inputs_are_traced_through_value_chains():
    assert backend.compile_time_inputs(_model()) == ()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    n = helper.make_tensor_value_info("n", TensorProto.FLOAT, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Shape", ["x"], ["sx"]),                 # type only: x stays
             helper.make_node("Cast", ["n"], ["ni"], to=TensorProto.INT64),
             helper.make_node("Unsqueeze", ["ni", "zero"], ["nv"]),
             helper.make_node("Concat", ["nv", "sx"], ["sh"], axis=0),
             helper.make_node("Slice", ["sh", "zero", "two"], ["s2"]),
             helper.make_node("Reshape", ["x", "s2"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([2], np.int64), "two")]
    graph = helper.make_graph(nodes, "g", [x, n], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert backend.compile_time_inputs(model) == ("n",)
    assert backend.dynamic_inputs(model) == ()


def test_exact_outputs_and_the_runners_exact_rule():
    """`rep.exact_outputs` is the model in float64 rounded to its declared types; the
    conformance runner passes outputs its tolerances refuse only when they are within
    them of that reference and closer to it than the expected values."""
    from hidetc.tools.conformance.cases import Case
    from hidetc.tools.conformance.worker import closer_to_exact
    with backend.prepare(_model("Div"), "CPU") as rep:
        out = list(rep.run([X, B]))
        exact = rep.exact_outputs([X, B])
        assert [e.dtype for e in exact] == [np.float32, np.float32]
        with np.errstate(all="ignore"):          # w[0] = 0: inf and nan, as ONNX says
            np.testing.assert_allclose(exact[1], X / np.arange(3, dtype=np.float64) + B)
        case = Case("t", "Div", ("Div",), 17, ("",), False, 1, 1e-3, 1e-7, ".")
        straying = [np.where(np.isfinite(o), o * np.float32(1.01), o) for o in exact]
        assert closer_to_exact(case, rep, [X, B], straying, out) == [0, 1]
        assert not closer_to_exact(case, rep, [X, B], exact, straying)
        assert not closer_to_exact(case, object(), [X, B], straying, out)
        # only the outputs the runner refuses are judged: output 0 is within the
        # tolerances though farther from the exact values than the expected one
        near = np.where(np.isfinite(exact[0]), exact[0] * np.float32(1 + 1e-5), exact[0])
        assert closer_to_exact(case, rep, [X, B], [exact[0], straying[1]],
                               [near, out[1]]) == [1]
    with pytest.raises(backend.BackendError, match="exact_outputs: this rep was closed"):
        rep.exact_outputs([X, B])
