"""A model whose MatMuls and 3x3 convolution get split K on the cuda target (f16, an
A100's SMs): long-K MatMuls with GELU and a residual Add grafted, a deep convolution with
ReLU. Shared by the split-K test and the concurrency test."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def split_k_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def weight(name, shape, scale):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    make = helper.make_node
    nodes = [
        make("MatMul", ["x", "w1"], ["h"]), make("Add", ["h", "b1"], ["hb"]),
        make("Div", ["hb", "sqrt2"], ["hd"]), make("Erf", ["hd"], ["he"]),
        make("Add", ["he", "one"], ["hp"]), make("Mul", ["hb", "hp"], ["hm"]),
        make("Mul", ["hm", "half"], ["g"]),                           # GELU
        make("MatMul", ["g", "w2"], ["y0"]), make("Add", ["y0", "x"], ["y"]),   # residual
        make("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1]), make("Relu", ["c"], ["z"]),
    ]
    inits = [weight("w1", (384, 96), 0.05), weight("b1", (96,), 0.1),
             weight("w2", (96, 384), 0.1), weight("k", (64, 64, 3, 3), 0.04),
             numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    graph = helper.make_graph(
        nodes, "split_k",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 384]),
         helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 64, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 384]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 64, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
