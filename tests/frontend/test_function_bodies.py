"""Ops read through their ONNX schema's function body (hidetc/frontend/onnx/functions.py),
compared with onnx's reference evaluator (float32, rtol 1e-5 / atol 1e-6: a few float
ops per element)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from hidetc.errors import UnsupportedOpError
from hidetc.frontend.onnx.functions import has_function, value_slots
from hidetc.frontend.onnx.importer import import_model
from hidetc.graph.reference import run_graph


def _affine_grid(align: int) -> onnx.ModelProto:
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("theta", TensorProto.FLOAT, [2, 2, 3])],
        [helper.make_tensor_value_info("grid", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([2, 3, 4, 5], np.int64), "size")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    proto.ir_version = 9
    return proto


@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_through_its_function_body(align):
    proto = _affine_grid(align)
    theta = np.random.default_rng(3).standard_normal((2, 2, 3)).astype(np.float32)
    want, = ReferenceEvaluator(proto).run(None, {"theta": theta})
    graph = import_model(proto)
    assert "AffineGrid" not in {n.op for n in graph.nodes}
    got = run_graph(graph, {"theta": theta})["grid"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_function_facts():
    assert has_function("AffineGrid", 20) and not has_function("AffineGrid", 19)
    assert not has_function("Unique", 22)
    assert value_slots("AffineGrid", 20) == (1,)     # size shapes the grid


def test_op_without_a_function_body_stays_unsupported():
    node = helper.make_node("Unique", ["x"], ["y"])
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    with pytest.raises(UnsupportedOpError, match="unsupported ops: Unique"):
        import_model(proto)
