"""Small multi-node graphs for the fusion tests, built as ONNX and imported + optimized
the way `hidetc compile` does."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


def resnet_block(c: int = 8, hw: int = 5) -> onnx.ModelProto:
    """conv-relu-conv + residual add + relu, then GAP -> flatten -> matmul + bias."""
    nodes = [
        ("Conv", ["x", "w1", "b1"], ["c1"], {"pads": [1, 1, 1, 1]}),
        ("Relu", ["c1"], ["r1"], {}),
        ("Conv", ["r1", "w2", "b2"], ["c2"], {"pads": [1, 1, 1, 1]}),
        ("Add", ["c2", "x"], ["s"], {}),
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
