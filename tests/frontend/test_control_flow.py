"""If, Loop and Scan inlined at import (hidetc/frontend/onnx/control_flow.py), run by the
graph's numpy reference and compared with onnx's reference evaluator, or ONNX Runtime for
Scan's axes and directions (exact for these float32 adds/muls: rtol 1e-6)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from hidetc.errors import HidetcError
from hidetc.frontend.onnx.importer import import_model
from hidetc.graph.reference import run_graph

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 8
    return proto


def _check(proto: onnx.ModelProto, feeds: dict, peer: str = "ref") -> None:
    if peer == "ref":
        expected = ReferenceEvaluator(proto).run(None, feeds)
    else:   # onnx's reference reads Scan along axis 0, forward only
        expected = ort.InferenceSession(proto.SerializeToString(),
                                        providers=["CPUExecutionProvider"]).run(None, feeds)
    graph = import_model(proto)
    got = run_graph(graph, feeds)
    for name, want in zip(graph.outputs, expected):
        np.testing.assert_allclose(got[name], want, rtol=1e-6, err_msg=name)


def _branch(name: str, op: str, operand: str) -> onnx.GraphProto:
    """A branch computing op(x, operand) from the outer x (no inputs)."""
    return helper.make_graph([helper.make_node(op, ["x", operand], [f"{name}_out"])], name,
                             [], [helper.make_tensor_value_info(f"{name}_out", F, None)])


def _shape_guarded_if(rank_wanted: int) -> onnx.ModelProto:
    """if rank(x) == rank_wanted: x + 1 else x * 2 -- the condition folds from x's shape."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Size", ["s"], ["rank"]),
             helper.make_node("Equal", ["rank", "want"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=_branch("then", "Add", "one"),
                              else_branch=_branch("else", "Mul", "two"))]
    inits = [numpy_helper.from_array(np.array(rank_wanted, np.int64), "want"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3])],
                  [helper.make_tensor_value_info("y", F, None)], inits)


@pytest.mark.parametrize("rank", [2, 4])
def test_if_with_a_condition_folded_from_shapes(rank):
    proto = _shape_guarded_if(rank)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    _check(proto, {"x": x})
    graph = import_model(proto)
    assert {n.op for n in graph.nodes} >= ({"Add"} if rank == 2 else {"Mul"})


def test_if_with_an_unknown_condition_is_a_one_line_error():
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=_branch("then", "Add", "x"),
                              else_branch=_branch("else", "Mul", "x"))]
    proto = _model(nodes, [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                           helper.make_tensor_value_info("x", F, [2])],
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(HidetcError, match=r"If.*condition 'c' is not known at compile time"):
        import_model(proto)


def _loop_body() -> onnx.GraphProto:
    """carried acc += x * i, scan output acc; continue while i < 2 (3 iterations); a nested
    If reads the outer x and the body's own i."""
    nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=F),
        helper.make_node("Mul", ["x", "fi"], ["xi"]),
        helper.make_node("Add", ["acc_in", "xi"], ["acc_out"]),
        helper.make_node("Less", ["i", "two_i"], ["keep"]),
        helper.make_node("Greater", ["i", "zero_i"], ["positive"]),
        helper.make_node("If", ["positive"], ["scan_out"],
                         then_branch=helper.make_graph(
                             [helper.make_node("Add", ["acc_out", "fi"], ["t"])], "t", [],
                             [helper.make_tensor_value_info("t", F, None)]),
                         else_branch=helper.make_graph(
                             [helper.make_node("Identity", ["acc_out"], ["e"])], "e", [],
                             [helper.make_tensor_value_info("e", F, None)])),
    ]
    inits = [numpy_helper.from_array(np.array(2, np.int64), "two_i"),
             numpy_helper.from_array(np.array(0, np.int64), "zero_i")]
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, [3])],
        [helper.make_tensor_value_info("keep", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [3]),
         helper.make_tensor_value_info("scan_out", F, [3])], inits)


def test_loop_with_trip_count_early_exit_carried_and_scan_outputs():
    nodes = [helper.make_node("Loop", ["m", "c", "acc0"], ["acc", "history"], body=_loop_body())]
    inits = [numpy_helper.from_array(np.array(10, np.int64), "m"),
             numpy_helper.from_array(np.array(True), "c"),
             numpy_helper.from_array(np.zeros(3, np.float32), "acc0")]
    proto = _model(nodes, [helper.make_tensor_value_info("x", F, [3])],
                   [helper.make_tensor_value_info("acc", F, None),
                    helper.make_tensor_value_info("history", F, None)], inits)
    x = np.array([1.0, -2.0, 0.5], np.float32)
    _check(proto, {"x": x})
    got = run_graph(import_model(proto), {"x": x})
    assert got["history"].shape == (3, 3)      # i = 0, 1, 2; stops after i = 2


@pytest.mark.parametrize("in_dir,out_dir,out_axis", [(0, 0, 0), (1, 0, 1), (0, 1, -1)])
def test_scan_directions_and_axes(in_dir, out_dir, out_axis):
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "row"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "row"], ["item"])], "body",
        [helper.make_tensor_value_info("s_in", F, [2]),
         helper.make_tensor_value_info("row", F, [2])],
        [helper.make_tensor_value_info("s_out", F, [2]),
         helper.make_tensor_value_info("item", F, [2])])
    nodes = [helper.make_node("Scan", ["s0", "xs"], ["s", "items"], body=body,
                              num_scan_inputs=1, scan_input_axes=[1],
                              scan_input_directions=[in_dir], scan_output_axes=[out_axis],
                              scan_output_directions=[out_dir])]
    proto = _model(nodes, [helper.make_tensor_value_info("s0", F, [2]),
                           helper.make_tensor_value_info("xs", F, [2, 4])],
                   [helper.make_tensor_value_info("s", F, None),
                    helper.make_tensor_value_info("items", F, None)])
    feeds = {"s0": np.array([0.5, -1.0], np.float32),
             "xs": np.arange(8, dtype=np.float32).reshape(2, 4) - 3}
    _check(proto, feeds, "ort")


def test_loop_without_known_trip_count_is_a_one_line_error():
    nodes = [helper.make_node("Loop", ["m", "", "acc0"], ["acc", "history"], body=_loop_body())]
    proto = _model(nodes, [helper.make_tensor_value_info("m", TensorProto.INT64, []),
                           helper.make_tensor_value_info("x", F, [3])],
                   [helper.make_tensor_value_info("acc", F, None),
                    helper.make_tensor_value_info("history", F, None)],
                   [numpy_helper.from_array(np.zeros(3, np.float32), "acc0")])
    with pytest.raises(HidetcError, match="trip count M 'm' is not known at compile time"):
        import_model(proto)
