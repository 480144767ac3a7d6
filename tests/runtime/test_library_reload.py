"""An artifact recompiled into the same directory and loaded again in the same process
runs the new kernels. (The dynamic loader returns the library it already mapped for a
file name even after the file was replaced, so a second `hidetc.load(out)` used to run
the first compile's code on the second compile's shapes: wrong numbers or a crash.)"""
from __future__ import annotations

import shutil

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import hidetc


def _model(op: str, n: int, value: float) -> onnx.ModelProto:
    """y = x <op> c, x and c of shape [n]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    c = numpy_helper.from_array(np.full(n, value, np.float32), "c")
    graph = helper.make_graph([helper.make_node(op, ["x", "c"], ["y"])], "g", [x], [y], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_recompiling_into_the_same_directory_loads_the_new_library(tmp_path):
    out = tmp_path / "out"
    cases = [("Add", 3, 1.0, np.add), ("Mul", 7, 2.0, np.multiply), ("Sub", 5, 0.5, np.subtract)]
    kept = []          # earlier models stay alive, as in a notebook
    for op, n, value, fn in cases:
        path = tmp_path / f"{op}.onnx"
        onnx.save(_model(op, n, value), path)
        shutil.rmtree(out, ignore_errors=True)
        hidetc.compile_model(path, out, target="cpu")
        model = hidetc.load(out)
        kept.append(model)
        x = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(model.run({"x": x})["y"], fn(x, np.float32(value)))
    for (op, n, value, fn), model in zip(cases, kept):
        x = np.arange(n, dtype=np.float32) - 1
        np.testing.assert_array_equal(model.run({"x": x})["y"], fn(x, np.float32(value)))
