"""CPU kernels: one rule or template per op family.

`build_kernel(task, name, target)` returns the Function for a task on that CpuTarget;
`supports(op)` says whether an op has a CPU kernel. Ops that never reach code
generation (Shape, Constant*, Range, Identity, Dropout, ...) are folded or removed by
the graph passes before this.

`TEMPLATES` maps the ops that have a schedule template (space / default / build, see
`hidetc.schedules.template`) to it, for the tuner (`BF16_TEMPLATES`: the templates of
anchors marked compute="bfloat16" by `--precision bf16`); `build_kernel` builds their default
config for the target; the other ops have a `RULES` entry. A task with an empty output
gets an empty kernel (`hidetc.schedules.common.empty.build_empty`).

float16/bfloat16: the C printer computes each operation in float and rounds it to the
half type (numpy's semantics), so the rules work on them as on float32. The templated
kernels (MatMul, Conv: AVX2 float32 micro-kernels) never see them: the cpu-only graph
pass `hidetc.graph.passes.widen_half_cpu` computes them in float32 between Casts; a
half-typed task for them that gets here anyway is refused cleanly (`check_dtypes`).
The narrow types (`hidetc.compute.narrow_types`) are moved and converted only: a task
with one is refused unless its op is a data-movement or Cast rule (`NARROW_OK`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterable

from hidetc.compute.injective import COMPUTE
from hidetc.compute.narrow_types import NARROW_DTYPES
from hidetc.compute.task import Task, task_flops
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.common import empty, norm
from hidetc.schedules.common.reducers import REDUCERS
from hidetc.schedules.common.scan_lines import ARG_OPS
from hidetc.schedules.cpu import (
    conv,
    conv_bf16,
    conv_int8,
    injective,
    matmul,
    matmul_bf16,
    matmul_int8,
    matmul_integer,
    pool,
    prepack,
    reduce,
    scan,
    scatter,
    topk,
)
from hidetc.schedules.template import CpuTarget, Template
from hidetc.tir.analysis import parallel_tasks
from hidetc.tir.ir import Function

Builder = Callable[[Task, str], Function]

TEMPLATES: dict[str, Template] = {
    "MatMul": matmul.TEMPLATE,
    "Conv": conv.TEMPLATE,
    "ConvNHWC": conv.TEMPLATE,
    # the integer anchors (quantized models): int8 operands, int32 out
    "MatMulInteger": matmul_int8.TEMPLATE,
    "ConvInteger": conv_int8.TEMPLATE,
    "ConvIntegerNHWC": conv_int8.TEMPLATE,
}

INTEGER_ANCHORS = frozenset(("MatMulInteger", "ConvInteger", "ConvIntegerNHWC"))

# the templates of anchors marked compute="bfloat16" (`graph.passes.compute_bf16`:
# --precision bf16), f32 tensors with bf16 products
BF16_TEMPLATES: dict[str, Template] = {
    "MatMul": matmul_bf16.TEMPLATE,
    "Conv": conv_bf16.TEMPLATE,
    "ConvNHWC": conv_bf16.TEMPLATE,
}

RULES: dict[str, Builder] = {
    **{op: injective.build for op in COMPUTE},
    **{op: reduce.build_reduce for op in REDUCERS},
    "Softmax": reduce.build_softmax,
    "LogSoftmax": reduce.build_softmax,
    "LayerNormalization": reduce.build_layernorm,
    "MaxPool": pool.build_pool,
    "AveragePool": pool.build_pool,
    "MaxPoolNHWC": pool.build_pool_nhwc,
    "AveragePoolNHWC": pool.build_pool_nhwc,
    "GlobalAveragePool": pool.build_global_pool,
    "GlobalMaxPool": pool.build_global_pool,
    **{op: scan.build_arg for op in ARG_OPS},
    "CumSum": scan.build_cumsum,
    "CumProd": scan.build_cumsum,
    "TopK": topk.build_topk,
    "ScatterND": scatter.build_scatter,
    "ScatterElements": scatter.build_scatter,
    "GroupNormalization": norm.build_norm,
    "InstanceNormalization": norm.build_norm,
    "MeanVarianceNormalization": norm.build_norm,
}
HALF_DTYPES = ("float16", "bfloat16")
FLOAT32_ONLY = frozenset(TEMPLATES)      # ops whose kernels are float32-only templates
# ops whose CPU kernels only move (or Cast) elements: the ones narrow types may enter
NARROW_OK = frozenset(("Cast", "BitCast", "Reshape", "Transpose", "Identity", "Concat",
                       "Slice", "Gather", "Expand", "Squeeze", "Unsqueeze", "Flatten", "Tile",
                       "Pad", "Where", "Split", "DepthToSpace", "SpaceToDepth",
                       "GatherElements", "GatherND", "ReverseSequence"))


# A fused kernel whose epilogue reads a value at the index it stores may write its
# output over that value (`plan._in_place`): the C kernels store each element once,
# after their last read of it.
WRITES_IN_PLACE = True


def supports(op: str) -> bool:
    return op in RULES or op in TEMPLATES


def check_node(node, graph) -> None:
    """The plan's per-node refusal (fused members never reach the dtype check
    `kernel_choice` and `build_rule` make on an anchor's task): `check_op_dtypes` on
    the node's values."""
    check_op_dtypes(node.op, (graph.types[v].dtype for v in (*node.inputs, *node.outputs)
                              if v), f"node {node.name!r}")


# A parallel region's fork and join cost about what this much work does on one core
# (flops, or floats moved for the memory-bound kernels): launches below it run their
# parallel loops on the calling thread (measured on tiny models:
# bench/results/2026-12-06-exported-models.md)
SERIAL_WORK = 1 << 16


def finish_kernel(fn: Function, target: CpuTarget, task: Task) -> Function:
    """The plan's last word on a built (fused) kernel: one whose anchor does less than
    SERIAL_WORK (its flops or the floats it reads and writes, whichever is more) is
    marked ("serial", True) -- the C printer then prints its parallel loops as plain
    loops, so the launch pays no fork and join. Single-core targets need no mark (one
    thread forks nothing)."""
    task = task.hinted()              # (symbolic sizes: decided at the build's hint)
    moved = sum(t.size for t in (*task.inputs, *task.outputs) if t is not None)
    if target.cores > 1 and max(task_flops(task), moved) < SERIAL_WORK:
        return replace(fn, attrs=tuple(sorted({**dict(fn.attrs), "serial": True}.items())))
    return fn


def kernel_facts(fn: Function, target: CpuTarget, task: Task) -> dict:
    """`parallel_tasks` (the main parallel loop's task count) and the `cores` the task
    shapes were built for."""
    return {"parallel_tasks": parallel_tasks(fn), "cores": target.cores}


def check_op_dtypes(op: str, dtypes: Iterable[str], where: str = "") -> None:
    """Refuse cleanly (UnsupportedOpError) float16/bfloat16 tensors of the float32-only
    templates and narrow-typed tensors of ops that would compute on them. `hidetc.driver.plan`
    runs it on every node (`check_node`: fused members never reach `check_dtypes`);
    `where` names the node in the message."""
    label = f"{where} ({op})" if where else op
    for dtype in dtypes:
        if dtype in HALF_DTYPES and op in FLOAT32_ONLY:
            raise UnsupportedOpError(f"{label}: dtype {dtype} is not supported by the cpu "
                                     f"{op} kernel (float32 only)")
        if dtype in NARROW_DTYPES and op not in NARROW_OK:
            raise UnsupportedOpError(f"{label}: dtype {dtype} is only supported by Cast and "
                                     f"data-movement ops on the cpu target")


def check_dtypes(task: Task) -> None:
    check_op_dtypes(task.op, (t.dtype for t in (*task.inputs, *task.outputs) if t is not None))


def build_kernel(task: Task, name: str, target: CpuTarget) -> Function:
    """The kernel of `task` for `target`: `kernel_choice`'s template with its default
    config, else (no template, or an empty task) `build_rule`, which refuses what this
    target cannot run."""
    template, config = (None, None) if empty.is_empty(task) else kernel_choice(task, target)
    if template is None:
        return build_rule(task, name, target)
    return template.build(task, config, name, target)


def build_rule(task: Task, name: str, target: CpuTarget) -> Function:
    """The rule kernel of a task the selection gave no template (an empty task: an empty
    kernel). Refuses (UnsupportedOpError) an op without a CPU kernel and the dtypes
    `check_dtypes` refuses."""
    if not supports(task.op):
        raise UnsupportedOpError(f"{task.op}: no CPU kernel for this op")
    check_dtypes(task)
    if empty.is_empty(task):
        return empty.build_empty(task, name, "cpu")
    if matmul_integer.is_integer_matmul(task):
        return matmul_integer.build_integer_matmul(task, name)
    return RULES[task.op](task, name)


def anchor_template(task: Task, constant_weights: bool, target: CpuTarget
                    ) -> tuple[Any, Any]:
    """(template, its default config for `target`) the selection gives an anchor task
    ((None, None): a rule builds it): `kernel_choice`'s, the template in its prepacked
    form (`prepack.Prepacked`: the weights packed once at compile time, the candidates
    timed so) when the anchor's weights are a graph constant and the template has that
    form -- the default is the same either way (the wrapper's is its base's)."""
    template, default = kernel_choice(task, target)
    if template is None or not constant_weights:
        return template, default
    packed = prepack.for_constant_weights(template)
    return (packed if packed is not None else template), default


def kernel_choice(task: Task, target: CpuTarget) -> tuple[Template | None, Any]:
    """(template, its default config for `target`) for a templated op, else (None,
    None): the rule builds the kernel. `build_kernel` builds exactly this choice. An
    anchor marked compute="bfloat16" takes its `BF16_TEMPLATES` template."""
    bf16 = task.attr("compute") == "bfloat16"
    template = (BF16_TEMPLATES if bf16 else TEMPLATES).get(task.op)
    if template is None or matmul_integer.is_integer_matmul(task):
        return None, None
    check_dtypes(task)
    return template, template.default(task.hinted(), target)
