"""Graph outputs that are not simply written by one kernel: an input passed through, a
constant, a value listed twice, a value both returned and consumed, a folded value."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hidetc

ONES = numpy_helper.from_array(np.ones((2, 3), np.float32), "c")


def _model(nodes, outputs, inits=()):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = helper.make_graph(nodes, "g", [x], outs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


relu = helper.make_node("Relu", ["x"], ["y"])
CASES = {
    "identity": (_model([helper.make_node("Identity", ["x"], ["y"])], ["y"]), ["kernel"]),
    "constant": (_model([relu, helper.make_node("Identity", ["c"], ["z"])], ["y", "z"],
                        [ONES]), ["kernel", "constant"]),
    "listed_twice": (_model([relu, helper.make_node("Identity", ["y"], ["z"])], ["y", "z"]),
                     None),
    "also_consumed": (_model([relu, helper.make_node("Exp", ["y"], ["z"])], ["y", "z"]),
                      ["kernel", "kernel"]),
    "input": (_model([relu], ["x", "y"]), ["input", "kernel"]),
    "folded": (_model([helper.make_node("Shape", ["x"], ["s"]),
                       helper.make_node("Cast", ["s"], ["y"], to=1)], ["y"]), ["constant"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_output_sources(case, tmp_path):
    model, kinds = CASES[case]
    onnx.save(model, tmp_path / "m.onnx")
    result = hidetc.compile_model(tmp_path / "m.onnx", tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "passed"
    if kinds is not None:
        assert [s["kind"] for s in result.manifest["output_sources"]] == kinds
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    outputs = hidetc.load(tmp_path / "out").run({"x": x})
    assert list(outputs) == [o.name for o in model.graph.output]
