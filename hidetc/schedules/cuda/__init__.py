"""CUDA kernels: one rule or template per op family. `build_kernel(task, name)` returns a
Function with target "cuda" and its launch shape in the attrs `grid` and `block`.

`TEMPLATES` maps the ops that have a schedule template (space / default / build, see
`hidetc.schedules.template`) to it, for the tuner; their `RULES` entry builds the
template's default config. MatMul: the f32 SIMT template (`matmul_simt`), and for
float16 (`--precision f16`) the tensor-core template (`matmul_tc`, sm_80+, f32
accumulation) under the key "MatMul/f16"; `template_for(task)` picks per task."""
from __future__ import annotations

from typing import Any, Callable

from hidetc.compute.injective import COMPUTE
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.cpu.conv_geometry import conv_geometry
from hidetc.schedules.cpu.empty import build_empty, is_empty
from hidetc.schedules.cpu.reduce import REDUCERS
from hidetc.schedules.cpu.scan import ARG_OPS
from hidetc.schedules.cuda import (
    conv_gemm,
    conv_tc,
    depthwise_nhwc,
    injective,
    matmul_simt,
    matmul_tc,
    norm,
    pool,
    reduce,
    scan,
    scatter,
    topk,
)
from hidetc.schedules.task import Task
from hidetc.schedules.template import Target, Template
from hidetc.tir.ir import Function

Builder = Callable[[Task, str], Function]

TEMPLATES: dict[str, Template] = {
    "MatMul": matmul_simt.TEMPLATE,
    "MatMul/f16": matmul_tc.TEMPLATE,
    "ConvNHWC": conv_tc.TEMPLATE,
    "Conv": conv_gemm.TEMPLATE,
    **{op: reduce.TEMPLATE for op in reduce.OPS},
}

RULES: dict[str, Builder] = {
    **{op: injective.build for op in COMPUTE},
    **{op: reduce.build_reduce for op in REDUCERS},
    "Softmax": reduce.build_softmax,
    "LogSoftmax": reduce.build_softmax,
    "LayerNormalization": reduce.build_layernorm,
    "MaxPool": pool.build_pool,
    "AveragePool": pool.build_pool,
    "MaxPoolNHWC": pool.build_pool,
    "AveragePoolNHWC": pool.build_pool,
    "GlobalAveragePool": reduce.build_global_pool,
    "GlobalMaxPool": reduce.build_global_pool,
    "MatMul": lambda task, name: build_matmul(task, name),
    "Conv": conv_gemm.build_conv,
    "ConvNHWC": lambda task, name: build_conv_nhwc(task, name),
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


def template_for(task: Task) -> Template | None:
    """The template serving `task` (None for rule kernels): a MatMul goes to tensor
    cores whenever `matmul_tc.check_task` accepts it (float16), else to SIMT."""
    if task.op == "MatMul":
        try:
            matmul_tc.check_task(task)
        except ValueError:
            return TEMPLATES["MatMul"]
        return TEMPLATES["MatMul/f16"]
    return TEMPLATES.get(task.op)


def build_matmul(task: Task, name: str) -> Function:
    """MatMul's rule: the default config of `template_for(task)`."""
    template = template_for(task)
    if template is TEMPLATES["MatMul"]:
        return matmul_simt.build_matmul(task, name)
    return template.build(task, template.default(task, Target(kind="cuda")), name)


def build_conv_nhwc(task: Task, name: str) -> Function:
    """ConvNHWC's rule: depthwise convs get the channel-vector direct kernel
    (`depthwise_nhwc`), the others the tensor-core template's default config."""
    if depthwise_nhwc.is_depthwise(task):
        return depthwise_nhwc.build_depthwise_nhwc(task, name)
    return conv_tc.build_default(task, name)


def supports(op: str) -> bool:
    return op in RULES


def build_kernel(task: Task, name: str) -> Function:
    rule = RULES.get(task.op)
    if rule is None:
        raise UnsupportedOpError(f"{task.op}: no CUDA kernel for this op")
    if is_empty(task):
        return build_empty(task, name, "cuda")
    return rule(task, name)


def kernel_choice(task: Task) -> tuple[Template | None, Any]:
    """(template, its default config) for a templated task, else (None, None): a rule
    builds the kernel (depthwise Conv and ConvNHWC: the direct kernels, which win
    there). What `build_kernel` builds."""
    if task.op == "Conv" and conv_geometry(task).depthwise:
        return None, None
    if task.op == "ConvNHWC" and depthwise_nhwc.is_depthwise(task):
        return None, None
    template = template_for(task)
    if template is None:
        return None, None
    return template, template.default(task, Target(kind="cuda"))
