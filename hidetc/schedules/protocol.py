"""What a target's schedule package provides (`hidetc.schedules.cpu`,
`hidetc.schedules.cuda`): the one interface the plan and the tuner call, so neither
knows which target it schedules for. A target's backend (`hidetc.driver.backend`)
holds its package; `tests/schedules/test_protocol.py` holds both to this.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from hidetc.compute.task import Task
from hidetc.graph.ir import Graph, Node
from hidetc.schedules.template import Target, Template
from hidetc.tir.ir import Function


@runtime_checkable
class ScheduleModule(Protocol):
    # a kernel whose epilogue reads a value at the index it stores may write its output
    # over that value (the plan's in-place outputs)
    WRITES_IN_PLACE: bool

    def supports(self, op: str) -> bool:
        """Whether an op has a kernel (a rule or a template) on this target."""

    def check_node(self, node: Node, graph: Graph) -> None:
        """A one-line UnsupportedOpError for a node this target cannot run (dtypes,
        sizes); fused members never reach `build_kernel`'s own checks."""

    def kernel_choice(self, task: Task, target: Target) -> tuple[Template | None, Any]:
        """(template, its default config for `target`), or (None, None): a rule."""

    def anchor_template(self, task: Task, constant_weights: bool, target: Target) -> Any:
        """The template the selection gives an anchor task, in the form the plan runs
        it (None: a rule)."""

    def build_kernel(self, task: Task, name: str, target: Target) -> Function:
        """The kernel of a task: a template's default config, else its rule."""

    def build_rule(self, task: Task, name: str, target: Target) -> Function:
        """The rule kernel of a task the selection gave no template."""

    def finish_kernel(self, fn: Function, target: Target, task: Task) -> Function:
        """The plan's last word on a built (fused) kernel."""

    def kernel_facts(self, fn: Function, target: Target, task: Task) -> dict:
        """What the manifest says of a launch besides its choice (parallel tasks, grid,
        the cost model's estimate...)."""
