"""From an optimized graph to an execution plan: one kernel launch per fusion group
(`hidetc.fusion.partition`; equal groups share one kernel), where every value lives
(graph input, graph output, weights or an arena offset from the static memory plan),
and the kernels' functions.

A group's kernel is its anchor's kernel, built from the anchor's task alone by the
target's template or rule (so one schedule serves every fused variant), with the
prologues and epilogues grafted on (`hidetc.fusion.graft`). A group whose kernel
refuses grafting (GraftError: e.g. it reads its output back) runs unfused, one
launch per node, and `fusion_fallbacks` records why. On the cpu target a Conv
or MatMul whose weights (second input) are a graph constant gets them packed for its
micro-kernel here, once (`_prepacked_weights`: a new constant `<weight>.packed_mr<MR>`
or `.packed_nr<NR>` replaces the original in its launch, so the kernel does not repack
them on every call). Values inside a group are never
materialized: they get no memory. On the cpu target a fused kernel whose epilogue reads
a value at the index it stores (a residual Add) writes its output over that value when
this launch is its last reader (`_in_place`: ONNX Runtime's Sum fusion; one buffer
instead of two, and the output's lines are already in cache). A kernel's scratch
buffers (`hidetc.tir.scratch`: split-K's workspace and arrival counters) get arena
memory too (`_bind_scratch`).

Assumes the graph passes ran: no Shape/Constant*/Identity/Dropout nodes remain and every
parameter input (Reshape's shape, ...) is a constant. Guarantees: launches are in
topological order; a graph output produced by a node is written in place by that
node's kernel; other graph outputs (an input or a constant passed through, or a value
listed twice) are filled by the runtime from `output_sources`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from hidetc.backends.codegen.launcher import Arg, Launch
from hidetc.backends.runtime.memory_plan import MemoryPlan, PlanValue, plan_memory
from hidetc.compute.task import Task, task_flops, task_of
from hidetc.errors import UnsupportedOpError
from hidetc.fusion.graft import FusedKernel, GraftError, graft
from hidetc.fusion.partition import FusionGroup, partition
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.schedules.cpu import prepack
from hidetc.schedules.select import SCHEDULES, anchor_template, packed_weights_apply
from hidetc.target import Target, default_target
from hidetc.tir import scratch
from hidetc.tir.ir import Function
from hidetc.tir.printer import format_function


@dataclass(frozen=True)
class PlanLaunch:
    """One kernel launch of the forward pass: the kernel and where each argument lives
    (`launch`), the anchor node and op it runs for, the graph value each argument holds
    (`values`, in argument order) and its fusion group."""
    launch: Launch
    node: str
    op: str
    values: tuple[str, ...]
    group: FusionGroup

    @property
    def kernel(self) -> str:
        return self.launch.kernel


@dataclass
class ExecutionPlan:
    graph: Graph
    target: str                                    # "cpu" | "cuda"
    machine: Target                                # what the kernels were built for
    functions: dict[str, Function]                 # kernel name -> function
    tasks: dict[str, Task]                         # kernel name -> task
    steps: list[PlanLaunch]                        # the forward pass, in launch order
    weights: dict[str, object]                     # constant name -> array, in file order
    memory: MemoryPlan
    output_sources: list[dict] = field(default_factory=list)
    fusion_fallbacks: list[dict] = field(default_factory=list)
    choices: dict[str, dict] = field(default_factory=dict)   # kernel -> template, config
    in_place: dict[str, str] = field(default_factory=dict)   # output -> value it overwrites
    facts: dict[str, dict] = field(default_factory=dict)     # kernel -> flops + backend facts
    value_bytes: dict[str, int] = field(default_factory=dict)   # arena value -> its size


def kernel_name(key) -> str:
    """`op_<hash>` of a task, or of a group key (see `group_key`): the anchor's op."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
    op = key.op if isinstance(key, Task) else key[[r for r, _, _ in key].index("a")][1].op
    return f"{op.lower()}_{digest}"


def _check_supported(graph: Graph, target: str) -> None:
    missing: dict[str, str] = {}
    for node in graph.nodes:
        if not SCHEDULES[target].supports(node.op):
            missing.setdefault(node.op, node.name)
    if missing:
        listed = ", ".join(f"{op} (node {name!r})" for op, name in missing.items())
        raise UnsupportedOpError(f"no {target} kernel for: {listed}")
    for node in graph.nodes:
        SCHEDULES[target].check_node(node, graph)


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


def _group_kernel(group: FusionGroup, nodes: dict[str, Node], graph: Graph, fn: Function
                  ) -> FusedKernel:
    """The group's kernel from its anchor's kernel `fn`, and its launch arguments."""
    anchor = nodes[group.anchor]
    if not group.fused:
        task = task_of(anchor, graph)
        values = [anchor.inputs[i] for i in task.buffer_inputs] + [o for o in anchor.outputs if o]
        values += [scratch.placeholder(b, kind) for b, kind in scratch.scratch_params(fn)]
        return FusedKernel(fn, tuple(values))
    return graft(fn, anchor, group, graph)


def _kernels(graph: Graph, machine: Target, fuse: bool, dump_dir: str | None = None,
             chosen: Mapping[Task, Any] | None = None,
             packed_weights: dict[str, Any] | None = None):
    """[(group, kernel name, FusedKernel)] in launch order, the anchors' tasks, the
    groups that fell back to smaller ones, and each kernel's template and config.
    Each distinct anchor task is scheduled once (its config chosen without the fused
    neighbours) and that kernel is reused by every group with that anchor: tune once,
    fuse many. `packed_weights` receives the pre-packed constants the kernels read
    (`_prepacked_weights`), by name."""
    target = machine.kind
    schedules = SCHEDULES[target]
    nodes = {n.name: n for n in graph.nodes}
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    anchors: dict[tuple[Task, bool], Function] = {}
    picked: dict[Task, tuple] = {}        # task -> (template, config)
    choices: dict[Task, dict] = {}        # task -> what the manifest says of the choice
    tasks: dict[str, Task] = {}
    kernels: list[tuple[FusionGroup, str, FusedKernel]] = []
    fallbacks: list[dict] = []
    keep: set[str] = set()      # Concats a producer could not write into: kept
    pending = list(partition(graph, fuse, target))
    while pending:
        group = pending.pop(0)
        key = group_key(group, nodes, graph)
        anchor = nodes[group.anchor]
        task = task_of(anchor, graph)
        if task not in picked:
            if chosen and task in chosen:
                picked[task] = chosen[task].template, chosen[task].config
            else:
                template = anchor_template(task, anchor, graph, machine)
                picked[task] = (template, template.default(task, machine) if template
                                else None)
            template, config = picked[task]
            choices[task] = {"template": prepack.base(template).name if template else "rule",
                             "config": repr(config) if template else None}
            if chosen and task in chosen:
                choices[task]["tuning"] = chosen[task].source
        template, config = picked[task]
        packed = _prepacked_weights(task, template, config, anchor, graph,
                                    packed_weights if packed_weights is not None else {})
        if packed is not None:
            key = key + (("prepacked", None, ()),)
        if (task, packed is not None) not in anchors:
            options = {"prepacked": True} if packed is not None else {}
            anchors[task, packed is not None] = (
                prepack.base(template).build(task, config, kernel_name(task), machine,
                                             **options)
                if template else schedules.build_kernel(task, kernel_name(task), machine))
        name = kernel_name(key)
        try:
            fused = _group_kernel(group, nodes, graph,
                                  replace(anchors[task, packed is not None], name=name))
        except GraftError as error:
            fallbacks.append({"anchor": group.anchor, "op": task.op, "reason": str(error),
                              **({"concat": group.into} if group.into else {})})
            if group.into:     # plan again from the start with that Concat as a kernel
                keep.add(group.into)
                pending = list(partition(graph, fuse, target, frozenset(keep)))
                kernels.clear()
                tasks.clear()      # the replay records its own fallbacks again:
                fallbacks[:] = [f for f in fallbacks if "concat" in f]
                continue
            pending[:0] = _smaller(group, position)
            continue
        if packed is not None:   # the anchor's own weights slot (its inputs come first)
            args = list(fused.args)
            args[args.index(anchor.inputs[1])] = packed
            fused = replace(fused, args=tuple(args))
        if dump_dir and group.fused and name not in tasks:
            _dump_graft(dump_dir, name, anchors[task, packed is not None], fused.function)
        tasks[name] = task
        kernels.append((group, name, fused))
    return kernels, tasks, fallbacks, {name: choices[t] for name, t in tasks.items()}


def _prepacked_weights(task: Task, template, config, anchor: Node, graph: Graph,
                       packed_weights: dict[str, Any]) -> str | None:
    """Where the selection packs this anchor's weights at compile time
    (`select.packed_weights_apply`: a cpu Conv or MatMul with constant weights): the
    name of a constant holding them pre-packed for `config` (put in `packed_weights` on
    first use), so the kernel reads its micro-kernel panels from it instead of packing
    them on every call (`hidetc.schedules.cpu.prepack`). None otherwise."""
    if not packed_weights_apply(template, config, task, anchor, graph):
        return None
    weight = anchor.inputs[1]
    name = f"{weight}.packed_{template.module.prepack_tag(task, config)}"
    if name not in packed_weights:
        inputs = [None] * len(anchor.inputs)
        inputs[1] = graph.constants[weight]
        packed_weights[name] = template.prepare_inputs(task, config, inputs)[1]
    return name


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


def plan_graph(graph: Graph, target: Target | str = "cpu", fuse: bool = True,
               dump_dir: str | None = None, choices: Mapping[Task, Any] | None = None
               ) -> ExecutionPlan:
    """The plan of `graph` for `target` (a Target; a kind name means this host's cpu or
    the default GPU, `hidetc.target.default_target`); `fuse=False` gives one launch per
    node; `dump_dir` receives each fused kernel's IR before and after grafting;
    `choices` (from the tuner: task -> Choice with .template, .config, .source) replaces
    the templates' default configs."""
    machine = default_target(target) if isinstance(target, str) else target
    target = machine.kind
    _check_supported(graph, target)
    nodes = {n.name: n for n in graph.nodes}
    packed: dict[str, Any] = {}
    kernels, tasks, fallbacks, kernel_choices = _kernels(graph, machine, fuse, dump_dir,
                                                         choices, packed)
    if packed:   # the pre-packed weights join the constants (the originals may go unused)
        graph = graph.replace(
            constants={**graph.constants, **packed},
            types={**graph.types, **{k: TensorType(str(v.dtype), tuple(v.shape))
                                     for k, v in packed.items()}})
    kernels, scratch_values = _bind_scratch(kernels)
    steps = [(fused.args, written_values(g, nodes)) for g, _, fused in kernels]
    lifetimes = _lifetimes(graph, steps) + scratch_values
    reuse = _in_place(kernels, nodes, graph, lifetimes) \
        if SCHEDULES[target].WRITES_IN_PLACE else {}
    memory = plan_memory(lifetimes, shares=reuse)
    produced = {o for node in graph.nodes for o in node.outputs if o}
    slot_of, sources = _output_sources(graph, produced)
    used_constants = {s["name"] for s in sources if s["kind"] == "constant"}
    functions: dict[str, Function] = {}
    steps = []
    for group, name, fused in kernels:
        if name not in functions:
            functions[name] = SCHEDULES[target].finish_kernel(fused.function, machine,
                                                              tasks[name])
        used_constants.update(v for v in fused.args if v in graph.constants)
        anchor = nodes[group.anchor]
        launch = Launch(name, tuple(_arg(v, graph, memory, slot_of) for v in fused.args))
        steps.append(PlanLaunch(launch, anchor.name, anchor.op, tuple(fused.args), group))
    weights = {name: graph.constants[name] for name in graph.constants if name in used_constants}
    facts = {name: {"flops": task_flops(tasks[name]),
                    **SCHEDULES[target].kernel_facts(fn, machine, tasks[name])}
             for name, fn in functions.items()}
    return ExecutionPlan(graph, target, machine, functions, tasks, steps, weights, memory,
                         output_sources=sources, fusion_fallbacks=fallbacks,
                         choices=kernel_choices, in_place=reuse, facts=facts,
                         value_bytes={v.name: int(v.nbytes) for v in lifetimes})


ZEROED_SCRATCH = scratch.ZEROED_REGION


def _bind_scratch(kernels) -> tuple[list, list[PlanValue]]:
    """The kernels with their scratch parameters (`hidetc.tir.scratch`) bound to arena
    values, and those values' lifetimes: a TRANSIENT buffer is a value of its own live
    at its launch only (`<kernel>@<step>.<param>`); every ZEROED buffer is the one
    region `ZEROED_SCRATCH`, as large as the largest, live for the whole pass (zeroed
    by the runtime when it allocates the arena, left zero by each kernel)."""
    out, values, zeroed = [], [], 0
    for step, (group, name, fused) in enumerate(kernels):
        sizes = {b.name: scratch.nbytes(b) for b, _ in scratch.scratch_params(fused.function)}
        args = []
        for value in fused.args:
            parsed = scratch.parse_placeholder(value)
            if parsed is None:
                args.append(value)
            elif parsed[0] == scratch.TRANSIENT:
                args.append(f"{name}@{step}.{parsed[1]}")
                values.append(PlanValue(args[-1], sizes[parsed[1]], step, step))
            else:
                args.append(ZEROED_SCRATCH)
                zeroed = max(zeroed, sizes[parsed[1]])
        out.append((group, name, replace(fused, args=tuple(args))))
    if zeroed:
        values.append(PlanValue(ZEROED_SCRATCH, zeroed, 0, max(len(kernels) - 1, 0)))
    return out, values


def _in_place(kernels, nodes: dict[str, Node], graph: Graph, lifetimes: list[PlanValue]
              ) -> dict[str, str]:
    """{output value: the value whose memory it takes}: per launch, the first of its
    kernel's in-place candidates (`FusedKernel.in_place`: read only right before the
    store of the same element) that is an arena value of the output's dtype and size,
    passed to this launch once and dead after it (read by no later launch), when the
    output is an arena value too (not a graph output, not a Concat's slice)."""
    life = {v.name: v for v in lifetimes}
    reuse: dict[str, str] = {}
    for step, (group, _, fused) in enumerate(kernels):
        written = written_values(group, nodes)
        if group.into or len(written) != 1 or written[0] not in life:
            continue
        out = written[0]
        for value in fused.in_place:
            v = life.get(value)
            if (v is not None and v.last == step and fused.args.count(value) == 1
                    and v.nbytes == life[out].nbytes
                    and graph.types[value].dtype == graph.types[out].dtype):
                reuse[out] = value
                break
    return reuse


def _arg(value: str, graph: Graph, memory: MemoryPlan, slot_of: dict[str, int]) -> Arg:
    if value in slot_of:
        return Arg("output", slot_of[value])
    if value in graph.inputs:
        return Arg("input", graph.inputs.index(value))
    if value in graph.constants:
        return Arg("weights", -1)  # resolved once the weights file is laid out
    return Arg("arena", memory.offsets[value])
