"""Small ONNX models the reduced-precision end-to-end tests compile (f16 and bf16 on
cuda): `ops_model`, pools, elementwise math, a layout op and a MatMul with awkward
sizes, two float32 outputs; and the checks both precisions make of an artifact
(`check_interface`, `kernel_body`)."""
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


def onnx_dtypes(values) -> list[tuple[str, str]]:
    """(name, numpy dtype name) of ONNX value infos."""
    return [(v.name, str(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)))
            for v in values]


def kernel_body(source: str, name: str) -> str:
    """The text of kernel `name` in a generated CUDA source."""
    start = source.index(f"\n{name}(")
    end = source.find('extern "C"', start)
    return source[start:end if end >= 0 else len(source)]


def check_interface(proto: onnx.ModelProto, manifest: dict, precision: str) -> None:
    """The artifact records `precision` and keeps the model's own interface types (a
    float32 model's inputs and outputs stay float32)."""
    assert manifest["precision"] == precision and manifest["config"]["precision"] == precision
    assert [(s["name"], s["dtype"]) for s in manifest["inputs"]] == onnx_dtypes(
        [i for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}])
    assert [(s["name"], s["dtype"]) for s in manifest["outputs"]] == onnx_dtypes(
        proto.graph.output)
