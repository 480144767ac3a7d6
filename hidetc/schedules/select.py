"""Which schedule an anchor gets: the one selection that tuning and planning both use.

`anchor_template(task, anchor, graph, target)` is the template that schedules `task` on
`target` (None: a rule kernel builds it), in the form the plan runs it: on the cpu a
Conv or MatMul whose weights (the anchor's second input) are a graph constant gets
`prepack.Prepacked(template)`, so the tuner times it with its weights packed per config
and the plan packs them once at compile time (`packed_weights_apply`).
"""
from __future__ import annotations

from typing import Any

from hidetc.compute.task import Task
from hidetc.graph.ir import Graph, Node
from hidetc.schedules import cpu, cuda
from hidetc.schedules.cpu import prepack
from hidetc.target import Target

SCHEDULES = {"cpu": cpu, "cuda": cuda}


def constant_weights(anchor: Node, graph: Graph) -> bool:
    return len(anchor.inputs) > 1 and anchor.inputs[1] in graph.constants


def anchor_template(task: Task, anchor: Node, graph: Graph, target: Target) -> Any:
    template, _ = SCHEDULES[target.kind].kernel_choice(task, target)
    if template is None or target.kind != "cpu" or not constant_weights(anchor, graph):
        return template
    packed = prepack.for_constant_weights(template)
    return packed if packed is not None else template


def packed_weights_apply(template: Any, config: Any, task: Task, anchor: Node,
                         graph: Graph) -> bool:
    """Whether this anchor's kernel reads its weights packed at compile time: the
    template is the Prepacked form, this anchor's weights are a constant, and the
    config's kernel takes them packed (`Prepacked.applies`)."""
    return (isinstance(template, prepack.Prepacked) and constant_weights(anchor, graph)
            and template.applies(task, config))
