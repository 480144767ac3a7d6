"""The execution plan as records: one `LaunchRecord` per kernel launch of the forward
pass, the plan the list of them with the memory plan and the weights.

A launch record holds everything decided about one launch -- its kernel (the finished
function, shared by equal groups), the anchor's task, the fusion group, the template
and config (and where the config came from), the launch facts (flops, parallel tasks,
grid...), the build's resources for its kernel, and its arguments: the graph value
each holds and where it lives (`Arg`) -- and the manifest's kernel entry is derived
from it (`manifest_entry`). Recovery, the per-kernel comparison and the builds read
records, never manifest rows.

Sizes are integers today; a record's shape-dependent fields (the task's tensor types,
the arguments' arena offsets) are the ones the dynamic-shapes work turns into
expressions of symbolic dimensions, with the record's layout unchanged.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Mapping, Optional

from hidetc.backends.codegen.launcher import Arg, Launch
from hidetc.backends.runtime.memory_plan import MemoryPlan
from hidetc.compute.task import Task, task_of
from hidetc.fusion.partition import FusionGroup
from hidetc.graph.ir import Graph, Node
from hidetc.target import Target
from hidetc.tir.ir import Function


@dataclass(frozen=True)
class LaunchRecord:
    """One kernel launch (see the module docstring)."""
    kernel: str                       # its function's name (equal groups share it)
    function: Function
    task: Task                        # the anchor's task
    group: FusionGroup
    node: str                         # the anchor node
    op: str
    values: tuple[str, ...]           # the graph value each argument holds
    args: tuple[Arg, ...]             # where each lives (weights: offset -1 until emitted)
    writes: tuple[str, ...]           # the values it writes
    choice: Mapping[str, Any]         # template, config, tuning (where the config came from)
    facts: Mapping[str, Any]          # flops and the target's launch facts
    resources: Mapping[str, Any] = field(default_factory=dict)   # the build's, per kernel

    def resolved(self, entries: Mapping[str, Any]) -> Launch:
        """The launch with its weight arguments at their offsets in the weights file."""
        return Launch(self.kernel, tuple(
            Arg("weights", int(entries[v].offset)) if a.space == "weights" else a
            for a, v in zip(self.args, self.values)))

    def manifest_entry(self, graph: Graph) -> dict:
        """The manifest's `kernels` entry of this launch."""
        return {"name": self.kernel, "node": self.node, "op": self.op,
                "args": list(self.values), "writes": list(self.writes),
                "task": self.task.signature(), **self.choice, **self.facts,
                **self.resources, "group": group_dict(self.group, graph)}


@dataclass(frozen=True)
class ExecutionPlan:
    """The forward pass: its launches in order, where every value lives, the weights."""
    graph: Graph
    machine: Target                   # what the kernels were built for
    launches: tuple[LaunchRecord, ...]
    weights: dict[str, object]        # constant name -> array, in file order
    memory: MemoryPlan
    output_sources: list[dict] = field(default_factory=list)
    fusion_fallbacks: list[dict] = field(default_factory=list)
    in_place: dict[str, str] = field(default_factory=dict)   # output -> value it overwrites
    value_bytes: dict[str, int] = field(default_factory=dict)   # arena value -> its size

    @cached_property
    def functions(self) -> dict[str, Function]:
        """Kernel name -> function, each distinct kernel once (launch order)."""
        return {r.kernel: r.function for r in self.launches}

    @cached_property
    def tasks(self) -> dict[str, Task]:
        """Kernel name -> the anchor's task."""
        return {r.kernel: r.task for r in self.launches}

    def record(self, kernel: str) -> Optional[LaunchRecord]:
        """The first launch of `kernel`."""
        return next((r for r in self.launches if r.kernel == kernel), None)

    def with_resources(self, resources: Mapping[str, Mapping]) -> "ExecutionPlan":
        """The plan with each launch's build resources (per kernel name) attached."""
        return replace(self, launches=tuple(replace(r, resources=dict(resources.get(
            r.kernel, {}))) for r in self.launches))


def kernel_name(key) -> str:
    """`op_<hash>` of a task, or of a group key (see `group_key`): the anchor's op."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
    op = key.op if isinstance(key, Task) else key[[r for r, _, _ in key].index("a")][1].op
    return f"{op.lower()}_{digest}"


def group_key(group: FusionGroup, nodes: dict[str, Node], graph: Graph) -> tuple:
    """What makes two groups' kernels equal: the members' tasks and how they connect
    (values produced in the group by member number, others by order of first use)."""
    local: dict[str, str] = {}
    parts = []
    for k, name in enumerate(group.members):
        node = nodes[name]
        refs = []
        for v in node.inputs:
            if v and v not in local:
                local[v] = f"x{len(local)}"
            refs.append(local.get(v, "-"))
        for o in node.outputs:
            if o:
                local[o] = f"m{k}"
        role = "a" if name == group.anchor else ("p" if name in group.prologues else "e")
        parts.append((role, task_of(node, graph), tuple(refs)))
    if group.into:       # the slice of the Concat output the kernel writes
        concat = nodes[group.into]
        result = nodes[group.output_node].outputs[0]
        parts.append(("c", task_of(concat, graph), (concat.inputs.index(result),)))
    return tuple(parts)


def written_values(group: FusionGroup, nodes: dict[str, Node]) -> tuple[str, ...]:
    """The values a group's kernel writes: its output node's, or the Concat output it
    writes its slice of."""
    return tuple(o for o in nodes[group.into or group.output_node].outputs if o)


def group_dict(group: FusionGroup, graph: Graph) -> dict:
    """The fusion group of a launch: prologue and epilogue nodes as [name, op], and the
    Concat node it writes its slice of (`into`), if any."""
    ops = {n.name: n.op for n in graph.nodes}
    return {"kind": group.kind,
            "prologues": [[n, ops[n]] for n in group.prologues],
            "epilogues": [[n, ops[n]] for n in group.epilogues],
            **({"into": [group.into, ops[group.into]]} if group.into else {})}
