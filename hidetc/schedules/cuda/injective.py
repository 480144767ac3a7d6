"""The CUDA rule for injective and elementwise ops: one thread per output element.

Schedule: 256-thread blocks, the global thread index `w = blockIdx.x * 256 +
threadIdx.x` is the worker of `spatial(*out_shape)`, whose lowering guards
`w < size`: the tail is predicated, so any shape works.

float16 and bfloat16 storage (`--precision f16` / `bf16`): every half load is
converted to float32, the op's definition computes in float32, and the result is
rounded to the output dtype once, at the store. For one +, -, *, / or sqrt that equals
the correctly rounded half operation (float32 has more than twice either's precision);
longer formulas (Sigmoid, Mean, HardSigmoid, ...) are more accurate than half
arithmetic. Casts stay exact: a half -> float32 is exact, and a Cast to a half rounds
once.
"""
from __future__ import annotations

from hidetc.compute.injective import COMPUTE
from hidetc.compute.task import Task
from hidetc.schedules.cuda.common import ceil_div
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Expr, Function, as_expr, block_idx, cast, thread_idx
from hidetc.tir.mapping import spatial

THREADS = 256
# storage dtype -> the dtype the arithmetic runs in
COMPUTE_DTYPE = {"float16": "float32", "bfloat16": "float32"}


def widen(value: Expr) -> Expr:
    """A loaded value in its arithmetic dtype (float16 and bfloat16 -> float32; others
    unchanged)."""
    return cast(value, COMPUTE_DTYPE.get(value.dtype, value.dtype))


def build(task: Task, name: str) -> Function:
    kb = KernelBuilder(name, "cuda")
    buffers = {i: kb.buffer(f"in{i}", task.inputs[i].dtype, task.inputs[i].shape)
               for i in task.buffer_inputs}
    out_type = task.outputs[0]
    out = kb.buffer("out", out_type.dtype, out_type.shape)
    compute = COMPUTE[task.op]

    def load(i: int, idx) -> Expr:
        return widen(buffers[i][tuple(as_expr(x) for x in idx)])

    shape = out_type.shape or (1,)
    worker = block_idx() * THREADS + thread_idx()
    with kb.for_mapping(spatial(*shape), worker) as idx:
        idx = list(idx) if out_type.shape else []
        kb.store(out, tuple(idx), cast(compute(task, idx, load), out.dtype))
    blocks = max(ceil_div(out_type.size, THREADS), 1)
    return kb.finish(grid=(blocks, 1, 1), block=(THREADS, 1, 1))
