"""Canonical data-movement ops: Reshape with explicit static shapes, Slice for Split,
Expand for a fill.

  - Flatten, Squeeze, Unsqueeze and Reshape become `Reshape(x, shape)` where `shape` is
    an int64 constant equal to the static output shape (no -1, no copied 0s;
    `allowzero=1` is set when the shape has a 0). A Reshape's old shape input, constant
    or computed, is no longer used (eliminate_dead_code drops it).
  - Reshape of a Reshape reads the inner Reshape's input (chains merge; the inner one
    dies when nothing else uses it).
  - A Reshape to the shape its input already has, a Transpose with the identity
    permutation, and a Split with a single output become Identity, which
    `remove_identity.run` then removes (same graph-output rules as that pass).
  - Split becomes one `Slice(x, starts, ends, axes)` per present output, with int64
    constants computed from the static output shapes (a Split with an omitted output
    and no constant `split` input is kept).
  - ConstantOfShape (what constant folding left: too big to store, such as the
    generated weights of onnx's "light" model-zoo models) becomes `Expand` of its one
    value to the same shape: an injective op every target computes, so the fill runs
    as a kernel instead of a value stored in the artifact.

Guarantees: output names and types are kept; no Flatten/Squeeze/Unsqueeze remains, nor
any Split but that rare one; new constants get fresh names (eliminate_common_subexpressions
merges equal ones). Returns the same graph object when nothing changed.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hidetc.graph.ir import Graph, Node
from hidetc.graph.passes import remove_identity
from hidetc.graph.passes.common import Rewriter, node_base
from hidetc.graph.symbolic import shape_array

Sources = dict[str, str]  # output of an emitted Reshape -> that Reshape's data input


def run(graph: Graph) -> Graph:
    if not any(node.op in HANDLERS for node in graph.nodes):
        return graph
    rw = Rewriter(graph)
    sources: Sources = {}
    for node in graph.nodes:
        handler = HANDLERS.get(node.op)
        if handler is None:
            rw.emit(node)
        else:
            handler(rw, node, sources)
    return remove_identity.run(rw.finish())


def to_reshape(rw: Rewriter, node: Node, sources: Sources) -> None:
    data, out = node.inputs[0], node.outputs[0]
    root = sources.get(data, data)
    shape = rw.graph.types[out].shape
    if rw.types[root].shape == shape:
        sources[out] = root
        rw.emit(Node("Identity", (root,), (out,), name=node.name), changed=True)
        return
    sources[out] = root
    if is_canonical_reshape(rw, node, root):
        rw.emit(node)
        return
    shape_const = rw.const(f"{node_base(node)}_shape", shape_array(shape))
    attrs = {"allowzero": 1} if 0 in shape else {}
    rw.emit(Node.make("Reshape", (root, shape_const), (out,), name=node.name, **attrs),
            changed=True)


def is_canonical_reshape(rw: Rewriter, node: Node, root: str) -> bool:
    if node.op != "Reshape" or node.inputs[0] != root:
        return False
    shape = rw.graph.types[node.outputs[0]].shape
    target = rw.constants.get(node.inputs[1])
    if target is None or target.dtype != np.int64 or tuple(target.tolist()) != shape:
        return False
    return 0 not in shape or bool(node.attr("allowzero", 0))


def split_to_slices(rw: Rewriter, node: Node, sources: Sources) -> None:
    data = node.inputs[0]
    axis = int(node.attr("axis", 0)) % rw.types[data].rank
    sizes = split_sizes(rw, node, axis)
    if sizes is None:
        rw.emit(node)
        return
    if len(node.outputs) == 1:
        rw.emit(Node("Identity", (data,), node.outputs, name=node.name), changed=True)
        return
    base, start = node_base(node), 0
    axes = rw.const(f"{base}_axes", np.array([axis], dtype=np.int64))
    for index, (out, size) in enumerate(zip(node.outputs, sizes)):
        if out:
            starts = rw.const(f"{base}_start{index}", np.array([start], dtype=np.int64))
            ends = rw.const(f"{base}_end{index}", np.array([start + size], dtype=np.int64))
            rw.add("Slice", (data, starts, ends, axes), f"{base}_slice{index}", out=out)
        start += size


def split_sizes(rw: Rewriter, node: Node, axis: int) -> list[int] | None:
    """Output sizes along the axis: from the output types, or from a constant `split`
    input when some output is omitted (None when unknown: the Split is kept)."""
    if all(node.outputs):
        return [rw.graph.types[out].shape[axis] for out in node.outputs]
    split = rw.constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
    return None if split is None else [int(v) for v in split.tolist()]


def identity_transpose(rw: Rewriter, node: Node, sources: Sources) -> None:
    rank = rw.types[node.inputs[0]].rank
    perm = node.attr("perm")
    perm = tuple(range(rank - 1, -1, -1)) if perm is None else tuple(perm)
    if perm == tuple(range(rank)):
        rw.emit(Node("Identity", node.inputs[:1], node.outputs, name=node.name), changed=True)
    else:
        rw.emit(node)


def fill_to_expand(rw: Rewriter, node: Node, sources: Sources) -> None:
    dtype = rw.graph.types[node.outputs[0]].dtype
    value = rw.const(f"{node_base(node)}_value",
                     np.array(node.attr("value", 0.0)).astype(dtype).reshape(()))
    rw.emit(Node("Expand", (value, node.inputs[0]), node.outputs, name=node.name),
            changed=True)


HANDLERS: dict[str, Callable[[Rewriter, Node, Sources], None]] = {
    "Flatten": to_reshape,
    "Squeeze": to_reshape,
    "Unsqueeze": to_reshape,
    "Reshape": to_reshape,
    "Split": split_to_slices,
    "Transpose": identity_transpose,
    "ConstantOfShape": fill_to_expand,
}
