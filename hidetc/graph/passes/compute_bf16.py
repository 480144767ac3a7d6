"""`--precision bf16` on the cpu: the GEMM anchors compute their products in bf16.

Every MatMul, and every Conv / ConvNHWC of one group and at least MIN_CHANNELS input
channels (`BF16_OPS`), whose inputs and output are float32 gets the attribute
`compute="bfloat16"`: its products' operands are rounded to bf16 (nearest even) and
summed in f32. The op's reference does exactly that (`hidetc.graph.ops.nn`,
`hidetc.graph.ops.conv`), and the cpu selection builds it with the bf16 templates
(`hidetc.schedules.cpu.BF16_TEMPLATES`). Tensors stay float32 between kernels (the
decision and its measurement: README's Precision section), so softmax, normalizations,
residual sums and every epilogue compute in f32, as PyTorch's bf16 matmul mode does.
`keep_f32` names nodes left in f32 (the verification's per-kernel fallback,
`hidetc.driver.recover`). Nothing else changes.
"""
from __future__ import annotations

from typing import Collection

from hidetc.graph.ir import Graph, Node

COMPUTE = "compute"
BF16 = "bfloat16"
BF16_OPS = ("MatMul", "Conv", "ConvNHWC")
# convolutions with fewer input channels stay f32: their im2col gather moves runs of
# fewer than this many floats, slower than the f32 direct convolution computes them
# (ResNet-50's 7x7 stem, C = 3, measured 3x slower in bf16: bench/results/2026-12-07-bf16.md)
MIN_CHANNELS = 16


def run(graph: Graph, keep_f32: Collection[str] = ()) -> Graph:
    nodes = tuple(_marked(graph, n) if n.name not in keep_f32 else n for n in graph.nodes)
    if nodes == graph.nodes:
        return graph
    return graph.replace(nodes=nodes)


def computes_bf16(node: Node) -> bool:
    return node.attr(COMPUTE) == BF16


def _marked(graph: Graph, node: Node) -> Node:
    if node.op not in BF16_OPS or node.attr("group", 1) != 1:
        return node
    if node.op != "MatMul" and _channels(graph, node) < MIN_CHANNELS:
        return node
    values = [v for v in (*node.inputs, *node.outputs) if v]
    if any(graph.types[v].dtype != "float32" for v in values):
        return node
    return node.with_(attrs={**node.attr_dict, COMPUTE: BF16})


def _channels(graph: Graph, node: Node) -> int:
    """Input channels of a Conv (OIHW weights) or ConvNHWC (OHWI weights)."""
    w = graph.types[node.inputs[1]].shape
    return w[1] if node.op == "Conv" else w[-1]
