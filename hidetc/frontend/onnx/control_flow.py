"""If, Loop and Scan read by inlining their subgraphs: hidetc compiles static programs,
so control flow must be decidable when the model is imported.

- If: the condition must be known at import (a constant, or folded from shapes and
  constants, as exporters' `if x.dim() == 4` guards are); the taken branch's nodes are
  spliced in, its outputs copied to the If's outputs.
- Loop: the trip count M (when given) and every condition (the initial one and each
  iteration's `cond` output) must be known at import; the body is spliced in once per
  iteration, up to `MAX_UNROLL` iterations. The loop-carried values flow from one copy
  to the next; scan outputs are stacked along a new first axis. A loop that runs zero
  times with scan outputs is refused (their shape is unknowable).
- Scan (opset 9 form on): the sequence length is the scan inputs' static extent along
  `scan_input_axes`; the body is spliced in once per step, scan inputs sliced by Gather
  (reversed by `scan_input_directions`), scan outputs stacked along `scan_output_axes`
  (reversed by `scan_output_directions`).

Names: each spliced copy gets fresh names (`<node>/<branch or iteration>/<name>`) for
everything the subgraph binds (its inputs, initializers, node outputs); names it does not
bind resolve to the enclosing scopes (lexical scoping, inner names shadow outer ones),
through the enclosing copies' renaming (`Subgraph.outer`) for nested subgraphs.

Assumes: the importer decodes subgraph nodes like top-level ones (graph attributes of
If/Loop/Scan become `Subgraph`s), processes nodes from a worklist and calls `expand` for
the ops in `EXPANDERS` (a Loop continues through a `LOOP_STEP` marker node that is
reached after the iteration's nodes were imported, when its condition has been folded).
Guarantees: one-line errors naming the node: ModelError when a condition or trip count
is not known at import (a value bound at compile time fixes it) or when a subgraph's
inputs/outputs do not match the node; UnsupportedOpError past the unroll limit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import onnx

from hidetc.errors import ModelError, UnsupportedOpError
from hidetc.frontend.onnx.base import Context, OnnxNode, label

MAX_UNROLL = 1024
LOOP_STEP = "__hidetc_loop_step__"
GRAPH_OPS = ("If", "Loop", "Scan")
Decode = Callable[[onnx.NodeProto, str], OnnxNode]


@dataclass(frozen=True)
class Subgraph:
    """A graph attribute and the flat names of the enclosing scopes' values."""
    graph: onnx.GraphProto
    outer: Mapping[str, str] = field(default_factory=dict)


def free_values(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from enclosing scopes (nested subgraphs included)."""
    bound = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    bound |= {o for n in graph.node for o in n.output}
    read: set[str] = set()
    for node in graph.node:
        read.update(i for i in node.input if i)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                read |= free_values(attr.g)
    read.update(o.name for o in graph.output)
    return read - bound


# ops whose outputs depend on their input's type only, not its values
TYPE_ONLY = ("Shape", "Size")


def needed_values(nodes, seeds) -> set[str]:
    """The values `seeds` are computed from: traced back through their producers among
    `nodes` (NodeProtos; every input, and what a producer's subgraphs read from enclosing
    scopes), except through Shape/Size. The backend's compile-time inputs and a function
    body's value slots both use it."""
    producer = {o: n for n in nodes for o in n.output if o}
    pending, needed = list(seeds), set()
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producer.get(name)
        if node is not None and node.op_type not in TYPE_ONLY:
            pending.extend(i for i in node.input if i)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    pending.extend(free_values(attr.g))
    return needed


def subgraph_nodes(graph: onnx.GraphProto):
    """Every node of a graph and of its nested subgraphs (for the up-front op checks)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from subgraph_nodes(attr.g)


def _known(node: OnnxNode, ctx: Context, value: str, what: str) -> np.ndarray:
    array = ctx.values.get(value)
    if array is None:   # a ModelError: binding the value (e.g. as a constant) fixes it
        raise ModelError(
            f"{label(node)}: {what} '{value}' is not known at compile time (hidetc compiles "
            f"static programs: control flow must fold from constants and shapes)")
    return np.asarray(array)


def _flag(node: OnnxNode, array: np.ndarray, what: str) -> bool:
    if array.size != 1:
        raise ModelError(f"{label(node)}: {what} must hold one value, got shape "
                         f"{list(array.shape)}")
    return bool(array.reshape(-1)[0])


def _instantiate(sub: Subgraph, inputs: list[str], tag: str, ctx: Context, decode: Decode
                 ) -> tuple[list[OnnxNode], list[str]]:
    """The subgraph's nodes renamed for one copy, its inputs bound to `inputs`; returns
    (nodes, the flat names of its outputs)."""
    graph = sub.graph
    if len(inputs) != len(graph.input):
        raise ModelError(f"subgraph '{graph.name}' has {len(graph.input)} inputs, expected "
                         f"{len(inputs)}")
    names = dict(sub.outer)
    names.update({i.name: flat for i, flat in zip(graph.input, inputs)})
    nodes: list[OnnxNode] = []
    for tensor in graph.initializer:
        names[tensor.name] = ctx.fresh(f"{tag}/{tensor.name}")
        nodes.append(OnnxNode("Constant", (), (names[tensor.name],), names[tensor.name],
                              {"value": onnx.numpy_helper.to_array(tensor)}))
    for index, proto in enumerate(graph.node):
        for out in proto.output:
            if out:
                names[out] = ctx.fresh(f"{tag}/{out}")
    for index, proto in enumerate(graph.node):
        decoded = decode(proto, f"{tag}/{proto.name or f'{proto.op_type}_{index}'}")
        made = renamed(decoded, names)
        ctx.used.update(made.inputs)
        ctx.used.update(made.implicit)
        nodes.append(made)
    outputs = [names.get(o.name, o.name) for o in graph.output]
    ctx.used.update(outputs)
    return nodes, outputs


def renamed(node: OnnxNode, names: Mapping[str, str]) -> OnnxNode:
    """A decoded subgraph/function-body node in its copy: its inputs, outputs and implicit
    reads renamed by `names` (names not in it are the enclosing scopes'), and its own
    subgraphs resolving their free names through `names` too."""
    def rename(n: str) -> str:
        return names.get(n, n) if n else n
    attrs = {k: Subgraph(v.graph, {**v.outer, **names}) if isinstance(v, Subgraph) else v
             for k, v in node.attrs.items()}
    return OnnxNode(node.op, tuple(rename(i) for i in node.inputs),
                    tuple(rename(o) for o in node.outputs), node.name, attrs,
                    tuple(rename(i) for i in node.implicit), node.source)


def _copy(node: OnnxNode, source: str, target: str) -> OnnxNode:
    return OnnxNode("Identity", (source,), (target,), f"{node.name}/{target}", {})


def expand_if(node: OnnxNode, ctx: Context, decode: Decode) -> list[OnnxNode]:
    if not any(node.outputs):      # nothing reads it and ONNX nodes have no side effects
        return []
    if not node.input(0):
        raise ModelError(f"{label(node)}: no condition input (an If takes one)")
    cond = _flag(node, _known(node, ctx, node.inputs[0], "condition"), "the condition")
    branch = node.attrs["then_branch" if cond else "else_branch"]
    tag = ctx.fresh(f"{node.name}/{'then' if cond else 'else'}")
    nodes, outputs = _instantiate(branch, [], tag, ctx, decode)
    if len(outputs) != len(node.outputs):
        raise ModelError(f"{label(node)}: the {'then' if cond else 'else'} branch has "
                         f"{len(outputs)} outputs, the node {len(node.outputs)}")
    return nodes + [_copy(node, o, y) for o, y in zip(outputs, node.outputs) if y]


@dataclass
class _LoopState:
    node: OnnxNode
    body: Subgraph
    trips: int | None
    iteration: int
    carried: list[str]
    scanned: list[list[str]]


def expand_loop(node: OnnxNode, ctx: Context, decode: Decode) -> list[OnnxNode]:
    m, cond = node.input(0), node.input(1)
    trips = int(_known(node, ctx, m, "trip count M").reshape(-1)[0]) if m else None
    running = _flag(node, _known(node, ctx, cond, "condition"), "cond") if cond else True
    if trips is None and not cond:
        raise UnsupportedOpError(f"{label(node)}: a loop with neither trip count nor "
                                 f"condition never ends")
    body: Subgraph = node.attrs["body"]
    carried = list(node.inputs[2:])
    n_scan = len(body.graph.output) - 1 - len(carried)
    if len(body.graph.input) != 2 + len(carried) or n_scan < 0:
        raise ModelError(f"{label(node)}: the body has {len(body.graph.input)} inputs and "
                         f"{len(body.graph.output)} outputs for {len(carried)} loop-carried "
                         f"values")
    state = _LoopState(node, body, trips, 0, carried, [[] for _ in range(n_scan)])
    return _loop_next(state, running, ctx, decode)


def _loop_next(state: _LoopState, running: bool, ctx: Context, decode: Decode
               ) -> list[OnnxNode]:
    node, i = state.node, state.iteration
    if running and (state.trips is None or i < state.trips):
        if i >= MAX_UNROLL:
            raise UnsupportedOpError(f"{label(node)}: the loop runs more than {MAX_UNROLL} "
                                     f"iterations (unrolled at import)")
        tag = ctx.fresh(f"{node.name}/iteration{i}")
        counter = ctx.fresh(f"{tag}/iteration_num")
        cond_in = ctx.fresh(f"{tag}/cond_in")
        inputs = state.body.graph.input
        made = [OnnxNode("Constant", (), (counter,), counter,
                         {"value": _as_declared(np.array(i, np.int64), inputs[0])}),
                OnnxNode("Constant", (), (cond_in,), cond_in,
                         {"value": _as_declared(np.array(True), inputs[1])})]
        nodes, outputs = _instantiate(state.body, [counter, cond_in, *state.carried], tag, ctx,
                                      decode)
        k = len(state.carried)
        state.carried = outputs[1:1 + k]
        for column, value in zip(state.scanned, outputs[1 + k:]):
            column.append(value)
        state.iteration += 1
        step = OnnxNode(LOOP_STEP, (outputs[0],), (), f"{node.name}/step{i}",
                        {"state": state})
        return made + nodes + [step]
    finals = [_copy(node, v, y) for v, y in zip(state.carried, node.outputs) if y]
    for column, y in zip(state.scanned, node.outputs[len(state.carried):]):
        if not y:
            continue
        if not column:
            raise UnsupportedOpError(f"{label(node)}: the loop runs zero iterations, so its "
                                     f"scan output '{y}' has no known shape")
        axes = ctx.fresh(f"{node.name}/axes")
        finals.append(OnnxNode("Constant", (), (axes,), axes, {"value": np.array([0])}))
        stacked = []
        for j, value in enumerate(column):
            out = ctx.fresh(f"{node.name}/{y}/{j}")
            finals.append(OnnxNode("Unsqueeze", (value, axes), (out,), out, {}))
            stacked.append(out)
        finals.append(OnnxNode("Concat", tuple(stacked), (y,), f"{node.name}/{y}", {"axis": 0}))
    return finals


def _as_declared(value: np.ndarray, info: onnx.ValueInfoProto) -> np.ndarray:
    """The loop's scalar iteration number or condition in the shape the body declares
    for it: some exporters declare [1] (ONNX Runtime feeds the body that shape)."""
    tensor = info.type.tensor_type
    if tensor.HasField("shape") and len(tensor.shape.dim) == 1:
        return value.reshape(1)
    return value


def loop_step(node: OnnxNode, ctx: Context, decode: Decode) -> list[OnnxNode]:
    state: _LoopState = node.attrs["state"]
    value = _known(state.node, ctx, node.inputs[0], f"iteration {state.iteration - 1}'s cond")
    return _loop_next(state, _flag(state.node, value, "cond"), ctx, decode)


def expand_scan(node: OnnxNode, ctx: Context, decode: Decode) -> list[OnnxNode]:
    body: Subgraph = node.attrs["body"]
    n_in = int(node.attrs.get("num_scan_inputs", 0))
    states = list(node.inputs[:len(node.inputs) - n_in])
    scans = list(node.inputs[len(states):])
    n_out = len(body.graph.output) - len(states)
    if n_in < 1 or n_out < 0 or len(body.graph.input) != len(states) + n_in:
        raise ModelError(f"{label(node)}: the body's {len(body.graph.input)} inputs and "
                         f"{len(body.graph.output)} outputs do not match {len(states)} "
                         f"state(s) and {n_in} scan input(s)")
    in_axes = list(node.attrs.get("scan_input_axes") or [0] * n_in)
    in_dirs = list(node.attrs.get("scan_input_directions") or [0] * n_in)
    out_axes = list(node.attrs.get("scan_output_axes") or [0] * n_out)
    out_dirs = list(node.attrs.get("scan_output_directions") or [0] * n_out)
    lengths = set()
    for k, name in enumerate(scans):
        rank = ctx.types[name].rank
        in_axes[k] %= max(rank, 1)
        lengths.add(ctx.types[name].shape[in_axes[k]])
    if len(lengths) != 1:
        raise ModelError(f"{label(node)}: scan inputs have different sequence lengths "
                         f"{sorted(lengths)}")
    steps = lengths.pop()
    if steps > MAX_UNROLL:
        raise UnsupportedOpError(f"{label(node)}: {steps} steps exceed the unroll limit "
                                 f"{MAX_UNROLL}")
    made: list[OnnxNode] = []
    columns: list[list[str]] = [[] for _ in range(n_out)]
    for t in range(steps):
        tag = ctx.fresh(f"{node.name}/step{t}")
        sliced = []
        for k, name in enumerate(scans):
            index = ctx.fresh(f"{tag}/index{k}")
            position = steps - 1 - t if in_dirs[k] else t
            made.append(OnnxNode("Constant", (), (index,), index,
                                 {"value": np.array(position, np.int64)}))
            out = ctx.fresh(f"{tag}/slice{k}")
            made.append(OnnxNode("Gather", (name, index), (out,), out, {"axis": in_axes[k]}))
            sliced.append(out)
        nodes, outputs = _instantiate(body, states + sliced, tag, ctx, decode)
        made += nodes
        states = outputs[:len(states)]
        for column, value in zip(columns, outputs[len(states):]):
            column.append(value)
    made += [_copy(node, v, y) for v, y in zip(states, node.outputs) if y]
    for j, (column, y) in enumerate(zip(columns, node.outputs[len(states):])):
        if not y:
            continue
        axes = ctx.fresh(f"{node.name}/axes{j}")   # (negative axes: Unsqueeze and Concat
        made.append(OnnxNode("Constant", (), (axes,), axes,   # read them the same way)
                             {"value": np.array([out_axes[j]])}))
        ordered = column[::-1] if out_dirs[j] else column
        stacked = []
        for value in ordered:
            out = ctx.fresh(f"{node.name}/{y}/item")
            made.append(OnnxNode("Unsqueeze", (value, axes), (out,), out, {}))
            stacked.append(out)
        made.append(OnnxNode("Concat", tuple(stacked), (y,), f"{node.name}/{y}",
                             {"axis": out_axes[j]}))
    return made


EXPANDERS: dict[str, Callable[[OnnxNode, Context, Decode], list[OnnxNode]]] = {
    "If": expand_if, "Loop": expand_loop, "Scan": expand_scan, LOOP_STEP: loop_step}
# The DECOMPOSERS interface (handlers.py): no per-node handlers (the importer expands
# these ops itself), the ops it reads, their reviewed versions and compile-time inputs.
HANDLERS: dict = {}
EXTRA_OPS: tuple[str, ...] = GRAPH_OPS
CHECKED: tuple[str, ...] = GRAPH_OPS
FIRST_VERSION: dict[str, int] = {"Scan": 9}   # Scan-8 had a batch axis and sequence_lens
VALUE_INPUTS: dict[str, tuple[int, ...]] = {"If": (0,), "Loop": (0, 1)}
