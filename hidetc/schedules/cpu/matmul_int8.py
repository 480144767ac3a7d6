"""CPU template for MatMulInteger (`hidetc.graph.ops.integer`): numpy's batched,
broadcast MatMul of (A - a_zero) and (B - b_zero), uint8 / int8 operands, int32 out.

The kernel is `gemm_int8.emit_int8_gemm` over the broadcast batch: A packed once per
call; B packed at compile time when it is a constant of one matrix (`prepack_weights`:
the weights of a quantized layer, as int8 quads with their column sums), else once per
call (attention's two run-time operands in a QDQ model). The zero points are read at
run time (a dynamically quantized activation's is computed by the graph), b_zero per
tensor or per column. One packed layout serves every config (`prepack_tag` "int8").

Guarantees: the reference's exact integers for any shapes (M, N >= 0, K <= MAX_K,
symbolic M / N), every output stored once.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from hidetc.compute.injective import broadcast_index, linearize, unravel
from hidetc.compute.task import Task
from hidetc.schedules.cpu.gemm_int8 import (
    Int8Config,
    Problem,
    default_int8,
    emit_int8_gemm,
    int8_space,
    pack_weights,
    packed_shape,
)
from hidetc.schedules.cpu.matmul import matmul_shapes
from hidetc.schedules.template import CpuTarget
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function


class MatMulInt8Template:
    name = "cpu.matmul.int8"
    precisions = ("int8",)     # the catalog's rows (`hidetc inspect --space`)

    def space(self, task: Task, target: CpuTarget) -> Sequence[Int8Config]:
        return int8_space()

    def short_list(self, task: Task, target: CpuTarget) -> Sequence[Int8Config]:
        return (Int8Config(128, 256), Int8Config(64, 64), Int8Config(32, 128))

    def default(self, task: Task, target: CpuTarget) -> Int8Config:
        _, _, batch, m, n, _ = matmul_shapes(task.hinted())
        return default_int8(m, n, math.prod(batch), target)

    def build(self, task: Task, config: Int8Config, name: str, target: CpuTarget,
              prepacked: bool = False) -> Function:
        return build_matmul_int8(task, config, name, target, prepacked)


TEMPLATE = MatMulInt8Template()


def can_prepack(task: Task, config: Int8Config) -> bool:
    """B one matrix (no batch of them, 2-D or more)."""
    _, b_shape, _, _, _, _ = matmul_shapes(task)
    return len(task.inputs[1].shape) >= 2 and math.prod(b_shape[:-2]) == 1


def prepack_tag(task: Task, config: Int8Config) -> str:
    return "int8"


def prepack_weights(task: Task, config: Int8Config, b: np.ndarray) -> np.ndarray:
    _, _, _, _, n, k = matmul_shapes(task)
    return pack_weights(np.asarray(b).reshape(k, n), task.inputs[1].dtype)


def build_matmul_int8(task: Task, cfg: Int8Config, name: str, target: CpuTarget,
                      prepacked: bool = False) -> Function:
    a_shape, b_shape, batch, m, n, k = matmul_shapes(task)
    a_type, b_type = task.inputs[0], task.inputs[1]
    kb = KernelBuilder(name, "cpu")
    a = kb.buffer("a", a_type.dtype, a_shape)
    b = kb.buffer("b", "int32" if prepacked else b_type.dtype,
                  packed_shape(k, n) if prepacked else b_shape)
    zeros = [task.inputs[i] if len(task.inputs) > i else None for i in (2, 3)]
    a_zero = kb.buffer("a_zero", zeros[0].dtype, (1,)) if zeros[0] is not None else None
    b_zero = (kb.buffer("b_zero", zeros[1].dtype, (max(zeros[1].size, 1),))
              if zeros[1] is not None else None)
    out = kb.buffer("out", "int32", batch + (m, n))
    if math.prod(batch) * m * n == 0:
        return kb.finish()
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    per_column = b_zero is not None and zeros[1].size != 1
    problem = Problem(
        batch, m, n, k, a_type.dtype, b_type.dtype,
        math.prod(a_batch), lambda bidx: linearize(broadcast_index(bidx, a_batch), a_batch),
        lambda mat, row, kk: a[tuple(unravel(mat, a_batch)) + (row, kk)],
        1 if prepacked else math.prod(b_batch),
        lambda bidx: linearize(broadcast_index(bidx, b_batch), b_batch),
        None if prepacked else
        (lambda mat, kk, col: b[tuple(unravel(mat, b_batch)) + (kk, col)]),
        b if prepacked else None,
        a_zero[0] if a_zero is not None else None,
        None if b_zero is None else (lambda col: b_zero[col if per_column else 0]))
    emit_int8_gemm(kb, problem, cfg, target,
                   lambda bidx, row, col, v: kb.store(out, bidx + (row, col), v))
    return kb.finish()
