"""Selection: which kernel every fusion group gets, decided once per compile.

The optimized graph is partitioned into fusion groups (`hidetc.fusion.partition`, with
the target's prologue refusals) ONCE, and each group becomes a `WorkItem`: its anchor,
the anchor's task, the template that schedules that task on the target (None: a rule
builds it) in the form the plan runs it (on the cpu the prepacked form for constant
weights) and that template's default config (both from
`ScheduleModule.anchor_template`, once per distinct task: `Selection.decided`), and
whether the anchor's weights are a graph constant. The tuner then fills a config per
distinct templated task (`Selection.templated`); the plan builds every item's kernel
with it. Nothing downstream partitions or picks a template again -- but for the one
case it cannot foresee: a producer that cannot write its slice of a Concat (a graft
refused at plan time) makes the plan select again with that Concat kept as a kernel
(`select(..., keep=...)`, reusing the decisions of the tasks it already has).

Assumes the graph passes ran (the plan's assumptions). Guarantees: items in execution
order, one per group; equal tasks get the same template and default.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from hidetc.compute.task import Task, task_of
from hidetc.fusion.partition import FusionGroup, partition
from hidetc.graph.ir import Graph, Node
from hidetc.target import Target


@dataclass(frozen=True)
class WorkItem:
    """One fusion group as selection decided it."""
    group: FusionGroup
    anchor: Node
    task: Task
    template: Any             # None: a rule kernel
    default: Any              # the template's default config for the target
    constant_weights: bool    # the anchor's weights (its second input) are a constant


@dataclass(frozen=True)
class Selection:
    """The work of one compile: the graph, its items, how it was partitioned, and
    `decided`: task -> (template, default) of every task selected so far (the items'
    and any `known` ones), for a re-selection or a smaller group to reuse; read-only
    (who decides more works on a copy)."""
    graph: Graph
    items: tuple[WorkItem, ...]
    fuse: bool
    keep: frozenset[str] = field(default_factory=frozenset)
    decided: Mapping[Task, tuple[Any, Any]] = field(default_factory=dict, compare=False)

    def templated(self) -> list[tuple[Task, Any, Any]]:
        """(task, template, default) of every distinct templated task, in order: what
        the tuner chooses configs for."""
        seen: dict[Task, tuple[Task, Any, Any]] = {}
        for item in self.items:
            if item.template is not None and item.task not in seen:
                seen[item.task] = (item.task, item.template, item.default)
        return list(seen.values())


def constant_weights(anchor: Node, graph: Graph) -> bool:
    return len(anchor.inputs) > 1 and anchor.inputs[1] in graph.constants


def select(graph: Graph, backend, machine: Target, fuse: bool = True,
           keep: frozenset[str] = frozenset(),
           known: Optional[Mapping[Task, tuple[Any, Any]]] = None) -> Selection:
    """The selection of `graph` for `machine` on `backend` (see the module docstring);
    `keep`: Concats kept as kernels; `known`: task -> (template, default) already
    decided (a re-selection reuses them)."""
    decided: dict[Task, tuple[Any, Any]] = dict(known or {})
    nodes = {n.name: n for n in graph.nodes}
    items = [work_item(group, graph, nodes, backend, machine, decided)
             for group in partition(graph, fuse, backend.refusals, keep)]
    return Selection(graph, tuple(items), fuse, keep, decided)


def work_item(group: FusionGroup, graph: Graph, nodes: Mapping[str, Node], backend,
              machine: Target, decided: dict[Task, tuple[Any, Any]]) -> WorkItem:
    """A group's work item; a task decided before (in `decided`) keeps its template and
    default, a new one is decided and added there."""
    anchor = nodes[group.anchor]
    task = task_of(anchor, graph)
    weights = constant_weights(anchor, graph)
    if task not in decided:
        decided[task] = backend.schedules.anchor_template(task, weights, machine)
    template, default = decided[task]
    return WorkItem(group, anchor, task, template, default, weights)
