"""Helpers shared by the graph passes: fresh names, value renaming, and `Rewriter`.

Assumes: graphs follow `hidetc.graph.ir` (every value typed, static shapes).
Guarantees: `NameGen.fresh` never returns a name already used by the graph (value names
and graph interface names share one namespace; node names have their own), and names
are deterministic (a base plus the first free `_N` suffix). `Rewriter.finish` returns
the input graph object itself when nothing was changed, and otherwise a graph whose
`types` covers exactly the defined values (inputs, constants, node outputs).
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Graph, Node, TensorType

# Ops whose outputs are not a function of their inputs: never folded nor merged.
NONDETERMINISTIC_OPS = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
    "Multinomial", "Bernoulli",
})


class NameGen:
    """Hands out unused names: `base`, else `base_1`, `base_2`, ... (deterministic)."""

    def __init__(self, used: Iterable[str]):
        self.used = set(used)

    @staticmethod
    def for_values(graph: Graph) -> "NameGen":
        used = set(graph.types) | set(graph.inputs) | set(graph.outputs) | set(graph.constants)
        used.update(out for node in graph.nodes for out in node.outputs)
        used.update(value for node in graph.nodes for value in node.inputs)
        return NameGen(used)

    @staticmethod
    def for_nodes(graph: Graph) -> "NameGen":
        return NameGen(node.name for node in graph.nodes if node.name)

    def fresh(self, base: str) -> str:
        name, index = base, 0
        while not name or name in self.used:
            index += 1
            name = f"{base}_{index}"
        self.used.add(name)
        return name


def resolve(subst: Mapping[str, str], value: str) -> str:
    """Follow a renaming chain (`a -> b -> c`) to its end."""
    while value in subst:
        value = subst[value]
    return value


def rename_node(node: Node, subst: Mapping[str, str], *, outputs: bool = False) -> Node:
    """The node with its inputs (and outputs when asked) renamed; the same object if none."""
    if not subst:
        return node
    inputs = tuple(resolve(subst, v) if v else v for v in node.inputs)
    outs = tuple(resolve(subst, v) if v else v for v in node.outputs) if outputs else node.outputs
    if inputs == node.inputs and outs == node.outputs:
        return node
    return node.with_(inputs=inputs, outputs=outs)


def defined_values(inputs: Iterable[str], constants: Iterable[str],
                   nodes: Iterable[Node]) -> set[str]:
    names = set(inputs) | set(constants)
    names.update(out for node in nodes for out in node.outputs if out)
    return names


def live_types(types: Mapping[str, TensorType], inputs: Iterable[str],
               constants: Mapping[str, np.ndarray], nodes: Iterable[Node]) -> dict:
    """`types` restricted to the values that are defined (types of missing names are kept
    out; the verifier reports them)."""
    defined = defined_values(inputs, constants, nodes)
    return {name: t for name, t in types.items() if name in defined}


def contiguous(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array (0-d stays 0-d, unlike np.ascontiguousarray)."""
    return np.require(np.asarray(array), requirements="C")


def node_base(node: Node) -> str:
    """A readable stem for the names of values derived from `node`."""
    return node.name or next((o for o in node.outputs if o), node.op.lower())


class Rewriter:
    """Scratch space for one pass: the new node list, types, constants and fresh names.

    Passes `emit` kept nodes unchanged and `add` new ones (their output types come from
    the op's inference rule); `finish` builds the new graph.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = dict(graph.types)
        self.constants: dict[str, np.ndarray] = dict(graph.constants)
        self.values = NameGen.for_values(graph)
        self.node_names = NameGen.for_nodes(graph)
        self.changed = False

    def emit(self, node: Node, *, changed: bool = False) -> None:
        self.nodes.append(node)
        self.changed |= changed

    def const(self, base: str, array: np.ndarray) -> str:
        """Add a new constant under a fresh name derived from `base`."""
        array = contiguous(array)
        name = self.values.fresh(base)
        self.constants[name] = array
        self.types[name] = TensorType.of(array)
        self.changed = True
        return name

    def add(self, op: str, inputs: Iterable[str], base: str, *, out: str | None = None,
            **attrs) -> str:
        """Append a new single-output node; returns its output (`out`, else fresh)."""
        output = out or self.values.fresh(base)
        node = Node.make(op, inputs, (output,), name=self.node_names.fresh(base), **attrs)
        self.emit_typed(node)
        return output

    def emit_typed(self, node: Node) -> None:
        """Append a new node, recording its output types from the op's inference rule."""
        types = [self.types[v] if v else None for v in node.inputs]
        values = [self.constants.get(v) if v else None for v in node.inputs]
        inferred = infer_node(node, types, values)
        self.types.update((o, t) for o, t in zip(node.outputs, inferred) if o)
        self.emit(node, changed=True)

    def finish(self) -> Graph:
        if not self.changed:
            return self.graph
        types = live_types(self.types, self.graph.inputs, self.constants, self.nodes)
        return self.graph.replace(nodes=tuple(self.nodes), constants=self.constants,
                                  types=types)
