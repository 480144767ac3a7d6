"""The float16 lowering (`--precision f16`): float32 tensors become float16 inside the
graph, the interface stays float32, parameter inputs keep their dtype, and the numpy
reference of the lowered graph stays within the f16 tolerance of the original. The same
pass with bfloat16 (`--precision bf16` on cuda) at the bf16 tolerance, its constants
saturated too (float32's largest rounds to bfloat16's infinity)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hidetc.driver.backend import BACKENDS
from hidetc.driver.verify import compare
from hidetc.frontend.onnx.importer import import_model
from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.graph.passes import to_float16
from hidetc.graph.pipeline import PASSES, lower_precision, optimize
from hidetc.graph.reference import run_graph
from hidetc.graph.verify import verify_graph

RNG = np.random.default_rng(0)
F32, F16, BF16 = "float32", "float16", "bfloat16"


def build(inputs: dict[str, TensorType], constants: dict[str, np.ndarray],
          nodes: list[Node], outputs: list[str]) -> Graph:
    types = dict(inputs)
    types.update({k: TensorType.of(v) for k, v in constants.items()})
    for node in nodes:
        ins = [types[v] if v else None for v in node.inputs]
        vals = [constants.get(v) if v else None for v in node.inputs]
        types.update(zip(node.outputs, infer_node(node, ins, vals)))
    graph = Graph(tuple(inputs), tuple(outputs), tuple(nodes), types, constants)
    verify_graph(graph)
    return graph


def onnx_graph(nodes, inputs, outputs, initializers) -> Graph:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, s)
                     for k, s in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return optimize(import_model(onnx.shape_inference.infer_shapes(model)))


def mlp() -> Graph:
    make = helper.make_node
    nodes = [make("Gemm", ["x", "w1", "b1"], ["h"]), make("Relu", ["h"], ["r"]),
             make("Gemm", ["r", "w2", "b2"], ["z"]), make("Softmax", ["z"], ["y"], axis=-1)]
    weights = {"w1": RNG.standard_normal((16, 32)) * 0.3, "b1": RNG.standard_normal(32),
               "w2": RNG.standard_normal((32, 10)) * 0.3, "b2": RNG.standard_normal(10)}
    return onnx_graph(nodes, {"x": [4, 16]}, ["y", "z"], weights)


def convnet() -> Graph:
    make = helper.make_node
    nodes = [make("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             make("Clip", ["c", "lo", "hi"], ["r"]),
             make("AveragePool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             make("GlobalAveragePool", ["p"], ["g"]), make("Flatten", ["g"], ["f"]),
             make("MatMul", ["f", "fc"], ["y"])]
    weights = {"w": RNG.standard_normal((8, 3, 3, 3)) * 0.3, "b": RNG.standard_normal(8),
               "lo": np.array(0.0), "hi": np.array(6.0), "fc": RNG.standard_normal((8, 5))}
    return onnx_graph(nodes, {"x": [1, 3, 8, 8]}, ["y"], weights)


def float_values(graph: Graph) -> dict[str, str]:
    return {v: t.dtype for v, t in graph.types.items() if t.dtype in (F32, F16, BF16)}


def assert_lowered(before: Graph, after: Graph) -> None:
    verify_graph(after)
    assert after.inputs == before.inputs and after.outputs == before.outputs
    for v in (*before.inputs, *before.outputs):
        assert after.types[v] == before.types[v], v
    interface = set(after.inputs) | set(after.outputs)
    inner_f32 = [v for v, dt in float_values(after).items() if dt == F32 and v not in interface]
    assert inner_f32 == [], inner_f32
    for name, array in after.constants.items():
        assert array.dtype != np.float32, name


def assert_close(before: Graph, after: Graph, inputs: dict, rtol: float = 1e-2) -> dict:
    report = compare(run_graph(after, inputs), run_graph(before, inputs), rtol=rtol)
    assert report["status"] == "passed", report
    return report


def test_mlp_types_interface_and_accuracy():
    graph = mlp()
    lowered = to_float16.run(graph)
    assert_lowered(graph, lowered)
    producers = lowered.producers()
    for out in lowered.outputs:       # each output: a Cast back to float32 of an f16 value
        cast = producers[out]
        assert cast.op == "Cast" and cast.attr("to") == F32
        assert lowered.types[cast.inputs[0]].dtype == F16
    first = lowered.nodes[0]
    assert (first.op, first.inputs, first.attr("to")) == ("Cast", ("x",), F16)
    assert all(n.inputs[0] != "x" for n in lowered.nodes[1:])
    matmuls = [n for n in lowered.nodes if n.op == "MatMul"]
    assert matmuls and all(lowered.types[v].dtype == F16 for n in matmuls for v in n.inputs)
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    assert_close(graph, lowered, {"x": x})


def test_convnet_accuracy_and_clip_bounds():
    graph = convnet()
    lowered = to_float16.run(graph)
    assert_lowered(graph, lowered)
    clip = next(n for n in lowered.nodes if n.op == "Clip")
    assert [lowered.types[v].dtype for v in clip.inputs] == [F16] * 3
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert_close(graph, lowered, {"x": x})


def test_value_inputs_keep_their_dtype():
    # Range's inputs are parameters (value_inputs): they stay float32; the constant
    # `s` is also read as data by the Add and gets a float16 copy for that use; Range
    # insists on producing float32 from float32 parameters, so its output is cast.
    consts = {"s": np.array(1.0, np.float32), "l": np.array(5.0, np.float32),
              "d": np.array(1.0, np.float32)}
    nodes = [Node.make("Range", ["s", "l", "d"], ["r"], name="range"),
             Node.make("Add", ["x", "r"], ["a"], name="add"),
             Node.make("Mul", ["a", "s"], ["y"], name="mul")]
    graph = build({"x": TensorType(F32, (4,))}, consts, nodes, ["y"])
    lowered = to_float16.run(graph)
    verify_graph(lowered)
    rng = next(n for n in lowered.nodes if n.op == "Range")
    assert rng.inputs == ("s", "l", "d")
    assert all(lowered.constants[v].dtype == np.float32 for v in rng.inputs)
    mul = next(n for n in lowered.nodes if n.op == "Mul")
    assert mul.inputs[1] != "s" and lowered.constants[mul.inputs[1]].dtype == np.float16
    add = next(n for n in lowered.nodes if n.op == "Add")
    assert [lowered.types[v].dtype for v in add.inputs] == [F16, F16]
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(run_graph(lowered, {"x": x})["y"], x + np.arange(1, 5))


def test_casts_ints_and_passthrough():
    nodes = [Node.make("Cast", ["i"], ["f"], name="c1", to=F32),     # int -> f16 now
             Node.make("Cast", ["x"], ["x2"], name="c2", to=F32),    # a no-op: dropped
             Node.make("Mul", ["f", "x2"], ["m"], name="mul"),
             Node.make("Cast", ["m"], ["y"], name="c3", to=F32),     # output: cast back
             Node.make("Cast", ["m"], ["n"], name="c4", to="int64"),
             Node.make("Add", ["y", "x"], ["w"], name="add")]    # reads an output
    graph = build({"x": TensorType(F32, (3,)), "i": TensorType("int64", (3,))},
                  {"k": np.array([1.0, 2.0], np.float32)}, nodes, ["y", "n", "x", "k", "w"])
    lowered = to_float16.run(graph)
    verify_graph(lowered)
    assert lowered.outputs == graph.outputs
    assert [lowered.types[v] for v in lowered.outputs] == [graph.types[v] for v in graph.outputs]
    assert lowered.constants["k"].dtype == np.float32     # a constant output, not data
    ops = [(n.op, n.attr("to")) for n in lowered.nodes]
    assert ops.count(("Cast", F32)) == 2                   # only the outputs'
    assert lowered.producers()["w"].op == "Cast"
    assert [lowered.types[v].dtype for v in lowered.producers()["w_f16"].inputs] == [F16, F16]
    assert lowered.types[lowered.producers()["n"].inputs[0]].dtype == F16
    assert lowered.types["n"].dtype == "int64"
    x, i = np.array([0.5, -2.0, 3.0], np.float32), np.array([1, 2, 3])
    out = run_graph(lowered, {"x": x, "i": i})
    np.testing.assert_array_equal(out["y"], x * i)
    np.testing.assert_array_equal(out["n"], (x * i).astype(np.int64))
    np.testing.assert_array_equal(out["x"], x)
    np.testing.assert_array_equal(out["w"], x * i + x)


def test_constants_saturate_to_float16_range():
    big = np.array([-3.4028235e38, 1e6, -np.inf, 0.5, np.nan], np.float32)
    converted = to_float16.to_float16(big)
    assert converted.dtype == np.float16
    np.testing.assert_array_equal(converted[:4], [-65504, 65504, -np.inf, 0.5])
    assert np.isnan(converted[4])


def test_bfloat16_lowering_mlp_and_convnet():
    """dtype bfloat16: the same rewrite, bfloat16 inside (weights, the input's Cast, the
    MatMuls), float32 outside, within the bf16 tolerance and really rounded."""
    for graph, x in ((mlp(), RNG.standard_normal((4, 16))),
                     (convnet(), RNG.standard_normal((1, 3, 8, 8)))):
        lowered = to_float16.run(graph, BF16)
        assert_lowered(graph, lowered)
        assert F16 not in float_values(lowered).values()
        first = lowered.nodes[0]
        assert (first.op, first.inputs, first.outputs, first.attr("to")) == \
            ("Cast", ("x",), ("x_bf16",), BF16)
        anchors = [n for n in lowered.nodes if n.op in ("MatMul", "Conv")]
        assert anchors and all(lowered.types[v].dtype == BF16 for n in anchors
                               for v in n.inputs if v)
        for out in lowered.outputs:
            cast = lowered.producers()[out]
            assert cast.op == "Cast" and lowered.types[cast.inputs[0]].dtype == BF16
        report = assert_close(graph, lowered, {"x": x.astype(np.float32)}, rtol=2e-2)
        assert max(o["rel_error"] for o in report["outputs"].values()) > 1e-4


def test_constants_saturate_to_bfloat16_range():
    big = np.array([-3.4028235e38, 3.4e38, -np.inf, 0.5, 1.00390625, np.nan], np.float32)
    converted = to_float16.to_half(big, BF16)
    assert converted.dtype == np.dtype(BF16)
    top = float(np.array(3.3895313892515355e38, np.float32))
    np.testing.assert_array_equal(converted[:5].astype(np.float64),
                                  [-top, top, -np.inf, 0.5, 1.0])   # a tie: to even
    assert np.isnan(converted[5].astype(np.float32))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        to_float16.run(mlp(), "float64")


def test_cuda_bf16_passes_lower_then_layout_then_attention(tmp_path):
    graph = mlp()
    lowered = lower_precision(graph, "bf16", dump_dir=str(tmp_path),
                              passes=BACKENDS["cuda"].graph_passes("bf16"))
    assert_lowered(graph, lowered)
    dumped = sorted(p.name for p in tmp_path.iterdir())
    assert [name[3:] for name in dumped] == [
        "to_bfloat16.txt", "choose_layout.txt", "hoist_transposes.txt",
        "fold_movement_chains.txt", "fuse_attention.txt"]
    assert "bfloat16" in (tmp_path / dumped[0]).read_text()
    cpu = lower_precision(graph, "bf16", passes=BACKENDS["cpu"].graph_passes("bf16"))
    assert BF16 not in float_values(cpu).values()       # the cpu keeps f32 tensors


def test_nothing_to_lower_returns_same_graph():
    nodes = [Node.make("Add", ["i", "i"], ["y"], name="add")]
    graph = build({"i": TensorType("int64", (3,))}, {}, nodes, ["y"])
    assert to_float16.run(graph) is graph
    assert lower_precision(mlp(), "f32").nodes == mlp().nodes


def test_lower_precision_dumps_after_optimize(tmp_path):
    graph = mlp()
    lowered = lower_precision(graph, "f16", dump_dir=str(tmp_path),
                              passes=BACKENDS["cuda"].graph_passes("f16"))
    assert_lowered(graph, lowered)
    dumped = sorted(p.name for p in tmp_path.iterdir())
    assert dumped == [f"{len(PASSES) + 1:02d}_to_float16.txt",
                      f"{len(PASSES) + 2:02d}_choose_layout.txt",
                      f"{len(PASSES) + 3:02d}_hoist_transposes.txt",
                      f"{len(PASSES) + 4:02d}_fold_movement_chains.txt",
                      f"{len(PASSES) + 5:02d}_fuse_attention.txt"]
    assert "float16" in (tmp_path / dumped[0]).read_text()
