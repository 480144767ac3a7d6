"""The graph pass pipeline on an exporter-style ONNX model, checked against ONNX Runtime."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from hidetc.frontend.onnx.importer import import_model
from hidetc.graph.pipeline import PASSES, optimize
from hidetc.graph.reference import run_graph

GONE = {"Shape", "Gather", "Concat", "Unsqueeze", "Identity", "Dropout", "Gemm",
        "BatchNormalization", "Flatten", "Split", "Squeeze"}


def initializers() -> list[onnx.TensorProto]:
    rng = np.random.default_rng(0)
    arrays = {
        "W": rng.standard_normal((4, 3, 3, 3)), "B": rng.standard_normal(4),
        "scale": rng.uniform(0.5, 2, 4), "bias": rng.standard_normal(4),
        "mean": rng.standard_normal(4), "var": rng.uniform(0.5, 2, 4),
        "Wg": rng.standard_normal((10, 256)) * 0.1, "bg": rng.standard_normal(10),
    }
    tensors = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()]
    ints = {"minus1": np.array([-1]), "axes0": np.array([0]),
            "halves": np.array([128, 128])}
    return tensors + [numpy_helper.from_array(v.astype(np.int64), k) for k, v in ints.items()]


def exporter_style_model() -> onnx.ModelProto:
    make = helper.make_node
    nodes = [
        make("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
        make("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
        make("Relu", ["bn"], ["r"]),
        make("Identity", ["r"], ["r2"]),
        make("Dropout", ["r2"], ["d"]),
        make("Shape", ["d"], ["s"]),
        make("Constant", [], ["zero"], value_int=0),
        make("Gather", ["s", "zero"], ["n"], axis=0),
        make("Unsqueeze", ["n", "axes0"], ["nu"]),
        make("Concat", ["nu", "minus1"], ["shp"], axis=0),
        make("Reshape", ["d", "shp"], ["flat"]),
        make("Gemm", ["flat", "Wg", "bg"], ["g"], transB=1),
        make("Relu", ["g"], ["a1"]),
        make("Relu", ["g"], ["a2"]),
        make("Add", ["a1", "a2"], ["out1"]),
        make("Flatten", ["d"], ["f2"], axis=1),
        make("Split", ["f2", "halves"], ["s1", "s2"], axis=1),
        make("Sub", ["s1", "s2"], ["out2"]),
    ]
    graph = helper.make_graph(
        nodes, "exporter_style",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("out1", TensorProto.FLOAT, [2, 10]),
         helper.make_tensor_value_info("out2", TensorProto.FLOAT, [2, 128])],
        initializers())
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_pipeline_is_one_explicit_list():
    names = [name for name, _ in PASSES]
    assert names[0] == "remove_identity" and names[-1] == "eliminate_dead_code"
    assert all(callable(run) for _, run in PASSES)


def test_optimize_exporter_style_model_matches_onnxruntime(tmp_path):
    model = exporter_style_model()
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    expected = dict(zip(["out1", "out2"], session.run(["out1", "out2"], {"x": x})))

    graph = optimize(import_model(model), verify=True, dump_dir=str(tmp_path))

    counts = graph.op_counts()
    assert not GONE & set(counts), counts
    assert counts == {"Conv": 1, "Relu": 2, "Reshape": 1, "MatMul": 1, "Add": 2,
                      "Slice": 2, "Sub": 1}
    assert graph.outputs == ("out1", "out2")
    actual = run_graph(graph, {"x": x})
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=1e-4, atol=1e-4)
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert dumps[0] == "00_input.txt" and len(dumps) == len(PASSES) + 1
    assert dumps[-1] == f"{len(PASSES):02d}_eliminate_dead_code.txt"


def test_optimize_runs_given_passes_only():
    graph = import_model(exporter_style_model())
    assert optimize(graph, passes=()) is graph
