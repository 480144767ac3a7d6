"""What a target's schedule package provides (`hidetc.schedules.cpu`,
`hidetc.schedules.cuda`) to the compile: the one interface the selection
(`hidetc.driver.select`) and the plan (`hidetc.driver.plan`) call, so neither knows
which target it schedules for; the tuner gets its templates and defaults from the
selection, and `hidetc inspect --space` reads `TEMPLATES`. A target's backend
(`hidetc.driver.backend`) holds its package; `tests/schedules/test_protocol.py` holds
both to this. The packages' other functions (`kernel_choice`, `build_kernel`: one
task's default kernel) are called on the package itself (by its tests), not through
this interface.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

from hidetc.compute.task import Task
from hidetc.graph.ir import Graph, Node
from hidetc.schedules.template import Target, Template
from hidetc.tir.ir import Function


@runtime_checkable
class ScheduleModule(Protocol):
    # a kernel whose epilogue reads a value at the index it stores may write its output
    # over that value (the plan's in-place outputs)
    WRITES_IN_PLACE: bool
    # op (or op variant key) -> its schedule template: `hidetc inspect --space`
    TEMPLATES: Mapping[str, Template]

    def supports(self, op: str) -> bool:
        """Whether an op has a kernel (a rule or a template) on this target."""

    def check_node(self, node: Node, graph: Graph) -> None:
        """A one-line UnsupportedOpError for a node this target cannot run (dtypes,
        sizes); fused members never reach the checks `anchor_template` and
        `build_rule` make on an anchor's task."""

    def anchor_template(self, task: Task, constant_weights: bool, target: Target
                        ) -> tuple[Any, Any]:
        """(template, its default config for `target`) the selection gives an anchor
        task, the template in the form the plan runs it; (None, None): a rule. Each
        computed once per distinct task (the selection keeps them)."""

    def build_rule(self, task: Task, name: str, target: Target) -> Function:
        """The rule kernel of a task the selection gave no template."""

    def finish_kernel(self, fn: Function, target: Target, task: Task) -> Function:
        """The plan's last word on a built (fused) kernel."""

    def kernel_facts(self, fn: Function, target: Target, task: Task) -> dict:
        """What the manifest says of a launch besides its choice (parallel tasks, grid,
        the cost model's estimate...)."""
