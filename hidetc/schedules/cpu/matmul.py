"""CPU template for MatMul (numpy semantics: batched, broadcast batch dims, 1-D operands).

Schedule: the output is cut into (batch, MT-row, NC-column) tasks, `spatial(batch,
m_tiles, n_tiles)` over one OpenMP-parallel loop; `task_shape.blocking` picks MT and
NC (within the config's bounds) so the tasks balance over the cores while B and A are
repacked least -- e.g. BERT's 128 x 768 x 3072 becomes 1 x 8 tasks of all 128 rows by
384 columns, so both cores are busy although M is small, and each B element is packed
once. With pack_a, every A matrix is first packed into MR-row panels once, in a
parallel loop of its own. Each task runs the blocked GEMM of `microkernel.py`: B's
KC x NC block copied into a contiguous local buffer (zero-padded past N), an MR x NR
register-tile micro-kernel with explicit fma, a local accumulator tile buffer stored
once, at the end. Default config: `default_gemm` (5 x 16; A packed when N >= 256).
A constant B (weights) is packed into NR-wide panels when the model is compiled
(`prepack_weights`, chosen by the plan); the kernel built with prepacked=True reads
every B panel from it and packs no B at all.

Assumes: f32 (any float dtype prints, but the blocking is tuned for 8 f32 lanes).
Guarantees: correct for every config of `space` on every shape (M, N, K >= 0, ragged
tiles), no out-of-bounds access. A 1-D A is a 1 x K matrix, a 1-D B a K x 1 one; the
output keeps the broadcast batch shape (the graph's MatMul shape rule drops the
inserted dims, which does not change the memory layout).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from hidetc.compute.injective import broadcast_index, linearize, unravel
from hidetc.compute.task import Task
from hidetc.graph.guards import current_hint
from hidetc.schedules.cpu.microkernel import (
    SHORT_LIST,
    GemmConfig,
    default_gemm,
    direct_a,
    emit_gemm_tile,
    gemm_space,
    pack_b_rows,
    packed_a,
    tile_extent,
)
from hidetc.schedules.cpu.task_shape import blocking
from hidetc.schedules.template import CpuTarget
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function
from hidetc.tir.mapping import spatial


class MatMulTemplate:
    name = "cpu.matmul"

    def space(self, task: Task, target: CpuTarget) -> Sequence[GemmConfig]:
        return gemm_space(target.isa)

    def short_list(self, task: Task, target: CpuTarget) -> Sequence[GemmConfig]:
        """Configs the tuner tries first after the default (microkernel.SHORT_LIST)."""
        return SHORT_LIST[target.isa]

    def default(self, task: Task, target: CpuTarget) -> GemmConfig:
        """`default_gemm` at the task's sizes (a range compile's variant: at its hint,
        with one packing for every variant)."""
        _, _, _, m, n, _ = matmul_shapes(task.hinted())
        return default_gemm(m, n, target.isa, one_packing=current_hint() is not None)

    def build(self, task: Task, config: GemmConfig, name: str, target: CpuTarget,
              prepacked: bool = False) -> Function:
        """`prepacked`: B arrives in the panel layout of `prepack_weights` (a constant
        B packed at compile time; see `can_prepack`). The parallel loop's tasks are
        shaped for `target.cores`."""
        return build_matmul_config(task, config, name, target, prepacked)


def can_prepack(task: Task, config: GemmConfig) -> bool:
    """Whether `prepack_weights` applies: B one matrix (no batch of them) at least one
    NR panel wide."""
    _, b_shape, _, _, n, _ = matmul_shapes(task)
    return len(task.inputs[1].shape) >= 2 and math.prod(b_shape[:-2]) == 1 and \
        n >= config.nr


def prepack_tag(task: Task, config: GemmConfig) -> str:
    """Names the packed layout (the plan's constant `<b>.packed_<tag>`): NR, the panel
    width; the layout of `prepack_weights` depends on nothing else."""
    return f"nr{config.nr}"


def prepack_weights(task: Task, config: GemmConfig, b: np.ndarray) -> np.ndarray:
    """B [.., K, N] as [N/NR panels, K, NR]: panel p holds columns p*NR .. p*NR+NR-1,
    the last one zero-padded. The kernel built with prepacked=True reads its B panels
    from there, contiguous, and packs nothing."""
    _, b_shape, _, _, n, k = matmul_shapes(task)
    nr = config.nr
    panels = -(-n // nr)
    mat = np.zeros((k, panels * nr), np.asarray(b).dtype)
    mat[:, :n] = np.asarray(b).reshape(k, n)
    return np.ascontiguousarray(mat.reshape(k, panels, nr).transpose(1, 0, 2))


TEMPLATE = MatMulTemplate()


def matmul_shapes(task: Task):
    """(a_shape, b_shape, batch, m, n, k) with 1-D operands made 2-D."""
    a_type, b_type = task.inputs[0], task.inputs[1]
    a_shape = a_type.shape if len(a_type.shape) > 1 else (1,) + a_type.shape
    b_shape = b_type.shape if len(b_type.shape) > 1 else b_type.shape + (1,)
    m, k = a_shape[-2:]
    n = b_shape[-1]
    return a_shape, b_shape, _batch_shape(a_shape, b_shape), m, n, k


def build_matmul_config(task: Task, cfg: GemmConfig, name: str, target: CpuTarget,
                        prepacked: bool = False) -> Function:
    a_shape, b_shape, batch, m, n, k = matmul_shapes(task)
    dt = task.outputs[0].dtype
    nbatch = math.prod(batch)
    bl = blocking(cfg, m, n, k, nbatch, target, local_rows=nbatch == 1)
    kb = KernelBuilder(name, "cpu")
    a = kb.buffer("a", dt, a_shape)
    b = kb.buffer("b", dt, (-(-n // bl.nr), k, bl.nr) if prepacked else b_shape)
    out = kb.buffer("out", dt, batch + (m, n))
    if nbatch * m * n == 0:
        return kb.finish()
    a_batch = a_shape[:-2]
    if cfg.pack_a:
        a_of = packed_a(kb, bl, dt, math.prod(a_batch), lambda mat, r, kk: a[
            tuple(unravel(mat, a_batch)) + (r, kk)])
    tiles = (nbatch, bl.m_tiles, bl.n_tiles)
    with kb.for_range(math.prod(tiles), kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(*tiles), p, names=["bt", "ib", "jb"]) as (bt, ib, jb):
            bidx = unravel(bt, batch)
            a_idx = broadcast_index(bidx, a_batch)
            b_pre = tuple(broadcast_index(bidx, b_shape[:-2]))
            i0, j0 = ib * bl.mt, jb * bl.nc
            cols = tile_extent(n, j0, bl.nc)
            a_panel = a_of(linearize(a_idx, a_batch)) if cfg.pack_a else direct_a(
                bl, lambda r, kk, a_idx=a_idx: a[tuple(a_idx) + (r, kk)])
            def b_value(kk, c, b_pre=b_pre):
                return b[b_pre + (kk, c)]
            def b_panel(kk, jp, j, jb=jb):
                return b[jb * (bl.nc // bl.nr) + jp, kk, j]
            emit_gemm_tile(
                kb, bl, dt, i0, (tile_extent(m, i0, bl.mt), cols), a_panel,
                None if prepacked else pack_b_rows(b_value, j0, cols),
                lambda r, j, v, bidx=bidx, i0=i0, j0=j0: kb.store(
                    out, tuple(bidx) + (i0 + r, j0 + j), v),
                b_direct=lambda kk, c, j0=j0, b_value=b_value: b_value(kk, j0 + c),
                b_prepacked=b_panel if prepacked else None)
    return kb.finish()


def _batch_shape(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    a_b, b_b = a_shape[:-2], b_shape[:-2]
    rank = max(len(a_b), len(b_b))
    a_b = (1,) * (rank - len(a_b)) + a_b
    b_b = (1,) * (rank - len(b_b)) + b_b
    return tuple(max(x, y) for x, y in zip(a_b, b_b))
