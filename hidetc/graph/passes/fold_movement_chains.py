"""A chain of Transposes and Reshapes that keeps the elements in memory order is one
Reshape.

The layout pass leaves such chains where a channels-last value meets a model's own
reshuffles: SegFormer's Mix-FFN reads its depthwise conv's output as tokens,
`x.flatten(2).transpose(1, 2)` -- with the conv NHWC that is Transpose(NHWC -> NCHW),
Reshape, Transpose back, which moves no element at all, but fused as an epilogue its
index arithmetic (`% 4096`, `/ 4096`) keeps the store scalar. Replaced by one Reshape
(free: a view), the conv stores contiguous channel vectors.

A chain: Transpose/Reshape nodes, each reading the one before, every value inside read
by the next node only and no graph output. It is folded when the composite maps
element i of the chain's input to element i of its output, for every i: checked by
following an index array through the chain (chains of at most CHECK_LIMIT elements;
longer ones are kept).

Guarantees: output names and types kept; the folded chain's first input is read by a
Reshape to the last output's shape (or the chain becomes Identity when the shapes are
equal, which `remove_identity` removes). Returns the same graph when nothing folds.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from hidetc.graph.ir import Graph, Node
from hidetc.graph.passes import remove_identity
from hidetc.graph.passes.common import Rewriter
from hidetc.graph.symbolic import samples, shape_array

MOVEMENT = ("Transpose", "Reshape")
CHECK_LIMIT = 1 << 24


def _apply(index: np.ndarray, node: Node, graph: Graph, sizes: dict) -> np.ndarray:
    if node.op == "Transpose":
        perm = node.attr("perm")
        return np.transpose(index, tuple(perm) if perm is not None else None)
    return index.reshape(graph.types[node.outputs[0]].at(sizes).shape)


def keeps_order(graph: Graph, chain: list[Node]) -> bool:
    """Whether the chain moves no element (its composite is a reshape); with symbolic
    sizes, whether it moves none at each of `symbolic.samples` of the ranges."""
    return all(_keeps_order_at(graph, chain, sizes) for sizes in
               (samples(graph.symbols) if graph.symbols else [{}]))


def _keeps_order_at(graph: Graph, chain: list[Node], sizes: dict) -> bool:
    source = graph.types[chain[0].inputs[0]].at(sizes)
    if source.size > CHECK_LIMIT:
        return False
    index = np.arange(source.size, dtype=np.int32).reshape(source.shape)
    for node in chain:
        index = _apply(index, node, graph, sizes)
    return bool(np.array_equal(np.ascontiguousarray(index).reshape(-1),
                               np.arange(source.size, dtype=np.int32)))


def _chains(graph: Graph) -> list[list[Node]]:
    """Maximal chains of two or more movement nodes (see the module docstring)."""
    uses = Counter(v for n in graph.nodes for v in n.inputs if v)
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    outputs = set(graph.outputs)

    moved = {n.inputs[0] for n in graph.nodes if n.op in MOVEMENT and n.inputs}

    def inner(value: str) -> bool:           # may disappear inside a chain
        return uses[value] == 1 and value not in outputs

    # a chain ends where its value is not the data input of the next movement node
    ends = [n for n in graph.nodes if n.op in MOVEMENT
            and not (inner(n.outputs[0]) and n.outputs[0] in moved)]
    chains = []
    for end in ends:
        chain = [end]
        while True:
            prev = producer.get(chain[0].inputs[0])
            if prev is None or prev.op not in MOVEMENT or not inner(prev.outputs[0]):
                break
            chain.insert(0, prev)
        if len(chain) >= 2:
            chains.append(chain)
    return chains


def run(graph: Graph) -> Graph:
    chains = [c for c in _chains(graph) if keeps_order(graph, c)]
    if not chains:
        return graph
    folded = {id(n): c for c in chains for n in c}
    ends = {id(c[-1]) for c in chains}
    rw = Rewriter(graph)
    for node in graph.nodes:
        chain = folded.get(id(node))
        if chain is None:
            rw.emit(node)
        elif id(node) in ends:
            source, out = chain[0].inputs[0], node.outputs[0]
            shape = graph.types[out].shape
            if graph.types[source].shape == shape:
                rw.emit(Node("Identity", (source,), (out,), name=node.name), changed=True)
            else:
                const = rw.const(f"{node.name or out}_shape", shape_array(shape))
                attrs = {"allowzero": 1} if 0 in shape else {}
                rw.emit_typed(Node.make("Reshape", (source, const), (out,), name=node.name,
                                        **attrs))
        else:
            rw.changed = True                 # an inner node of a folded chain: dropped
    return remove_identity.run(rw.finish())
