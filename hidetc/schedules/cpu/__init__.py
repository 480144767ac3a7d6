"""CPU kernels: one rule or template per op family.

`build_kernel(task, name)` returns the Function for a task; `supports(op)` says whether
an op has a CPU kernel. Ops that never reach code generation (Shape, Constant*, Range,
Identity, Dropout, ...) are folded or removed by the graph passes before this.

`TEMPLATES` maps the ops that have a schedule template (space / default / build, see
`hidetc.schedules.template`) to it, for the tuner; their `RULES` entry builds the
template's default config. A task with an empty output gets an empty kernel
(`empty.build_empty`); float16/bfloat16 tasks are refused cleanly (`check_dtypes`).
"""
from __future__ import annotations

from typing import Any, Callable

from hidetc.compute.injective import COMPUTE
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.cpu import (
    conv,
    empty,
    injective,
    matmul,
    norm,
    pool,
    reduce,
    scan,
    scatter,
)
from hidetc.schedules.task import Task
from hidetc.schedules.template import Target, Template
from hidetc.tir.ir import Function

Builder = Callable[[Task, str], Function]

TEMPLATES: dict[str, Template] = {
    "MatMul": matmul.TEMPLATE,
    "Conv": conv.TEMPLATE,
}

RULES: dict[str, Builder] = {
    **{op: injective.build for op in COMPUTE},
    **{op: reduce.build_reduce for op in reduce.REDUCERS},
    "Softmax": reduce.build_softmax,
    "LogSoftmax": reduce.build_softmax,
    "LayerNormalization": reduce.build_layernorm,
    "MaxPool": pool.build_pool,
    "AveragePool": pool.build_pool,
    "GlobalAveragePool": pool.build_global_pool,
    "GlobalMaxPool": pool.build_global_pool,
    "MatMul": matmul.build_matmul,
    "Conv": conv.build_conv,
    **{op: scan.build_arg for op in scan.ARG_OPS},
    "CumSum": scan.build_cumsum,
    "ScatterND": scatter.build_scatter,
    "ScatterElements": scatter.build_scatter,
    "GroupNormalization": norm.build_norm,
    "MeanVarianceNormalization": norm.build_norm,
}
NO_CPU_DTYPES = ("float16", "bfloat16")   # the C printer has no half-precision arithmetic


def supports(op: str) -> bool:
    return op in RULES


def check_dtypes(task: Task) -> None:
    """Refuse float16/bfloat16 tensors cleanly (UnsupportedOpError): the cpu target has
    no half-precision arithmetic (compile such models for cuda)."""
    for t in (*task.inputs, *task.outputs):
        if t is not None and t.dtype in NO_CPU_DTYPES:
            raise UnsupportedOpError(f"{task.op}: dtype {t.dtype} is not supported on the "
                                     f"cpu target (use --target cuda)")


def build_kernel(task: Task, name: str) -> Function:
    rule = RULES.get(task.op)
    if rule is None:
        raise UnsupportedOpError(f"{task.op}: no CPU kernel for this op")
    check_dtypes(task)
    if empty.is_empty(task):
        return empty.build_empty(task, name, "cpu")
    return rule(task, name)


def kernel_choice(task: Task) -> tuple[Template | None, Any]:
    """(template, its default config) for a templated op, else (None, None): the rule
    builds the kernel. `build_kernel` builds exactly this choice."""
    template = TEMPLATES.get(task.op)
    if template is None:
        return None, None
    return template, template.default(task, Target())
