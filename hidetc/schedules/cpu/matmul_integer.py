"""CPU rule for MatMul on integers (int32, int64, uint32, uint64, and the narrower
ones numpy takes; numpy semantics:
batched, broadcast batch dims, 1-D operands), exact as ONNX defines it: products and
sums wrap around modulo 2^bits, as ONNX Runtime's kernels do.

Schedule: the output rows of every batch run in parallel (OpenMP), each row's columns
in order, each element one dot product over K in a local accumulator. The arithmetic is
done in the unsigned type of the same width (C leaves a signed overflow undefined, the
unsigned one wraps) and the sum converted back (two's complement, as gcc defines it).
This is the correct path, not a fast one: the float GEMM templates (`matmul`) serve
the float models; integer MatMuls are rare outside index arithmetic and quantized
models, which have their own ops (MatMulInteger).

Guarantees: every output element stored once, no out-of-bounds access, any shape
(K = 0 gives zeros).
"""
from __future__ import annotations

import math

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.compute.task import Task
from hidetc.schedules.cpu.matmul import matmul_shapes
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function, cast
from hidetc.tir.mapping import spatial

# the unsigned type each integer type computes in: wrapping modulo 2^32 or 2^64 and
# converting back keeps the result modulo 2^bits of the type (8- and 16-bit MatMuls are
# not ONNX's, but numpy's: the reference interpreter computes them so)
WRAPPING = {"int32": "uint32", "int64": "uint64", "uint32": "uint32", "uint64": "uint64",
            "int8": "uint32", "uint8": "uint32", "int16": "uint32", "uint16": "uint32"}


def is_integer_matmul(task: Task) -> bool:
    return task.op == "MatMul" and task.outputs[0].dtype in WRAPPING


def build_integer_matmul(task: Task, name: str) -> Function:
    a_shape, b_shape, batch, m, n, k = matmul_shapes(task)
    dt = task.outputs[0].dtype
    wide = WRAPPING[dt]
    kb = KernelBuilder(name, "cpu")
    a = kb.buffer("a", dt, a_shape)
    b = kb.buffer("b", dt, b_shape)
    out = kb.buffer("out", dt, batch + (m, n))
    rows = (math.prod(batch), m)
    if math.prod(rows) * n == 0:
        return kb.finish()
    with kb.for_range(math.prod(rows), kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(*rows), p, names=["bt", "i"]) as (bt, i):
            bidx = unravel(bt, batch)
            a_pre = tuple(broadcast_index(bidx, a_shape[:-2]))
            b_pre = tuple(broadcast_index(bidx, b_shape[:-2]))
            with kb.for_range(n, name="j") as j:
                acc = kb.declare("acc", wide, cast(0, wide))
                with kb.for_range(k, name="kk") as kk:
                    kb.assign(acc, acc + cast(a[a_pre + (i, kk)], wide)
                              * cast(b[b_pre + (kk, j)], wide))
                kb.store(out, tuple(bidx) + (i, j), cast(acc, dt))
    return kb.finish()
