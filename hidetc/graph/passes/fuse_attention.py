"""Fold attention into one FusedAttention node (`hidetc.graph.ops.fused_attention`) for
the cuda target's half-precision tensor-core kernel (`hidetc.schedules.cuda.attention`).

Matched, in float16 or bfloat16 (the scores and Q, Kt, V all of that one type):

    S = MatMul(Q, Kt) -> [Div|Mul by a scalar constant, Add(., E), Where(C, ., scalar
    constant)]* -> Softmax(axis = last) -> O = MatMul(P, V)

where every intermediate value has exactly one reader (the next node of the chain) and
is no graph output, the chain's other operands broadcast to the scores' shape, and the
head sizes fit the kernel (D and Dv at most MAX_HEAD). BERT's (Div, Add mask) and
GPT-2's (Div, Where causal) chains match; so do ONNX Runtime-style exports without a
scale. The node replaces the chain at the position of its last MatMul; the other
operands become its inputs E0, E1, ... in order of use.

Decides: nothing else changes (the MatMuls' producers, e.g. the head-splitting
Transposes, stay as they are: the fusion stage grafts them onto the kernel's loads).
Guarantees: the new node's reference equals the chain's (same steps, same roundings).
"""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import Graph, Node
from hidetc.graph.passes.common import Rewriter

HALVES = ("float16", "bfloat16")
MAX_HEAD = 128
SCALAR_STEPS = {"Div": "div", "Mul": "mul"}


def _scalar(graph: Graph, value: str):
    array = graph.constants.get(value)
    if array is None or array.size != 1:
        return None
    return float(np.asarray(array).reshape(()))


def _readers(graph: Graph) -> dict[str, list[Node]]:
    out: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for v in node.inputs:
            if v:
                out.setdefault(v, []).append(node)
    return out


def _match(graph: Graph, softmax: Node, producer: dict[str, Node],
           readers: dict[str, list[Node]]):
    """(first MatMul, chain nodes in order, score steps, extra operands, last MatMul) of
    the attention ending at `softmax`, or None."""
    scores = graph.types[softmax.inputs[0]]
    rank = len(scores.shape)

    def private(value: str) -> bool:
        return (len(readers.get(value, ())) == 1 and value not in graph.outputs
                and graph.types[value].shape == scores.shape)

    def on_chain(value: str) -> bool:
        node = producer.get(value)
        return private(value) and node is not None and \
            node.op in ("MatMul", "Add", "Where", *SCALAR_STEPS)

    if scores.dtype not in HALVES or rank < 2 or softmax.attr("axis", -1) % rank != rank - 1:
        return None
    out = softmax.outputs[0]
    users = readers.get(out, [])
    if (len(users) != 1 or out in graph.outputs or users[0].op != "MatMul"
            or users[0].inputs[0] != out):
        return None
    last = users[0]
    reversed_steps, reversed_chain = [], []
    value = softmax.inputs[0]
    while True:
        if not on_chain(value):
            return None
        node = producer[value]
        if node.op == "MatMul":
            first = node
            break
        a, b = node.inputs[0], node.inputs[1]
        if node.op == "Div":
            step, value = ("div", _scalar(graph, b)), a
        elif node.op == "Mul":
            step, value = (("mul", _scalar(graph, b)), a) if _scalar(graph, b) is not None \
                else (("mul", _scalar(graph, a)), b)
        elif node.op == "Add":
            value, other = (a, b) if on_chain(a) else (b, a)
            step = ("add", other)
        else:                                        # Where(C, s, c)
            if len(node.inputs) != 3:
                return None
            step, value = ("where", a, _scalar(graph, node.inputs[2])), b
        if None in step:
            return None
        reversed_steps.append(step)
        reversed_chain.append(node)
    steps, extras = [], []
    for step in reversed(reversed_steps):            # operands numbered in order of use
        if step[0] in ("add", "where"):
            extras.append(step[1])
            step = (step[0], len(extras) - 1) + step[2:]
        steps.append(step)
    q, kt, v = first.inputs[0], first.inputs[1], last.inputs[1]
    for operand in (q, kt, v):
        t = graph.types[operand]
        if t.dtype != scores.dtype or len(t.shape) < 2:
            return None
    if graph.types[q].shape[-1] > MAX_HEAD or graph.types[v].shape[-1] > MAX_HEAD:
        return None
    return first, list(reversed(reversed_chain)), steps, extras, last


def run(graph: Graph) -> Graph:
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    readers = _readers(graph)
    fused: dict[str, tuple] = {}          # last MatMul's name -> the match
    dropped: set[int] = set()
    for softmax in graph.nodes:
        if softmax.op != "Softmax":
            continue
        match = _match(graph, softmax, producer, readers)
        if match is None:
            continue
        first, chain, _, _, last = match
        fused[id(last)] = match
        dropped.update(id(n) for n in (first, *chain, softmax))
    if not fused:
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if id(node) in dropped:
            rw.changed = True
            continue
        match = fused.get(id(node))
        if match is None:
            rw.emit(node)
            continue
        first, _, steps, extras, last = match
        rw.add("FusedAttention", [first.inputs[0], first.inputs[1], last.inputs[1], *extras],
               last.name or "attention", out=last.outputs[0], score=tuple(steps))
    return rw.finish()
