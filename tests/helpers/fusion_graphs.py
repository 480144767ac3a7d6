"""Small multi-node graphs for the fusion tests, built as ONNX and imported + optimized
the way `hidetc compile` does."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hidetc.driver.context import CompileContext
from hidetc.frontend.onnx.importer import import_model
from hidetc.graph.ir import Graph
from hidetc.graph.pipeline import optimize

RNG = np.random.default_rng(0)


def const(shape, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def model(nodes, inputs: dict, outputs: list[str], consts: dict) -> onnx.ModelProto:
    """nodes: (op, inputs, outputs, attrs); inputs: name -> shape (float32)."""
    made = [helper.make_node(op, ins, outs, name=f"n{i}_{op}", **attrs)
            for i, (op, ins, outs, attrs) in enumerate(nodes)]
    graph = helper.make_graph(
        made, "fusion_test",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 8
    return onnx.shape_inference.infer_shapes(proto)


def graph_of(proto: onnx.ModelProto) -> Graph:
    return optimize(import_model(proto))


def target_graph(proto: onnx.ModelProto, machine, **options) -> Graph:
    """The graph a compile for `machine` plans (its graph, precision and target passes);
    `options`: CompileConfig fields (precision, layout...)."""
    return CompileContext.for_machine(machine, **options).optimize(import_model(proto))


def resnet_block(c: int = 8, hw: int = 5, residual: str = "x") -> onnx.ModelProto:
    """conv-relu-conv + residual add (of the block input x, or of `residual`: r1, the
    first conv's output) + relu, then GAP -> flatten -> matmul + bias."""
    nodes = [
        ("Conv", ["x", "w1", "b1"], ["c1"], {"pads": [1, 1, 1, 1]}),
        ("Relu", ["c1"], ["r1"], {}),
        ("Conv", ["r1", "w2", "b2"], ["c2"], {"pads": [1, 1, 1, 1]}),
        ("Add", ["c2", residual], ["s"], {}),
        ("Relu", ["s"], ["r2"], {}),
        ("GlobalAveragePool", ["r2"], ["g"], {}),
        ("Flatten", ["g"], ["f"], {}),
        ("MatMul", ["f", "fc"], ["m"], {}),
        ("Add", ["m", "fb"], ["y"], {}),
    ]
    consts = {"w1": const((c, c, 3, 3)), "b1": const((c,)), "w2": const((c, c, 3, 3)),
              "b2": const((c,)), "fc": const((c, 7)), "fb": const((7,))}
    return model(nodes, {"x": [1, c, hw, hw]}, ["y"], consts)


def attention(seq: int = 6, hidden: int = 8, heads: int = 2) -> onnx.ModelProto:
    """BERT-style self-attention: QKV projections with bias, head split (Reshape +
    Transpose), scaled scores + mask, softmax, PV, merge heads, output projection,
    bias + residual, LayerNorm, FFN with GELU (Erf form)."""
    d = hidden // heads
    nodes = []
    consts = {"mask": np.where(np.arange(seq) < seq - 1, 0.0, -1e4).astype(np.float32)
              .reshape(1, 1, 1, seq),
              "scale": np.array(1 / np.sqrt(d), np.float32),
              "split": np.array([1, seq, heads, d], np.int64),
              "merge": np.array([1, seq, hidden], np.int64),
              "half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32),
              "rsqrt2": np.array(1 / np.sqrt(2), np.float32)}
    for name in "qkv":
        consts[f"w{name}"], consts[f"b{name}"] = const((hidden, hidden)), const((hidden,))
        perm = [0, 2, 3, 1] if name == "k" else [0, 2, 1, 3]
        nodes += [("MatMul", ["x", f"w{name}"], [f"{name}0"], {}),
                  ("Add", [f"{name}0", f"b{name}"], [f"{name}1"], {}),
                  ("Reshape", [f"{name}1", "split"], [f"{name}2"], {}),
                  ("Transpose", [f"{name}2"], [f"{name}3"], {"perm": perm})]
    consts.update(wo=const((hidden, hidden)), bo=const((hidden,)), ln_s=const((hidden,)) + 1,
                  ln_b=const((hidden,)), w1=const((hidden, 4 * hidden)),
                  b1=const((4 * hidden,)))
    nodes += [
        ("MatMul", ["q3", "k3"], ["s0"], {}),
        ("Mul", ["s0", "scale"], ["s1"], {}),
        ("Add", ["s1", "mask"], ["s2"], {}),
        ("Softmax", ["s2"], ["p"], {"axis": -1}),
        ("MatMul", ["p", "v3"], ["o0"], {}),
        ("Transpose", ["o0"], ["o1"], {"perm": [0, 2, 1, 3]}),
        ("Reshape", ["o1", "merge"], ["o2"], {}),
        ("MatMul", ["o2", "wo"], ["a0"], {}),
        ("Add", ["a0", "bo"], ["a1"], {}),
        ("Add", ["a1", "x"], ["a2"], {}),
        ("LayerNormalization", ["a2", "ln_s", "ln_b"], ["ln"], {"axis": -1}),
        ("MatMul", ["ln", "w1"], ["f0"], {}),
        ("Add", ["f0", "b1"], ["f1"], {}),
        ("Mul", ["f1", "rsqrt2"], ["g0"], {}),
        ("Erf", ["g0"], ["g1"], {}),
        ("Add", ["g1", "one"], ["g2"], {}),
        ("Mul", ["f1", "g2"], ["g3"], {}),
        ("Mul", ["g3", "half"], ["y"], {}),
    ]
    return model(nodes, {"x": [1, seq, hidden]}, ["y"], consts)


def prologue_patterns() -> onnx.ModelProto:
    """Injective producers read by anchors: a transposed MatMul operand, a Pad before a
    Conv, a scale before a Softmax, an Add + Relu before a ReduceMean, a Slice + Concat
    chain (an injective group)."""
    nodes = [
        ("Transpose", ["x", ], ["xt"], {"perm": [1, 0]}),            # [13, 7] -> [7, 13]
        ("MatMul", ["xt", "w"], ["m"], {}),                           # [7, 13] x [13, 12]
        ("Reshape", ["m", "img"], ["m4"], {}),                        # [1, 3, 7, 4]
        ("Pad", ["m4", "pads"], ["p"], {"mode": "constant"}),         # [1, 3, 9, 6]
        ("Conv", ["p", "cw"], ["c"], {}),                             # [1, 5, 7, 4]
        ("Mul", ["c", "scale"], ["cs"], {}),
        ("Softmax", ["cs"], ["sm"], {"axis": 1}),
        ("Add", ["sm", "c"], ["a"], {}),
        ("Relu", ["a"], ["r"], {}),
        ("ReduceMean", ["r", "axes"], ["rm"], {"keepdims": 0}),      # [1, 5, 4]
        ("Slice", ["rm", "s0", "s1", "s2"], ["sl"], {}),              # [1, 5, 3]
        ("Concat", ["sl", "rm"], ["cat"], {"axis": 2}),               # [1, 5, 7]
        ("Sigmoid", ["cat"], ["y"], {}),
    ]
    consts = {"w": const((13, 12)), "img": np.array([1, 3, 7, 4], np.int64),
              "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
              "cw": const((5, 3, 3, 3)), "scale": np.array(0.7, np.float32),
              "axes": np.array([2], np.int64), "s0": np.array([1], np.int64),
              "s1": np.array([4], np.int64), "s2": np.array([2], np.int64)}
    return model(nodes, {"x": [13, 7]}, ["y"], consts)


def vector_paths(m: int = 13, k: int = 16, n: int = 20) -> onnx.ModelProto:
    """Row lengths that are multiples of 4, so the CUDA SIMT MatMul uses float4 loads of
    A (through an elementwise prologue) and float4 stores (through a bias + residual +
    Tanh epilogue)."""
    nodes = [("Mul", ["x", "s"], ["xs"], {}),
             ("MatMul", ["xs", "w"], ["m"], {}),
             ("Add", ["m", "b"], ["mb"], {}),
             ("Add", ["mb", "r"], ["mr"], {}),
             ("Tanh", ["mr"], ["y"], {})]
    consts = {"s": const((1, k)), "w": const((k, n)), "b": const((n,))}
    return model(nodes, {"x": [m, k], "r": [m, n]}, ["y"], consts)


def illegal_fusions() -> onnx.ModelProto:
    """A value with two consumers that never rejoin, a broadcasting consumer, and a
    reduction between two elementwise ops: all stay apart and stay correct."""
    nodes = [("MatMul", ["x", "w"], ["m"], {}),              # [7, 1]
             ("Add", ["m", "b"], ["mb"], {}),                 # broadcasts m to [7, 6]
             ("Relu", ["mb"], ["r"], {}),
             ("ReduceSum", ["r", "axes"], ["rs"], {"keepdims": 1}),
             ("Exp", ["rs"], ["y1"], {}),
             ("MatMul", ["mb", "w2"], ["y2"], {})]
    consts = {"w": const((5, 1)), "b": const((7, 6)), "axes": np.array([1], np.int64),
              "w2": const((6, 3))}
    return model(nodes, {"x": [7, 5]}, ["y1", "y2"], consts)


def inception_block(n: int = 1, c: int = 8, hw: int = 6) -> onnx.ModelProto:
    """Four branches concatenated on the channels (1x1 conv; 1x1 then 1x3 and 3x1
    convs concatenated inside the branch; avg-pool then 1x1 conv; max-pool), then a
    1x1 conv. 8 channels per branch output (40 in all), so the cuda f16 layout pass
    takes every conv. Every Concat input is a branch output read by nothing else."""
    conv = lambda x, w, out, **a: ("Conv", [x, w], [out], a)  # noqa: E731
    nodes = [
        conv("x", "w0", "c0"), ("Relu", ["c0"], ["b0"], {}),
        conv("x", "w1", "c1"), ("Relu", ["c1"], ["r1"], {}),
        conv("r1", "w1a", "c1a", pads=[0, 1, 0, 1]), ("Relu", ["c1a"], ["b1a"], {}),
        conv("r1", "w1b", "c1b", pads=[1, 0, 1, 0]), ("Relu", ["c1b"], ["b1b"], {}),
        ("Concat", ["b1a", "b1b"], ["b1"], {"axis": 1}),
        ("AveragePool", ["x"], ["p2"], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        conv("p2", "w2", "b2"),
        ("MaxPool", ["x"], ["b3"], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        ("Concat", ["b0", "b1", "b2", "b3"], ["cat"], {"axis": 1}),
        conv("cat", "w4", "c4"), ("Relu", ["c4"], ["y"], {}),
    ]
    consts = {"w0": const((8, c, 1, 1)), "w1": const((8, c, 1, 1)),
              "w1a": const((8, 8, 1, 3)), "w1b": const((8, 8, 3, 1)),
              "w2": const((8, c, 1, 1)), "w4": const((16, 32 + c, 1, 1))}
    return model(nodes, {"x": [n, c, hw, hw]}, ["y"], consts)
