"""Partition an optimized graph into fusion groups: each group becomes one kernel.

A group is an *anchor* node (its kernel comes from the anchor's schedule template or
rule, built from the anchor's task alone) plus
- *prologues*: injective or bijective producers of the anchor's (or another
  prologue's) inputs, grafted into the kernel's loads of that input;
- *epilogues*: consumers after the anchor, each bijective in the fused values
  (elementwise with no fused value broadcast, Cast, or a pure index map: Reshape,
  Transpose), grafted into the kernel's stores. An epilogue may branch and rejoin
  (GELU reads its input twice) as long as it converges to one value; an index map
  only joins when the group has a single open value (so every fused value lives at
  one index per store).

Rules, in order:
1. Anchors are the nodes of kind ANCHOR (MatMul, Conv, ...) and REDUCE (reductions,
   Softmax, normalizations, pooling), in topological order. Each first takes its
   epilogue: the anchor's descendants are tried in topological order; one joins when
   it qualifies (above), reads at least one value of the group, is not yet in a group,
   and none of its other inputs is computed from the group (no cycle); the epilogue
   kept is the largest prefix after which exactly one value of the group is used
   outside it (or is a graph output, which ends the search). Then
   its prologues: the producer of a non-constant input qualifies when it has one
   output, an injective compute definition (`hidetc.compute.injective.COMPUTE`), is
   not yet in a group, and the value is consumed by nothing else (one consumer node,
   not a graph output): a fused value is never computed twice; the target may refuse
   some producer ops for some anchors (`refusals`, from its backend: on every target
   a Concat or GridSample into a convolution or MatMul, `NO_GATHERING_PROLOGUES`; on
   the cpu a Transpose into a ConvNHWC too).
   Prologues recurse into their own inputs.
2. The remaining nodes with a compute definition form *injective groups*, in reverse
   topological order: the latest unassigned one is the group's anchor (built by the
   injective rule) and takes prologues by the same rule.
3. Everything else is a group of its own.
4. Concat without copies (`_absorb_concats`): a Concat left as a group of its own
   whose inputs are distinct, each the output of a different anchor or injective group
   and read by nothing but the Concat (not graph outputs), and whose output is not a
   graph output, disappears: each producing group writes its result straight into its
   slice of the Concat's output (`FusionGroup.into` names the Concat; the graft maps
   the store index, `hidetc.fusion.graft`). Inception's blocks then write their four
   branches into the block output, with no copy kernel. `keep` names Concats to leave
   alone (the planner's fallback when a producer's kernel refuses the graft).

Every group has exactly one output value (its last node's; a group with `into` writes
it into the Concat's output instead), and every other value produced inside a group is
consumed only inside it, so running the groups in the order of their output nodes is
a topological order (`check_partition` proves it for each partition: every node in
exactly one group or absorbed into its inputs' producers, internal values private,
inputs of each group produced by earlier groups -- a Concat's output once all its
writers ran --, graph outputs produced by group outputs).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Mapping

from hidetc.compute.injective import COMPUTE
from hidetc.graph.ir import Graph, Node
from hidetc.graph.ops.registry import OpKind, get_op

INDEX_MAPS = frozenset({"Reshape", "Transpose"})


@dataclass(frozen=True)
class FusionGroup:
    anchor: str                       # node name
    prologues: tuple[str, ...] = ()   # node names, topological order
    epilogues: tuple[str, ...] = ()   # node names, chain order
    kind: str = "anchor"              # "anchor" | "injective" | "single"
    into: str = ""                    # a Concat node: the output goes into its slice

    @property
    def members(self) -> tuple[str, ...]:
        return self.prologues + (self.anchor,) + self.epilogues

    @property
    def output_node(self) -> str:
        return self.epilogues[-1] if self.epilogues else self.anchor

    @property
    def fused(self) -> bool:
        return bool(self.prologues or self.epilogues or self.into)


class PartitionError(AssertionError):
    """A partition broke an invariant (a bug in the partitioner, not a user error)."""


class _Uses:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.position = {n.name: i for i, n in enumerate(graph.nodes)}
        self.node = {n.name: n for n in graph.nodes}
        self.producer: dict[str, Node] = {}
        self.consumers: dict[str, list[Node]] = defaultdict(list)
        for n in graph.nodes:
            for o in n.outputs:
                if o:
                    self.producer[o] = n
            for v in dict.fromkeys(v for v in n.inputs if v):
                self.consumers[v].append(n)
        self.outputs = set(graph.outputs)

    def private(self, value: str) -> Node | None:
        """The sole consumer of `value`, when it has one and is not a graph output."""
        users = self.consumers.get(value, [])
        return users[0] if len(users) == 1 and value not in self.outputs else None


def _single_output(node: Node) -> bool:
    return sum(1 for o in node.outputs if o) == 1


def _descendants(node: Node, uses: _Uses) -> set[str]:
    seen: set[str] = set()
    stack = [node]
    while stack:
        for o in stack.pop().outputs:
            for user in uses.consumers.get(o, []):
                if user.name not in seen:
                    seen.add(user.name)
                    stack.append(user)
    return seen


def _epilogue_ok(node: Node, inside: set[str], graph: Graph) -> bool:
    """`node` may join an epilogue whose values so far are `inside`."""
    if not _single_output(node) or node.op not in COMPUTE:
        return False
    fused = [i for i, v in enumerate(node.inputs) if v in inside]
    if node.op in INDEX_MAPS:
        return fused == [0]
    if get_op(node.op).kind is not OpKind.BIJECTIVE:
        return False
    out_shape = graph.types[node.outputs[0]].shape
    return all(graph.types[node.inputs[i]].shape == out_shape for i in fused)


def _epilogues(anchor: Node, uses: _Uses, taken: set[str], limit: int = 32) -> list[str]:
    """The largest epilogue reachable greedily in topological order such that the group
    still has exactly one escaping value (see the module docstring)."""
    if not _single_output(anchor):
        return []
    below = _descendants(anchor, uses)
    members: list[str] = []
    inside = {next(o for o in anchor.outputs if o)}       # values produced in the group
    best: list[str] = []

    def escaping() -> set[str]:
        names = set(members) | {anchor.name}
        return {v for v in inside if v in uses.outputs or
                any(c.name not in names for c in uses.consumers.get(v, []))}

    candidates = sorted((uses.node[n] for n in below), key=lambda n: uses.position[n.name])
    for node in candidates:
        if len(members) >= limit:
            break
        if node.name in taken or not any(v in inside for v in node.inputs):
            continue
        if not _epilogue_ok(node, inside, uses.graph):
            continue
        if node.op in INDEX_MAPS and escaping() != {node.inputs[0]}:
            continue
        external = [v for v in node.inputs if v and v not in inside]
        if any(uses.producer[v].name in below for v in external if v in uses.producer):
            continue   # would read a value computed from the group: a cycle
        members.append(node.name)
        inside.add(node.outputs[0])
        if escaping() == {node.outputs[0]}:
            best = list(members)
        if node.outputs[0] in uses.outputs:
            break
    return best


# Producer ops never grafted into an anchor's loads. On the cpu the
# channels-last direct conv reads its input along contiguous channels; through a
# Transpose from NCHW every load becomes a gather with index arithmetic, slower than the
# Transpose as its own kernel (bench/results/2026-12-06-decision-notes.md). (cuda's
# tensor-core ConvNHWC keeps it: unmeasured on a GPU.) A Concat into a convolution or a
# MatMul would turn each of their many reads of an input element into a select over
# the Concat's inputs (and the tensor-core tiles' 16-byte copies into element loads):
# the producers write into the Concat's output instead (rule 4). A GridSample (bilinear:
# four gathers, their weights and bounds per element, each reading the grid twice)
# would be recomputed at each of those reads: it is a kernel of its own
# (bench/results/2026-12-06-decision-notes.md).
NO_GATHER = ("Concat", "GridSample")
# anchor op -> the producer ops refused as its prologues: what every target refuses; a
# target's backend adds its own (the cpu's Transpose into a channels-last conv)
NO_GATHERING_PROLOGUES = {"Conv": NO_GATHER, "ConvNHWC": NO_GATHER, "MatMul": NO_GATHER}
Refusals = Mapping[str, tuple[str, ...]]


def _prologue_ok(node: Node) -> bool:
    return _single_output(node) and node.op in COMPUTE and \
        get_op(node.op).kind in (OpKind.BIJECTIVE, OpKind.INJECTIVE)


def _prologues(anchor: Node, uses: _Uses, taken: set[str], refusals: Refusals
               ) -> list[str]:
    refused = refusals.get(anchor.op, ())
    found: list[str] = []
    stack = [anchor]
    value_inputs = lambda n: set(get_op(n.op).value_inputs)  # noqa: E731
    while stack:
        node = stack.pop()
        params = value_inputs(node)
        for i, value in enumerate(node.inputs):
            if not value or i in params or value in uses.graph.constants:
                continue
            producer = uses.producer.get(value)
            if producer is None or producer.name in taken or not _prologue_ok(producer):
                continue
            if producer.op in refused:
                continue
            if uses.private(value) is not node:
                continue
            taken.add(producer.name)
            found.append(producer.name)
            stack.append(producer)
    return sorted(found, key=uses.position.__getitem__)


def partition(graph: Graph, fuse: bool = True, refusals: Refusals | None = None,
              keep: frozenset[str] = frozenset()) -> list[FusionGroup]:
    """The fusion groups of `graph`, in execution order (see the module docstring).
    With `fuse=False` every node is a group of its own (the unfused baseline);
    `refusals` (anchor op -> producer ops it does not take as prologues: the target's
    backend says; default `NO_GATHERING_PROLOGUES`); the Concat nodes named in `keep`
    stay kernels."""
    refusals = NO_GATHERING_PROLOGUES if refusals is None else refusals
    uses = _Uses(graph)
    if not fuse:
        return [FusionGroup(n.name, kind="single") for n in graph.nodes]
    taken: set[str] = set()
    groups: list[FusionGroup] = []
    for node in graph.nodes:
        if node.name in taken or get_op(node.op).kind not in (OpKind.ANCHOR, OpKind.REDUCE):
            continue
        taken.add(node.name)
        epilogues = _epilogues(node, uses, taken)
        taken.update(epilogues)
        prologues = _prologues(node, uses, taken, refusals)
        groups.append(FusionGroup(node.name, tuple(prologues), tuple(epilogues)))
    for node in reversed(graph.nodes):
        if node.name in taken:
            continue
        taken.add(node.name)
        if _prologue_ok(node):
            groups.append(FusionGroup(node.name, tuple(_prologues(node, uses, taken, {})),
                                      kind="injective"))
        else:
            groups.append(FusionGroup(node.name, kind="single"))
    groups.sort(key=lambda g: uses.position[g.output_node])
    groups = _absorb_concats(groups, uses, keep)
    check_partition(graph, groups)
    return groups


def _absorb_concats(groups: list[FusionGroup], uses: _Uses, keep: frozenset[str]
                    ) -> list[FusionGroup]:
    """Rule 4: each qualifying Concat's group removed, its producers writing into it."""
    writer = {uses.node[g.output_node].outputs[0]: i for i, g in enumerate(groups)
              if _single_output(uses.node[g.output_node])}
    absorbed: set[int] = set()
    for i, group in enumerate(groups):
        node = uses.node[group.anchor]
        if node.op != "Concat" or group.fused or node.name in keep:
            continue
        ins = node.inputs
        if node.outputs[0] in uses.outputs or not all(ins) or len(set(ins)) != len(ins):
            continue
        producers = [writer.get(v) for v in ins]
        if any(p is None or groups[p].kind == "single" or groups[p].into
               or uses.private(v) is not node for p, v in zip(producers, ins)):
            continue
        for p in producers:
            groups[p] = replace(groups[p], into=node.name)
        absorbed.add(i)
    return [g for i, g in enumerate(groups) if i not in absorbed]


def check_partition(graph: Graph, groups: list[FusionGroup]) -> None:
    """Raise PartitionError unless `groups` cover the graph once and run in order."""
    uses = _Uses(graph)
    seen: dict[str, int] = {}
    writers: dict[str, list[str]] = defaultdict(list)   # absorbed Concat -> values written
    for g_no, group in enumerate(groups):
        for name in group.members:
            if name in seen:
                raise PartitionError(f"node {name!r} is in two groups")
            if name not in uses.node:
                raise PartitionError(f"group {g_no} names an unknown node {name!r}")
            seen[name] = g_no
        if group.into:
            writers[group.into].append(uses.node[group.output_node].outputs[0])
    for name, values in writers.items():
        concat = uses.node.get(name)
        if concat is None or concat.op != "Concat" or name in seen or \
                sorted(values) != sorted(concat.inputs):
            raise PartitionError(f"concat {name!r} is not written by exactly its inputs' "
                                 f"groups")
    missing = [n.name for n in graph.nodes if n.name not in seen and n.name not in writers]
    if missing:
        raise PartitionError(f"nodes in no group: {missing[:5]}")
    available = set(graph.inputs) | set(graph.constants)
    pending = {name: len(values) for name, values in writers.items()}
    for g_no, group in enumerate(groups):
        members = set(group.members)
        out_node = uses.node[group.output_node]
        internal = {o for m in members for o in uses.node[m].outputs if o} - \
            {o for o in out_node.outputs if o}
        for value in internal:
            outside = [c.name for c in uses.consumers.get(value, []) if c.name not in members]
            if outside or value in uses.outputs:
                raise PartitionError(f"value {value!r} inside group {g_no} is used outside "
                                     f"it ({outside or 'graph output'})")
        for name in group.members:
            for value in uses.node[name].inputs:
                if value and value not in internal and value not in available:
                    raise PartitionError(f"group {g_no} ({group.anchor}) reads {value!r} "
                                         f"before any group produced it")
        available |= {o for o in out_node.outputs if o}
        if group.into:
            pending[group.into] -= 1
            if pending[group.into] == 0:       # the Concat's output is complete
                available |= {uses.node[group.into].outputs[0]}
    for value in graph.outputs:
        if value not in available:
            raise PartitionError(f"graph output {value!r} is not produced by a group output")
