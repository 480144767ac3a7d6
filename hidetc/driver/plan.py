"""From a selection (`hidetc.driver.select`) and the tuned configs to an execution plan:
one `LaunchRecord` per fusion group (`hidetc.driver.launch`; equal groups share one
kernel), where every value lives (graph input, graph output, weights or an arena offset
from the static memory plan), and the pre-packed weights.

A group's kernel is its anchor's kernel, built from the anchor's task alone by the
selected template (with the tuned config, else the default) or rule -- so one schedule
serves every fused variant -- with the prologues and epilogues grafted on
(`hidetc.fusion.graft`). A group whose kernel refuses grafting (GraftError: e.g. it
reads its output back) runs unfused, one launch per node, and `fusion_fallbacks`
records why; a producer that cannot write its slice of a Concat makes the selection
run again with that Concat kept as a kernel (the one re-partition there is). A Conv or
MatMul whose template reads its constant weights packed (`packs_weights`: the cpu's
`prepack.Prepacked`) gets them packed here, once: a new constant (`packed_name`)
replaces the original in its launch. Values inside a group are never materialized:
they get no memory. Where the target's kernels write in place (`WRITES_IN_PLACE`), a
fused kernel whose epilogue reads a value at the index it stores (a residual Add)
writes its output over that value when this launch is its last reader (`_in_place`:
ONNX Runtime's Sum fusion). A kernel's scratch buffers (`hidetc.tir.scratch`: split-K's
workspace and arrival counters) get arena memory too (`_bind_scratch`).

Assumes the graph passes ran: no Shape/Constant*/Identity/Dropout nodes remain and every
parameter input (Reshape's shape, ...) is a constant. Guarantees: launches are in
topological order; a graph output produced by a node is written in place by that
node's kernel; other graph outputs (an input or a constant passed through, or a value
listed twice) are filled by the runtime from `output_sources`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional

from hidetc.backends.codegen.launcher import Arg
from hidetc.backends.runtime.memory_plan import MemoryPlan, PlanValue, plan_memory
from hidetc.compute.task import Task, task_flops
from hidetc.driver.launch import (
    ExecutionPlan,
    LaunchRecord,
    group_key,
    kernel_name,
    written_values,
)
from hidetc.driver.select import Selection, WorkItem, select, work_item
from hidetc.errors import UnsupportedOpError
from hidetc.fusion.graft import FusedKernel, GraftError, graft
from hidetc.fusion.partition import FusionGroup
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.graph.symbolic import upper_bound
from hidetc.schedules.template import base_template
from hidetc.target import Target
from hidetc.tir import scratch
from hidetc.tir.builder import size_params
from hidetc.tir.ir import SIZE_PREFIX, Function, Var, is_size_var
from hidetc.tir.printer import format_function

SIZE_VALUE = "@size:"    # a launch argument that is a symbolic size, not a graph value

ZEROED_SCRATCH = scratch.ZEROED_REGION


@dataclass(frozen=True)
class _Built:
    """A group's kernel before memory is planned: its item, name and grafted kernel."""
    item: WorkItem
    name: str
    fused: FusedKernel
    choice: dict


def _check_supported(graph: Graph, schedules, machine: Target) -> None:
    missing: dict[str, str] = {}
    for node in graph.nodes:
        if not schedules.supports(node.op):
            missing.setdefault(node.op, node.name)
    if missing:
        listed = ", ".join(f"{op} (node {name!r})" for op, name in missing.items())
        raise UnsupportedOpError(f"no {machine.kind} kernel for: {listed}")
    for node in graph.nodes:
        schedules.check_node(node, graph)


def _lifetimes(graph: Graph, steps: list[tuple[tuple[str, ...], tuple[str, ...]]]
               ) -> list[PlanValue]:
    """steps: per launch, (values read, values written)."""
    outputs, first, last = set(graph.outputs), {}, {}
    for step, (reads, writes) in enumerate(steps):
        for value in reads:
            if value in first:
                last[value] = step
        for value in writes:      # a Concat's output has a writer per input: the first
            if value and value not in outputs:
                first.setdefault(value, step)
                last[value] = step
    return [PlanValue(v, upper_bound(graph.types[v].nbytes), first[v], last[v])
            for v in first]   # (symbolic sizes: planned at their largest, offsets fixed)


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


def _group_kernel(item: WorkItem, graph: Graph, fn: Function) -> FusedKernel:
    """The item's group's kernel from its anchor's kernel `fn`, and its launch
    arguments."""
    anchor, group = item.anchor, item.group
    if not group.fused:
        values = [anchor.inputs[i] for i in item.task.buffer_inputs]
        values += [o for o in anchor.outputs if o]
        values += [scratch.placeholder(b, kind) for b, kind in scratch.scratch_params(fn)]
        return FusedKernel(fn, tuple(values))
    return graft(fn, anchor, group, graph)


class _Kernels:
    """The kernels of a selection, built group by group (`build`)."""

    def __init__(self, backend, machine: Target, choices: Mapping[Task, Any],
                 dump_dir: Optional[str]):
        self.backend, self.machine, self.choices = backend, machine, choices
        self.dump_dir = dump_dir
        self.anchors: dict[tuple[Task, bool], Function] = {}
        self.packed: dict[str, Any] = {}        # pre-packed weights, by name
        self.dumped: set[str] = set()

    def config(self, item: WorkItem) -> tuple[Any, Any, dict]:
        """(template, config, what the manifest says of the choice) of an item."""
        chosen = self.choices.get(item.task)
        template, config = ((chosen.template, chosen.config) if chosen is not None
                            else (item.template, item.default))
        choice = {"template": base_template(template).name if template else "rule",
                  "config": repr(config) if template else None}
        if chosen is not None:
            choice["tuning"] = chosen.source
        return template, config, choice

    def packed_weights(self, item: WorkItem, template, config, graph: Graph) -> str | None:
        """The constant holding the anchor's weights packed for `config`, when its kernel
        reads them so (made on first use); None otherwise."""
        packs = getattr(template, "packs_weights", None)
        if not item.constant_weights or packs is None or not packs(item.task, config):
            return None
        weight = item.anchor.inputs[1]
        name = template.packed_name(weight, item.task, config)
        if name not in self.packed:
            inputs = [None] * len(item.anchor.inputs)
            inputs[1] = graph.constants[weight]
            self.packed[name] = template.prepare_inputs(item.task, config, inputs)[1]
        return name

    def anchor(self, item: WorkItem, template, config, packed: bool) -> Function:
        """The anchor task's kernel, built once per (task, weights packed or not)."""
        key = (item.task, packed)
        if key not in self.anchors:
            name = kernel_name(item.task)
            self.anchors[key] = (
                base_template(template).build(
                    item.task, config, name, self.machine,
                    **({"prepacked": True} if packed else {}))
                if template else self.backend.schedules.build_rule(item.task, name,
                                                                   self.machine))
        return self.anchors[key]

    def build(self, item: WorkItem, graph: Graph, nodes: dict[str, Node]) -> _Built:
        """The group's grafted kernel (GraftError when it refuses)."""
        template, config, choice = self.config(item)
        packed = self.packed_weights(item, template, config, graph)
        key = group_key(item.group, nodes, graph)
        if packed is not None:
            key = key + (("prepacked", None, ()),)
        name = kernel_name(key)
        fn = self.anchor(item, template, config, packed is not None)
        fused = _group_kernel(item, graph, replace(fn, name=name))
        if packed is not None:   # the anchor's own weights slot (its inputs come first)
            args = list(fused.args)
            args[args.index(item.anchor.inputs[1])] = packed
            fused = replace(fused, args=tuple(args))
        if self.dump_dir and item.group.fused and name not in self.dumped:
            self.dumped.add(name)
            _dump_graft(self.dump_dir, name, fn, fused.function)
        return _Built(item, name, fused, choice)


def _kernels(selection: Selection, kernels: _Kernels, backend, machine: Target
             ) -> tuple[list[_Built], list[dict]]:
    """Every group's kernel in launch order, and the groups that fell back to smaller
    ones. Each distinct anchor task is scheduled once (its config chosen without the
    fused neighbours) and that kernel is reused by every group with that anchor: tune
    once, fuse many."""
    graph = selection.graph
    nodes = {n.name: n for n in graph.nodes}
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    decided = dict(selection.decided)
    built: list[_Built] = []
    fallbacks: list[dict] = []
    pending = list(selection.items)
    while pending:
        item = pending.pop(0)
        try:
            built.append(kernels.build(item, graph, nodes))
        except GraftError as error:
            fallbacks.append({"anchor": item.group.anchor, "op": item.task.op,
                              "reason": str(error),
                              **({"concat": item.group.into} if item.group.into else {})})
            if item.group.into:     # select again with that Concat as a kernel
                selection = select(graph, backend, machine, selection.fuse,
                                   selection.keep | {item.group.into}, decided)
                pending = list(selection.items)
                built.clear()       # the replay records its own fallbacks again
                fallbacks[:] = [f for f in fallbacks if "concat" in f]
                continue
            pending[:0] = [work_item(g, graph, nodes, backend, machine, decided)
                           for g in _smaller(item.group, position)]
    return built, fallbacks


def _dump_graft(dump_dir: str, name: str, before: Function, after: Function) -> None:
    """HIDETC_DUMP: the anchor's kernel before and after grafting (unlowered IR)."""
    folder = Path(dump_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.0_anchor.txt").write_text(format_function(before))
    (folder / f"{name}.1_grafted.txt").write_text(format_function(after))


def _smaller(group: FusionGroup, position: dict[str, int]) -> list[FusionGroup]:
    """What to try after `group` failed to graft: without its epilogues (their nodes
    run alone), else every member alone."""
    if group.epilogues and group.prologues:
        return [FusionGroup(group.anchor, group.prologues)] + \
            [FusionGroup(m, kind="single") for m in group.epilogues]
    singles = sorted(group.members, key=position.__getitem__)
    return [FusionGroup(m, kind="single") for m in singles]


def plan(selection: Selection, backend, machine: Target,
         choices: Optional[Mapping[Task, Any]] = None, dump_dir: Optional[str] = None
         ) -> ExecutionPlan:
    """The plan of a selection on `backend` for `machine`: each templated task with its
    config in `choices` (task -> Choice with .template, .config, .source: the tuner's),
    else its default; `dump_dir` receives each fused kernel's IR before and after
    grafting."""
    schedules = backend.schedules
    graph = selection.graph
    _check_supported(graph, schedules, machine)
    nodes = {n.name: n for n in graph.nodes}
    kernels = _Kernels(backend, machine, choices or {}, dump_dir)
    built, fallbacks = _kernels(selection, kernels, backend, machine)
    if kernels.packed:   # the pre-packed weights join the constants (originals may go unused)
        graph = graph.replace(
            constants={**graph.constants, **kernels.packed},
            types={**graph.types, **{k: TensorType(str(v.dtype), tuple(v.shape))
                                     for k, v in kernels.packed.items()}})
    built, scratch_values = _bind_scratch(built)
    steps = [(b.fused.args, written_values(b.item.group, nodes)) for b in built]
    lifetimes = _lifetimes(graph, steps) + scratch_values
    reuse = _in_place(built, nodes, graph, lifetimes) if schedules.WRITES_IN_PLACE else {}
    memory = plan_memory(lifetimes, shares=reuse)
    produced = {o for node in graph.nodes for o in node.outputs if o}
    slot_of, sources = _output_sources(graph, produced)
    used_constants = {s["name"] for s in sources if s["kind"] == "constant"}
    finished: dict[str, tuple[Function, dict]] = {}
    launches = []
    for b in built:
        task = b.item.task
        if b.name not in finished:
            fn = with_size_params(schedules.finish_kernel(b.fused.function, machine, task))
            finished[b.name] = (fn, {"flops": task_flops(task),
                                     **schedules.kernel_facts(fn, machine, task)})
        fn, facts = finished[b.name]
        used_constants.update(v for v in b.fused.args if v in graph.constants)
        anchor = b.item.anchor
        sizes = [size_value(p.name) for p in fn.params if isinstance(p, Var) and is_size_var(p)]
        cut = len(b.fused.args) - len(fn.attr("scratch", ()))
        values = tuple(b.fused.args[:cut]) + tuple(sizes) + tuple(b.fused.args[cut:])
        args = tuple(_arg(v, graph, memory, slot_of) for v in values)
        launches.append(LaunchRecord(b.name, fn, task, b.item.group, anchor.name, anchor.op,
                                     values, args,
                                     written_values(b.item.group, nodes), b.choice, facts))
    weights = {name: graph.constants[name] for name in graph.constants if name in used_constants}
    return ExecutionPlan(graph, machine, tuple(launches), weights, memory,
                         output_sources=sources, fusion_fallbacks=fallbacks, in_place=reuse,
                         value_bytes={v.name: int(v.nbytes) for v in lifetimes})


def _bind_scratch(built: list[_Built]) -> tuple[list[_Built], list[PlanValue]]:
    """The kernels with their scratch parameters (`hidetc.tir.scratch`) bound to arena
    values, and those values' lifetimes: a TRANSIENT buffer is a value of its own live
    at its launch only (`<kernel>@<step>.<param>`); every ZEROED buffer is the one
    region `ZEROED_SCRATCH`, as large as the largest, live for the whole pass (zeroed
    by the runtime when it allocates the arena, left zero by each kernel)."""
    out, values, zeroed = [], [], 0
    for step, b in enumerate(built):
        fused = b.fused
        sizes = {buf.name: scratch.nbytes(buf) for buf, _ in scratch.scratch_params(fused.function)}
        args = []
        for value in fused.args:
            parsed = scratch.parse_placeholder(value)
            if parsed is None:
                args.append(value)
            elif parsed[0] == scratch.TRANSIENT:
                args.append(f"{b.name}@{step}.{parsed[1]}")
                values.append(PlanValue(args[-1], sizes[parsed[1]], step, step))
            else:
                args.append(ZEROED_SCRATCH)
                zeroed = max(zeroed, sizes[parsed[1]])
        out.append(replace(b, fused=replace(fused, args=tuple(args))))
    if zeroed:
        values.append(PlanValue(ZEROED_SCRATCH, zeroed, 0, max(len(built) - 1, 0)))
    return out, values


def _in_place(built: list[_Built], nodes: dict[str, Node], graph: Graph,
              lifetimes: list[PlanValue]) -> dict[str, str]:
    """{output value: the value whose memory it takes}: per launch, the first of its
    kernel's in-place candidates (`FusedKernel.in_place`: read only right before the
    store of the same element) that is an arena value of the output's dtype and size,
    passed to this launch once and dead after it (read by no later launch), when the
    output is an arena value too (not a graph output, not a Concat's slice)."""
    life = {v.name: v for v in lifetimes}
    reuse: dict[str, str] = {}
    for step, b in enumerate(built):
        group, fused = b.item.group, b.fused
        written = written_values(group, nodes)
        if group.into or len(written) != 1 or written[0] not in life:
            continue
        out = written[0]
        for value in fused.in_place:
            v = life.get(value)
            if (v is not None and v.last == step and fused.args.count(value) == 1
                    and graph.types[value].nbytes == graph.types[out].nbytes
                    and graph.types[value].dtype == graph.types[out].dtype):
                reuse[out] = value
                break
    return reuse


def with_size_params(fn: Function) -> Function:
    """`fn` with the symbolic sizes it uses as parameters after its buffers and before
    its scratch buffers (which stay last), sorted by name."""
    kept = tuple(p for p in fn.params if not (isinstance(p, Var) and is_size_var(p)))
    bare = replace(fn, params=kept)
    cut = len(kept) - len(fn.attr("scratch", ()))        # (scratch buffers stay last)
    return replace(fn, params=kept[:cut] + size_params(bare) + kept[cut:])


def size_value(param: str) -> str:
    """The launch-argument name of a size parameter (`sym_seq` -> `@size:seq`)."""
    return SIZE_VALUE + param[len(SIZE_PREFIX):]


def _arg(value: str, graph: Graph, memory: MemoryPlan, slot_of: dict[str, int]) -> Arg:
    if value.startswith(SIZE_VALUE):    # a symbolic size: its place in the sizes array
        return Arg("size", sorted(graph.symbols).index(value[len(SIZE_VALUE):]))
    if value in slot_of:
        return Arg("output", slot_of[value])
    if value in graph.inputs:
        return Arg("input", graph.inputs.index(value))
    if value in graph.constants:
        return Arg("weights", -1)  # resolved once the weights file is laid out
    return Arg("arena", memory.offsets[value])
