"""Fold inference BatchNormalization into the preceding Conv, or lower it to Mul + Add.

BatchNormalization (inference: training_mode false, only the Y output used) is the
per-channel affine map `y = x * s + t` with `s = scale / sqrt(var + epsilon)` and
`t = bias - mean * s` (computed in float64, stored in the data dtype).
  - Conv -> BN, where the Conv output feeds only that BN (and is not a graph output),
    and the Conv weight, the Conv bias (if any) and the BN parameters are constants:
    one Conv with weight `W * s[:, None, ...]` and bias `b * s + t`, defining the
    BN's output name.
  - Any other BN with constant parameters: `Mul(x, s)` then `Add(., t)` with
    constants of shape [C, 1, ..., 1] (one 1 per spatial axis: [C, 1, 1] for NCHW).
A BN with non-constant parameters, training_mode set, or a used mean/var output is
left as it is.

Guarantees: the BN's output name and type are kept; new constants get fresh names;
replaced constants may become unused (eliminate_dead_code drops them). Returns the
same graph object when nothing was rewritten.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from hidetc.graph.ir import Graph, Node
from hidetc.graph.passes.common import Rewriter, node_base


def run(graph: Graph) -> Graph:
    affine = {node.outputs[0]: st for node in graph.nodes
              if node.op == "BatchNormalization" and (st := bn_affine(graph, node)) is not None}
    if not affine:
        return graph
    fused = fusable_convs(graph, affine)
    rw = Rewriter(graph)
    for node in graph.nodes:
        if node.op == "Conv" and node.outputs[0] in fused:
            bn = fused[node.outputs[0]]
            fuse_conv(rw, node, bn.outputs[0], affine[bn.outputs[0]])
        elif node.op == "BatchNormalization" and node.inputs[0] in fused:
            continue
        elif node.op == "BatchNormalization" and node.outputs[0] in affine:
            lower_bn(rw, node, affine[node.outputs[0]])
        else:
            rw.emit(node)
    return rw.finish()


def bn_affine(graph: Graph, node: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(s, t) in float64 when the BN is an inference-time affine map of constants."""
    params = node.inputs[1:5]
    if len(params) < 4 or not all(p in graph.constants for p in params):
        return None
    if node.attr("training_mode", 0) or extra_outputs_used(graph, node):
        return None
    scale, bias, mean, var = (graph.constants[p].astype(np.float64) for p in params)
    s = scale / np.sqrt(var + float(node.attr("epsilon", 1e-5)))
    return s, bias - mean * s


def extra_outputs_used(graph: Graph, node: Node) -> bool:
    extra = {out for out in node.outputs[1:] if out}
    return bool(extra) and (bool(extra & set(graph.outputs))
                            or any(extra.intersection(n.inputs) for n in graph.nodes))


def fusable_convs(graph: Graph, affine: Mapping[str, tuple]) -> dict[str, Node]:
    """Conv output name -> the BN node it folds into."""
    producers, consumers = graph.producers(), graph.consumers()
    fused: dict[str, Node] = {}
    for node in graph.nodes:
        if node.op != "BatchNormalization" or node.outputs[0] not in affine:
            continue
        x = node.inputs[0]
        conv = producers.get(x)
        if conv is None or conv.op != "Conv" or x in graph.outputs:
            continue
        weights = [v for v in conv.inputs[1:] if v]
        if len(consumers.get(x, ())) == 1 and all(w in graph.constants for w in weights):
            fused[x] = node
    return fused


def fuse_conv(rw: Rewriter, conv: Node, y: str, st: tuple[np.ndarray, np.ndarray]) -> None:
    s, t = st
    base = node_base(conv)
    weight = rw.constants[conv.inputs[1]]
    bias_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
    bias = rw.constants[bias_name] if bias_name else np.zeros(weight.shape[0], weight.dtype)
    s_w = s.reshape((-1,) + (1,) * (weight.ndim - 1))
    new_weight = rw.const(f"{base}_w_bn", (weight * s_w).astype(weight.dtype))
    new_bias = rw.const(f"{base}_b_bn", (bias * s + t).astype(weight.dtype))
    rw.emit_typed(conv.with_(inputs=(conv.inputs[0], new_weight, new_bias), outputs=(y,)))


def lower_bn(rw: Rewriter, node: Node, st: tuple[np.ndarray, np.ndarray]) -> None:
    s, t = st
    base = node_base(node)
    xtype = rw.types[node.inputs[0]]
    shape = (-1,) + (1,) * (xtype.rank - 2)
    scale = rw.const(f"{base}_scale", s.reshape(shape).astype(xtype.dtype))
    shift = rw.const(f"{base}_shift", t.reshape(shape).astype(xtype.dtype))
    scaled = rw.add("Mul", (node.inputs[0], scale), f"{base}_mul")
    rw.add("Add", (scaled, shift), f"{base}_add", out=node.outputs[0])
