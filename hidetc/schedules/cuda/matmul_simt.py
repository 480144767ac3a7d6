"""CUDA template: batched MatMul on the SIMT cores (fma), numpy semantics (broadcast
batch dims; a 1-D A is a 1 x K matrix, a 1-D B a K x 1 one), float32 (float16 and
bfloat16 storage with float32 accumulation, float64 in float64).

Schedule: the shared SIMT GEMM of `gemm_simt` (block tiles, composed thread mappings,
double-buffered global -> register -> shared pipeline, predicated loads and stores,
block swizzle; see its docstring), with the plain element maps: the batch entry of a
block is unravelled over the broadcast batch shape and each operand indexes it with
its own broadcasting (`a_pre`, `b_pre`); A[row, col], B[row, col] and out[row, col]
are the matrices themselves. A float4 chunk of A needs K % 4 == 0, of B and of the
stores N % 4 == 0 (then every row is 16-byte aligned), and float32 storage.

Space: `gemm_simt.config_space()` (200 configs, independent of the shape), each at the
task's split-K (`gemm_simt.split_for`); default: `gemm_simt.default_config(M, N, K,
batch, SMs)`.

Assumes: buffers 16-byte aligned (hidetc's arena and weights are 64-byte aligned).
Guarantees: correct for every config on every shape; no memory access outside the
operands; half results are the float32 sums rounded once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.graph.ops.common import broadcast
from hidetc.schedules.cuda import split_k
from hidetc.schedules.cuda.gemm_simt import (  # noqa: F401 (re-exports)
    F32,
    FLOAT_DTYPES,
    Element,
    SimtConfig,
    SimtGemm,
    block_factors,
    check_config,
    config_space,
    default_config,
    for_tiles,
    load_factors,
    split_for,
)
from hidetc.schedules.cuda.tc_common import cuda_target
from hidetc.schedules.template import Target
from hidetc.tir.ir import Buffer, Expr, Function, logical_and


class MatMulSimtTemplate:
    name = "cuda.matmul_simt"

    def space(self, task: Task, target: Target) -> Sequence[SimtConfig]:
        """The shape-free configs, each at its split-K for this task (`split_for`)."""
        if task is None:
            return config_space()
        d = matmul_dims(task)
        return [split_for(c, d.m, d.n, d.k, d.nbatch, cuda_target(target).sms)
                for c in config_space()]

    def default(self, task: Task, target: Target) -> SimtConfig:
        d = matmul_dims(task)
        return default_config(d.m, d.n, d.k, d.nbatch, cuda_target(target).sms)

    over_range = staticmethod(split_k.unsplit)   # (the tile count sizes split-K)

    def build(self, task: Task, config: SimtConfig, name: str, target: Target) -> Function:
        return build_matmul_simt(task, config, name)


TEMPLATE = MatMulSimtTemplate()


# shapes -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MatMulDims:
    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    batch: tuple[int, ...]
    m: int
    n: int
    k: int

    @property
    def nbatch(self) -> int:
        return math.prod(self.batch)


def matmul_dims(task: Task) -> MatMulDims:
    a_type, b_type = task.inputs[0], task.inputs[1]
    a_shape = a_type.shape if len(a_type.shape) > 1 else (1,) + a_type.shape
    b_shape = b_type.shape if len(b_type.shape) > 1 else b_type.shape + (1,)
    batch = broadcast("MatMul", [a_shape[:-2], b_shape[:-2]])
    return MatMulDims(a_shape, b_shape, batch, a_shape[-2], b_shape[-1], a_shape[-1])


# the kernel -------------------------------------------------------------------------------
class _MatMulKernel(SimtGemm):
    """The SIMT GEMM over the (broadcast) batch of matrices."""

    def __init__(self, task: Task, cfg: SimtConfig, name: str):
        self.d = d = matmul_dims(task)
        dt = task.outputs[0].dtype
        super().__init__(cfg, name, dt, d.m, d.n, d.k, d.nbatch, what="MatMul")
        self.va = 4 if cfg.vector and dt == F32 and d.k % 4 == 0 else 1
        self.vb = self.vc = 4 if cfg.vector and dt == F32 and d.n % 4 == 0 else 1
        self.a = self.kb.buffer("a", dt, d.a_shape)
        self.b = self.kb.buffer("b", dt, d.b_shape)
        self.out = self.kb.buffer("out", dt, d.batch + (d.m, d.n))

    def batch_origin(self, entry: Expr) -> None:
        d = self.d
        bidx = unravel(entry, d.batch) if d.batch else []
        self.a_pre = tuple(broadcast_index(bidx, d.a_shape[:-2]))
        self.b_pre = tuple(broadcast_index(bidx, d.b_shape[:-2]))
        self.out_pre = tuple(bidx)

    def a_element(self, row: Expr, col: Expr) -> Element:
        return self.a, self.a_pre + (row, col), logical_and(row < self.m, col < self.k)

    def b_element(self, row: Expr, col: Expr) -> Element:
        return self.b, self.b_pre + (row, col), logical_and(row < self.k, col < self.n)

    def c_element(self, row: Expr, col: Expr) -> tuple[Buffer, tuple[Expr, ...]]:
        return self.out, self.out_pre + (row, col)


def build_matmul_simt(task: Task, cfg: SimtConfig, name: str) -> Function:
    """The kernel of `cfg` for `task` (see the module docstring)."""
    if len(task.inputs) != 2 or task.outputs[0].dtype not in FLOAT_DTYPES:
        raise UnsupportedOpError(f"MatMul: SIMT template for float matrices, got "
                                 f"{task.signature()}")
    return _MatMulKernel(task, cfg, name).build()
