"""hidetc.onnx_backend: the onnx.backend.base.Backend API over compile + run."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hidetc.onnx_backend as backend
from hidetc.errors import HidetcError
from hidetc.runtime.select import gpu_available


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
    with pytest.raises(backend.BackendError, match=r"unsupported ops: Einsum") as info:
        backend.prepare(_model("Einsum"))
    assert isinstance(info.value, HidetcError) and "\n" not in str(info.value)
    with pytest.raises(backend.BackendError, match="opset 9 is not supported"):
        backend.prepare(_model(opset=9))
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
