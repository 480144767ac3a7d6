"""cpu target only: MatMul and Conv on float16/bfloat16 computed in float32.

The CPU MatMul/Conv templates are float32 AVX2 micro-kernels. A MatMul or Conv whose
data is float16 or bfloat16 becomes Cast(to=float32) of each float input (a constant
input is converted once, as a new float32 constant) -> the op in float32 into a fresh
value -> Cast back to the original dtype under the original output name. That is how
numpy (and ONNX Runtime) compute half matmuls: products summed in float32, rounded
once. Everything else is untouched (the same graph object when nothing matches).
"""
from __future__ import annotations

from hidetc.graph.ir import Graph, Node
from hidetc.graph.passes.common import Rewriter, node_base

HALF = ("float16", "bfloat16")
WIDENED_OPS = ("MatMul", "Conv")
F32 = "float32"


def run(graph: Graph) -> Graph:
    if not any(n.op in WIDENED_OPS and _half(graph, n) for n in graph.nodes):
        return graph
    rw = Rewriter(graph)
    widened: dict[str, str] = {}   # half value -> its float32 copy
    for node in graph.nodes:
        if node.op in WIDENED_OPS and _half(graph, node):
            _widen(rw, node, widened)
        else:
            rw.emit(node)
    return rw.finish()


def _half(graph: Graph, node: Node) -> bool:
    return any(v and graph.types[v].dtype in HALF for v in (*node.inputs, *node.outputs))


def _widen(rw: Rewriter, node: Node, widened: dict[str, str]) -> None:
    base = node_base(node)
    inputs = []
    for v in node.inputs:
        if v and rw.types[v].dtype in HALF:
            if v not in widened:
                array = rw.constants.get(v)
                widened[v] = (rw.const(f"{v}_f32", array.astype(F32)) if array is not None
                              else rw.add("Cast", (v,), f"{v}_f32", to=F32))
            v = widened[v]
        inputs.append(v)
    outputs, back = [], []
    for out in node.outputs:
        if out and rw.types[out].dtype in HALF:
            tmp = rw.values.fresh(f"{out}_f32")
            back.append((tmp, out, rw.types[out].dtype))
            out = tmp
        outputs.append(out)
    rw.emit_typed(node.with_(inputs=tuple(inputs), outputs=tuple(outputs)))
    for tmp, out, dtype in back:
        rw.add("Cast", (tmp,), f"{base}_cast", out=out, to=dtype)
