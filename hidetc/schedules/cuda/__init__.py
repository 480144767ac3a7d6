"""CUDA kernels: one rule or template per op family. `build_kernel(task, name, target)`
returns a Function with target "cuda" and its launch shape in the attrs `grid` and
`block`, for that CudaTarget.

`TEMPLATES` maps the ops that have a schedule template (space / default / build, see
`hidetc.schedules.template`) to it, for the tuner; `build_kernel` builds their default
config for the target (`kernel_choice`); the rest have a `RULES` entry (depthwise
convolutions too: the direct kernels, which win there). MatMul: the f32 SIMT template
(`matmul_simt`), and for float16 and bfloat16 (`--precision f16` / `bf16`) the
tensor-core template (`matmul_tc`, sm_80+, f32 accumulation) under the key "MatMul/f16",
and for half MatMuls of few rows the GEMV template (`matmul_gemv`,
"MatMul/f16-small-m") where the cost model prefers it; `kernel_choice(task, target)`
picks per task. MatMulInteger (quantized models): the int8 tensor-core template
(`matmul_int8_tc`, sm_80+, int32 accumulation); the integer convolutions have no CUDA
kernel yet."""
from __future__ import annotations

from typing import Any, Callable

from hidetc.compute.injective import COMPUTE
from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.graph.guards import current_hint
from hidetc.schedules.common.conv_geometry import conv_geometry
from hidetc.schedules.common.empty import build_empty, is_empty
from hidetc.schedules.common.scan_lines import ARG_OPS
from hidetc.schedules.cuda import (
    attention,
    conv_gemm,
    conv_tc,
    cost,
    depthwise_nhwc,
    injective,
    matmul_gemv,
    matmul_int8_tc,
    matmul_simt,
    matmul_tc,
    norm,
    pool,
    reduce,
    scan,
    scatter,
    topk,
)
from hidetc.schedules.template import CudaTarget, Template, config_over_range
from hidetc.tir.analysis import at_sizes, launch_blocks
from hidetc.tir.ir import Function

Builder = Callable[[Task, str], Function]

TEMPLATES: dict[str, Template] = {
    "MatMul": matmul_simt.TEMPLATE,
    "MatMul/f16": matmul_tc.TEMPLATE,
    "MatMul/f16-small-m": matmul_gemv.TEMPLATE,
    "MatMulInteger": matmul_int8_tc.TEMPLATE,
    "ConvNHWC": conv_tc.TEMPLATE,
    "Conv": conv_gemm.TEMPLATE,
    **{op: reduce.TEMPLATE for op in reduce.OPS},
}

RULES: dict[str, Builder] = {
    **{op: injective.build for op in COMPUTE},
    "MaxPool": pool.build_pool,
    "AveragePool": pool.build_pool,
    "MaxPoolNHWC": pool.build_pool,
    "AveragePoolNHWC": pool.build_pool,
    "Conv": conv_gemm.build_conv,
    "ConvNHWC": depthwise_nhwc.build_depthwise_nhwc,
    **{op: scan.build_arg for op in ARG_OPS},
    "CumSum": scan.build_cumsum,
    "CumProd": scan.build_cumsum,
    "TopK": topk.build_topk,
    "ScatterND": scatter.build_scatter,
    "ScatterElements": scatter.build_scatter,
    "FusedAttention": attention.build_attention,
    "GroupNormalization": norm.build_norm,
    "InstanceNormalization": norm.build_norm,
    "MeanVarianceNormalization": norm.build_norm,
}


def template_for(task: Task) -> Template | None:
    """The template serving `task` (None for rule kernels): a MatMul goes to tensor
    cores whenever `matmul_tc.check_task` accepts it (float16 or bfloat16), else to
    SIMT."""
    if task.op == "MatMul":
        try:
            matmul_tc.check_task(task)
        except ValueError:
            return TEMPLATES["MatMul"]
        return TEMPLATES["MatMul/f16"]
    return TEMPLATES.get(task.op)


WRITES_IN_PLACE = False    # no in-place outputs on cuda yet (see schedules.cpu)


def supports(op: str) -> bool:
    return op in RULES or op in TEMPLATES


# the cuda templates compute element offsets from blockIdx/threadIdx in int32
INDEX_LIMIT = 2 ** 31 - 1


def check_node(node, graph) -> None:
    """The plan's per-node refusal: a tensor past INDEX_LIMIT elements (the kernels'
    int32 offsets; the cpu target indexes such tensors in int64)."""
    for value in (*node.inputs, *node.outputs):
        if value and graph.types[value].size > INDEX_LIMIT:
            t = graph.types[value]
            raise UnsupportedOpError(
                f"node {node.name!r} ({node.op}): {value!r} has {t.size} elements (shape "
                f"{list(t.shape)}); the cuda kernels index at most {INDEX_LIMIT} "
                f"(int32 offsets): compile for the cpu target, or split the tensor")


def finish_kernel(fn: Function, target: CudaTarget, task: Task) -> Function:
    """The plan's last word on a built kernel: nothing to change on cuda."""
    return fn


def kernel_facts(fn: Function, target: CudaTarget, task: Task) -> dict:
    """The launch shape (`grid`, `block`, `blocks`: the grid's product; a kernel over a
    range of sizes: at the enclosing build's hint) and the cost model's `blocks_per_sm`,
    `waves`, `bytes` and `estimate_us` (`cost.kernel_estimate`, with the registers
    estimated; the build refines them with ptxas's count)."""
    if task.symbolic:       # a dispatch variant's kernel: its facts at the build's hint
        hint = current_hint()
        fn, task = at_sizes(fn, hint), task.at(hint)
    return {"grid": list(fn.attr("grid")), "block": list(fn.attr("block")),
            "blocks": launch_blocks(fn), **cost.kernel_estimate(fn, task, target).facts()}


def build_kernel(task: Task, name: str, target: CudaTarget) -> Function:
    """The kernel of `task` for `target`: `kernel_choice`'s template with its default
    config, else (no template, or an empty task) `build_rule`, which refuses an op
    without a CUDA kernel."""
    template, config = (None, None) if is_empty(task) else kernel_choice(task, target)
    if template is None:
        return build_rule(task, name, target)
    return template.build(task, config, name, target)


def build_rule(task: Task, name: str, target: CudaTarget) -> Function:
    """The rule kernel of a task the selection gave no template (an empty task: an empty
    kernel). Refuses (UnsupportedOpError) an op without a CUDA kernel."""
    if not supports(task.op):
        raise UnsupportedOpError(f"{task.op}: no CUDA kernel for this op")
    if is_empty(task):
        return build_empty(task, name, "cuda")
    return RULES[task.op](task, name)


def anchor_template(task: Task, constant_weights: bool, target: CudaTarget
                    ) -> tuple[Any, Any]:
    """(template, its default config for `target`) the selection gives an anchor task
    ((None, None): a rule builds it): `kernel_choice`'s (weights are read as they are
    on cuda)."""
    return kernel_choice(task, target)


def kernel_choice(task: Task, target: CudaTarget) -> tuple[Template | None, Any]:
    """(template, its default config for `target`) for a templated task, else (None,
    None): a rule builds the kernel (depthwise Conv and ConvNHWC: the direct kernels,
    which win there). A half MatMul of at most `matmul_gemv.SMALL_M` rows takes the
    GEMV template where the cost model estimates its default below the tensor-core
    template's -- and where M is a number, not a range's symbolic size (the GEMV kernel
    is shaped by its rows). What `build_kernel` builds, and what the tuner tunes."""
    if task.op == "Conv" and conv_geometry(task).depthwise:
        return None, None
    if task.op == "ConvNHWC":
        if depthwise_nhwc.is_depthwise(task):
            return None, None
        conv_tc.check_supported(task)
    template = template_for(task)
    if template is None:
        return None, None
    # the GEMV kernel is shaped by its rows (one accumulator set per row): it needs a
    # static M; a config shaped by another size a range leaves open (split-K's tile
    # count) is made valid over the range by its template (`over_range`)
    static_m = template is matmul_tc.TEMPLATE and (
        not task.symbolic or isinstance(matmul_tc.geometry(task).m, int))
    hinted = task.hinted()      # a range's heuristics: at the build's hint sizes
    config = config_over_range(template, task, template.default(hinted, target))
    task = hinted
    if static_m and matmul_gemv.applies(task):
        small = matmul_gemv.TEMPLATE.default(task, target)
        gemv_us = cost.gemv_estimate(matmul_gemv.cost_gemv(task), small, target).estimate_us
        tc_us = cost.gemm_estimate(matmul_tc.cost_gemm(task), config, target).estimate_us
        if gemv_us < tc_us:
            return matmul_gemv.TEMPLATE, small
    return template, config
