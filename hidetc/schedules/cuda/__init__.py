"""CUDA kernels: one rule or template per op family. `build_kernel(task, name)` returns a
Function with target "cuda" and its launch shape in the attrs `grid` and `block`.

`TEMPLATES` maps the ops that have a schedule template (space / default / build, see
`hidetc.schedules.template`) to it, for the tuner; their `RULES` entry builds the
template's default config. MatMul: the f32 SIMT template (`matmul_simt`)."""
from __future__ import annotations

from typing import Callable

from hidetc.compute.injective import COMPUTE
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.cpu.reduce import REDUCERS
from hidetc.schedules.cuda import conv, injective, matmul_simt, pool, reduce
from hidetc.schedules.task import Task
from hidetc.schedules.template import Template
from hidetc.tir.ir import Function

Builder = Callable[[Task, str], Function]

TEMPLATES: dict[str, Template] = {
    "MatMul": matmul_simt.TEMPLATE,
}

RULES: dict[str, Builder] = {
    **{op: injective.build for op in COMPUTE},
    **{op: reduce.build_reduce for op in REDUCERS},
    "Softmax": reduce.build_softmax,
    "LogSoftmax": reduce.build_softmax,
    "LayerNormalization": reduce.build_layernorm,
    "MaxPool": pool.build_pool,
    "AveragePool": pool.build_pool,
    "GlobalAveragePool": reduce.build_global_pool,
    "GlobalMaxPool": reduce.build_global_pool,
    "MatMul": matmul_simt.build_matmul,
    "Conv": conv.build_conv,
}


def supports(op: str) -> bool:
    return op in RULES


def build_kernel(task: Task, name: str) -> Function:
    rule = RULES.get(task.op)
    if rule is None:
        raise UnsupportedOpError(f"{task.op}: no CUDA kernel for this op")
    return rule(task, name)
