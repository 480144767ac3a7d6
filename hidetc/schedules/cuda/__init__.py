"""CUDA kernels: one rule per op family (templates with configs come with the templates
issue). `build_kernel(task, name)` returns a Function with target "cuda" and its launch
shape in the attrs `grid` and `block`."""
from __future__ import annotations

from typing import Callable

from hidetc.compute.injective import COMPUTE
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.cpu.reduce import REDUCERS
from hidetc.schedules.cuda import conv, injective, matmul, pool, reduce
from hidetc.schedules.task import Task
from hidetc.tir.ir import Function

Builder = Callable[[Task, str], Function]

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
    "MatMul": matmul.build_matmul,
    "Conv": conv.build_conv,
}


def supports(op: str) -> bool:
    return op in RULES


def build_kernel(task: Task, name: str) -> Function:
    rule = RULES.get(task.op)
    if rule is None:
        raise UnsupportedOpError(f"{task.op}: no CUDA kernel for this op")
    return rule(task, name)
