"""Helpers to build one-node ONNX models for end-to-end op tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NP_TO_ONNX = {np.dtype(k): v for k, v in {
    "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "int64": TensorProto.INT64,
    "int32": TensorProto.INT32, "bool": TensorProto.BOOL, "float16": TensorProto.FLOAT16,
    "uint8": TensorProto.UINT8, "int8": TensorProto.INT8, "uint16": TensorProto.UINT16,
    "int16": TensorProto.INT16, "uint32": TensorProto.UINT32, "uint64": TensorProto.UINT64}.items()}


def one_node_model(op: str, inputs: dict, outputs: list[str], attrs: dict | None = None,
                   constants: dict | None = None, opset: int = 18) -> onnx.ModelProto:
    """inputs: name -> array (graph inputs); constants: name -> array (initializers).
    The node reads inputs then constants in the order given by `order` if present."""
    constants = constants or {}
    order = list(inputs) + list(constants)
    node = helper.make_node(op, order, outputs, name=f"/{op}", **(attrs or {}))
    graph = helper.make_graph(
        [node], f"{op.lower()}_test",
        [helper.make_tensor_value_info(k, NP_TO_ONNX[v.dtype], v.shape) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def bitcast_model(x: np.ndarray, dst: str, src: str | None = None) -> onnx.ModelProto:
    """A one-node BitCast-26 model of input "x" (shape and dtype of `x`, or `src`: a
    dtype numpy cannot name in NP_TO_ONNX, e.g. bfloat16 or float8) to `dst`."""
    feed = np.zeros(x.shape, np.float32) if src else x
    model = one_node_model("BitCast", {"x": feed}, ["out0"],
                           {"to": helper.np_dtype_to_tensor_dtype(np.dtype(dst))}, opset=26)
    if src:
        model.graph.input[0].type.tensor_type.elem_type = \
            helper.np_dtype_to_tensor_dtype(np.dtype(src))
    model.ir_version = 11
    return model


def matmul_relu_model(path, dynamic: bool, seed: int = 0):
    """y = relu(x @ W) on x[b or 4, 8], x back through Identity, and a constant output
    (outputs a kernel writes, an input's copy, a weight's copy); written to `path`."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    c = rng.standard_normal((3,)).astype(np.float32)
    batch = "b" if dynamic else 4
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"]),
         helper.make_node("Identity", ["x"], ["x_out"]),
         helper.make_node("Identity", ["C"], ["c_out"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 16]),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [batch, 8]),
         helper.make_tensor_value_info("c_out", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(c, "C")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path
