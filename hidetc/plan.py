"""From an optimized graph to an execution plan: one kernel launch per node (equal tasks
share one kernel), where every value lives (graph input, graph output, weights or an
arena offset from the static memory plan), and the kernels' functions.

Assumes the graph passes ran: no Shape/Constant*/Identity/Dropout nodes remain and every
parameter input (Reshape's shape, ...) is a constant. Guarantees: launches are in
topological order; a graph output produced by a node is written in place by that
node's kernel; other graph outputs (an input or a constant passed through, or a value
listed twice) are filled by the runtime from `output_sources`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from hidetc.codegen.launcher import Arg, Launch
from hidetc.errors import UnsupportedOpError
from hidetc.graph.ir import Graph
from hidetc.runtime.memory_plan import MemoryPlan, PlanValue, plan_memory
from hidetc.schedules import cpu, cuda
from hidetc.schedules.task import Task, task_of
from hidetc.tir.ir import Function


@dataclass
class ExecutionPlan:
    graph: Graph
    target: str                                    # "cpu" | "cuda"
    functions: dict[str, Function]                 # kernel name -> function
    tasks: dict[str, Task]                         # kernel name -> task
    launches: list[Launch]
    nodes: list[tuple[str, str, str]]              # per launch: (kernel, node name, op)
    launch_values: list[tuple[str, ...]]           # per launch: value name of each arg
    weights: dict[str, object]                     # constant name -> array, in file order
    memory: MemoryPlan
    output_sources: list[dict] = field(default_factory=list)


SCHEDULES = {"cpu": cpu, "cuda": cuda}


def kernel_name(task: Task) -> str:
    digest = hashlib.sha256(repr(task).encode()).hexdigest()[:12]
    return f"{task.op.lower()}_{digest}"


def _check_supported(graph: Graph, target: str) -> None:
    missing: dict[str, str] = {}
    for node in graph.nodes:
        if not SCHEDULES[target].supports(node.op):
            missing.setdefault(node.op, node.name)
    if missing:
        listed = ", ".join(f"{op} (node {name!r})" for op, name in missing.items())
        raise UnsupportedOpError(f"no {target} kernel for: {listed}")


def _lifetimes(graph: Graph) -> list[PlanValue]:
    outputs, first, last = set(graph.outputs), {}, {}
    for step, node in enumerate(graph.nodes):
        for value in node.inputs:
            if value in first:
                last[value] = step
        for value in node.outputs:
            if value and value not in outputs:
                first[value] = last[value] = step
    return [PlanValue(v, graph.types[v].nbytes, first[v], last[v]) for v in first]


def _output_sources(graph: Graph, produced: set[str]) -> tuple[dict[str, int], list[dict]]:
    """Which output slot each node writes, and how the runtime fills the others."""
    slot_of: dict[str, int] = {}
    sources = []
    for k, value in enumerate(graph.outputs):
        if value in produced and value not in slot_of:
            slot_of[value] = k
            sources.append({"kind": "kernel"})
        elif value in slot_of:
            sources.append({"kind": "output", "index": slot_of[value]})
        elif value in graph.inputs:
            sources.append({"kind": "input", "index": graph.inputs.index(value)})
        else:
            sources.append({"kind": "constant", "name": value})
    return slot_of, sources


def plan_graph(graph: Graph, target: str = "cpu") -> ExecutionPlan:
    _check_supported(graph, target)
    schedules = SCHEDULES[target]
    memory = plan_memory(_lifetimes(graph))
    produced = {o for node in graph.nodes for o in node.outputs if o}
    slot_of, sources = _output_sources(graph, produced)
    used_constants = {s["name"] for s in sources if s["kind"] == "constant"}
    functions, tasks, launches, nodes, values = {}, {}, [], [], []
    for node in graph.nodes:
        task = task_of(node, graph)
        name = kernel_name(task)
        if name not in functions:
            functions[name] = schedules.build_kernel(task, name)
            tasks[name] = task
        arg_values = [node.inputs[i] for i in task.buffer_inputs]
        arg_values += [o for o in node.outputs if o]
        used_constants.update(v for v in arg_values if v in graph.constants)
        launches.append(Launch(name, tuple(_arg(v, graph, memory, slot_of)
                                           for v in arg_values)))
        nodes.append((name, node.name, node.op))
        values.append(tuple(arg_values))
    weights = {name: graph.constants[name] for name in graph.constants if name in used_constants}
    return ExecutionPlan(graph, target, functions, tasks, launches, nodes, values, weights,
                         memory, sources)


def _arg(value: str, graph: Graph, memory: MemoryPlan, slot_of: dict[str, int]) -> Arg:
    if value in slot_of:
        return Arg("output", slot_of[value])
    if value in graph.inputs:
        return Arg("input", graph.inputs.index(value))
    if value in graph.constants:
        return Arg("weights", -1)  # resolved once the weights file is laid out
    return Arg("arena", memory.offsets[value])
