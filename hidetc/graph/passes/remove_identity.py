"""Remove Identity, (inference) Dropout and no-op Cast nodes by renaming the uses of
their output.

A Cast (or CastLike) whose output type is its input's is an identity: exporters write
them for autocast (`x.float()` on a float32 tensor: ModernBERT's and Phi-3's rotary
embeddings have four per layer), each a copy kernel otherwise.

Dropout is taken with inference semantics (training_mode false): its output equals its
data input, and its mask output, when something needs it (a node or a graph output),
becomes a constant all-true bool tensor of the data's shape.

Graph output names stay stable. For a removed node `src -> dst`:
  - `dst` is not a graph output: every use of `dst` reads `src` instead;
  - `dst` is a graph output and `src` is an internal value (a node output or a
    constant, not itself a graph input or output): `src` is renamed to `dst`
    everywhere, its producer included;
  - otherwise (`src` is a graph input, or a graph output too) the node stays as an
    Identity `src -> dst`: the one case where a copy is really needed.
Other passes turn no-op nodes into Identity and call `run` to get the same treatment.

Assumes: nodes in topological order. Guarantees: graph input/output names unchanged;
no Dropout and no same-type Cast remains; an Identity remains only in the last case
above. Returns the same graph object when there is nothing to remove.
"""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import Graph, Node
from hidetc.graph.passes.common import live_types, rename_node, resolve

REMOVABLE_OPS = frozenset({"Identity", "Dropout"})


def _removable(graph: Graph, node: Node) -> bool:
    if node.op in REMOVABLE_OPS:
        return True
    return (node.op in ("Cast", "CastLike") and bool(node.inputs) and bool(node.inputs[0])
            and graph.types[node.inputs[0]] == graph.types[node.outputs[0]])


def run(graph: Graph) -> Graph:
    if not any(_removable(graph, node) for node in graph.nodes):
        return graph
    interface = set(graph.inputs) | set(graph.outputs)
    subst: dict[str, str] = {}
    constants = dict(graph.constants)
    kept: list[Node] = []
    for node in graph.nodes:
        if not _removable(graph, node):
            kept.append(node)
            continue
        constants.update(mask_constants(graph, node))
        src, dst = resolve(subst, node.inputs[0]), node.outputs[0]
        if dst not in graph.outputs:
            subst[dst] = src
        elif src not in interface:
            subst[src] = dst
        else:
            kept.append(Node("Identity", (src,), (dst,), name=node.name))
    return rebuild(graph, kept, constants, subst)


def rebuild(graph: Graph, kept: list[Node], constants: dict[str, np.ndarray],
            subst: dict[str, str]) -> Graph:
    nodes = tuple(rename_node(node, subst, outputs=True) for node in kept)
    constants = {resolve(subst, name): array for name, array in constants.items()}
    types = live_types(graph.types, graph.inputs, constants, nodes)
    if graph.nodes == nodes and graph.constants.keys() == constants.keys():
        return graph
    return graph.replace(nodes=nodes, constants=constants, types=types)


def mask_constants(graph: Graph, node: Node) -> dict[str, np.ndarray]:
    """The all-true mask of a Dropout, when its mask output is needed."""
    if node.op != "Dropout" or len(node.outputs) < 2 or not node.outputs[1]:
        return {}
    mask = node.outputs[1]
    needed = mask in graph.outputs or any(mask in n.inputs for n in graph.nodes)
    if not needed:
        return {}
    return {mask: np.ones(graph.types[mask].shape, dtype=bool)}
