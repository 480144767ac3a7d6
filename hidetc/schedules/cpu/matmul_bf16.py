"""CPU template for a MatMul computed in bf16 (`compute="bfloat16"`, set on the graph by
`hidetc.graph.passes.compute_bf16` for `--precision bf16`): numpy's batched, broadcast
MatMul of f32 tensors whose products' operands are rounded to bf16 and summed in f32.

The kernel is `gemm_bf16.emit_bf16_gemm` over the broadcast batch: every A and B
matrix packed once per call (A rows rounded while packed; B in the pair-interleaved
panels), or, for a constant B of one matrix (the weights), B packed at compile time
(`prepack_weights`: bf16 in the artifact, half the f32 bytes), then the (batch, MT, NC)
tasks of block helper calls with the output stored through the epilogue. One packed
layout serves every config (`prepack_tag` "bf16"), so a tuned and a default kernel share
the constant.

Assumes: f32 inputs and output (the pass marks only those) on a target with
AVX512_BF16 (`gemm_bf16.block_call` refuses others). Guarantees: the reference's result
up to the order of the f32 additions, for any shapes (M, N, K >= 0, symbolic M/N).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from hidetc.compute.injective import broadcast_index, linearize, unravel
from hidetc.compute.task import Task
from hidetc.schedules.cpu.gemm_bf16 import (
    Bf16Config,
    Problem,
    bf16_space,
    default_bf16,
    emit_bf16_gemm,
    pack_weights,
    packed_shape,
)
from hidetc.schedules.cpu.matmul import matmul_shapes
from hidetc.schedules.template import CpuTarget
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function

BF16 = "bfloat16"


class MatMulBf16Template:
    name = "cpu.matmul.bf16"
    precisions = ("bf16",)     # the catalog's rows (`hidetc inspect --space`)

    def space(self, task: Task, target: CpuTarget) -> Sequence[Bf16Config]:
        return bf16_space()

    def short_list(self, task: Task, target: CpuTarget) -> Sequence[Bf16Config]:
        return (Bf16Config(128, 256), Bf16Config(64, 64), Bf16Config(256, 128))

    def default(self, task: Task, target: CpuTarget) -> Bf16Config:
        _, _, batch, m, n, k = matmul_shapes(task.hinted())
        return default_bf16(m, n, k, math.prod(batch), target)

    def build(self, task: Task, config: Bf16Config, name: str, target: CpuTarget,
              prepacked: bool = False) -> Function:
        return build_matmul_bf16(task, config, name, target, prepacked)


TEMPLATE = MatMulBf16Template()


def can_prepack(task: Task, config: Bf16Config) -> bool:
    """B one matrix (no batch of them, 2-D or more)."""
    _, b_shape, _, _, _, _ = matmul_shapes(task)
    return len(task.inputs[1].shape) >= 2 and math.prod(b_shape[:-2]) == 1


def prepack_tag(task: Task, config: Bf16Config) -> str:
    return "bf16"


def prepack_weights(task: Task, config: Bf16Config, b: np.ndarray) -> np.ndarray:
    _, _, _, _, n, k = matmul_shapes(task)
    return pack_weights(np.asarray(b, np.float32).reshape(k, n))


def build_matmul_bf16(task: Task, cfg: Bf16Config, name: str, target: CpuTarget,
                      prepacked: bool = False) -> Function:
    a_shape, b_shape, batch, m, n, k = matmul_shapes(task)
    kb = KernelBuilder(name, "cpu")
    a = kb.buffer("a", "float32", a_shape)
    b = kb.buffer("b", BF16 if prepacked else "float32",
                  packed_shape(k, n) if prepacked else b_shape)
    out = kb.buffer("out", "float32", batch + (m, n))
    if math.prod(batch) * m * n == 0:
        return kb.finish()
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]

    def a_value(mat, row, kk):
        return a[tuple(unravel(mat, a_batch)) + (row, kk)]

    def b_value(mat, kk, col):
        return b[tuple(unravel(mat, b_batch)) + (kk, col)]

    problem = Problem(
        batch, m, n, k,
        math.prod(a_batch), lambda bidx: linearize(broadcast_index(bidx, a_batch), a_batch),
        a_value,
        1 if prepacked else math.prod(b_batch),
        lambda bidx: linearize(broadcast_index(bidx, b_batch), b_batch),
        None if prepacked else b_value, b if prepacked else None)
    emit_bf16_gemm(kb, problem, cfg, target,
                   lambda bidx, row, col, v: kb.store(out, bidx + (row, col), v))
    return kb.finish()
