"""Small ONNX models the reduced-precision end-to-end tests compile (f16 and bf16 on
cuda): `ops_model`, pools, elementwise math, a layout op and a MatMul with awkward
sizes, two float32 outputs."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def ops_model() -> onnx.ModelProto:
    """Pools, elementwise math, a layout op and a MatMul with awkward sizes."""
    rng = np.random.default_rng(0)
    make = helper.make_node
    nodes = [
        make("MaxPool", ["x"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        make("AveragePool", ["mp"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        make("AveragePool", ["mp"], ["ap2"], kernel_shape=[2, 2], count_include_pad=1,
             pads=[0, 0, 1, 1]),
        make("Sigmoid", ["ap"], ["sg"]), make("Mul", ["sg", "ap2"], ["m"]),
        make("HardSigmoid", ["m"], ["hs"]), make("Sub", ["hs", "m"], ["d"]),
        make("Transpose", ["d"], ["t"], perm=[0, 1, 3, 2]),
        make("Reshape", ["t", "shape"], ["r"]), make("MatMul", ["r", "w"], ["mm"]),
        make("Tanh", ["mm"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([3, 25], np.int64), "shape"),
             numpy_helper.from_array((rng.standard_normal((25, 7)) * 0.5).astype(np.float32),
                                     "w")]
    graph = helper.make_graph(
        nodes, "f16_ops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7]),
         helper.make_tensor_value_info("ap", TensorProto.FLOAT, [1, 3, 5, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model
