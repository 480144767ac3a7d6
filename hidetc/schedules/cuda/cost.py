"""A first-order cost model of one CUDA launch, from the CudaTarget and the kernel: what
the tensor-core templates' defaults (tile and split-K) are chosen by, the order the
tuner measures their candidates in, and what `hidetc inspect` reports per launch
(blocks, blocks per SM, waves, FLOPs, bytes, estimated microseconds) without a GPU.

Per launch:
- `blocks` (the grid's product) and `blocks_per_sm` (`CudaTarget.blocks_per_sm` from
  the threads, the registers -- ptxas's count for the built kernel when the caller
  has it, else the table's for the config, `tc_registers` -- and the shared
  memory); `waves` = ceil(blocks / (SMs x blocks per SM)).
- the tensor-core GEMMs (kernels carrying a `gemm` attr: M, N, K, outer count, the
  operands' bytes and their TcConfig, `tc_common.TcKernel.finish`): each k-tile
  iteration of a block takes the longest of its MMA time and its L2 -> shared copy
  time, both shared with the other blocks resident on the SM, and the load latency
  that the pipeline's stages - 1 tiles in flight must cover; a block runs its split's
  iterations, waves run one after another; split-K adds the last block's read of S
  partial tiles per output tile. The DRAM roofline (operands and output once,
  split-K's workspace written and read) bounds it below.
- the GEMV kernels (a `gemv` attr, `matmul_gemv`): `gemv_estimate`; fused attention:
  `attention_estimate`.
- every other kernel: the roofline of its task (FLOPs on the SIMT units of the SMs its
  blocks occupy, the task's operand and result bytes at DRAM bandwidth) or, when
  larger, MIN_BLOCK_US per wave.
- plus LAUNCH_US, the cost of one launch inside a CUDA graph.

The constants below are first-order guesses from public figures (mma.sync's share of
the tensor-core peak, L2 bandwidth per SM, DRAM latency), NOT fitted: the GPU check
records measured beside estimated microseconds per kernel so the first GPU session can
fit them (and record the fit in bench/results). The model ranks configs of one task;
its absolute sums are an estimate.

Assumes the target's performance facts (`clock_mhz`, `dram_gbps`,
`tensor_flops_per_clk`, `simt_flops_per_clk`) are the GPU's. Decides: `gemm_choice`
(the cheapest of the given tiles at its cheapest split), `with_best_split` (one tile's).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Optional, Sequence

from hidetc.compute.task import Task, task_flops
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.cuda.tc_common import TcConfig, fits
from hidetc.schedules.template import CudaTarget
from hidetc.tir.ir import Function

# the share of the tensor cores' dense peak that mma.sync sustains (sm_90's peak counts
# wgmma, which hidetc does not issue)
MMA_SYNC_SHARE = {"sm_90": 0.6, "sm_90a": 0.6}
MMA_SYNC_SHARE_DEFAULT = 0.8
SIMT_SHARE = 0.7                 # of the FP32 peak, for SIMT kernels
DRAM_SHARE = 0.8                 # of the DRAM bandwidth a streaming kernel reaches
L2_BYTES_PER_CLK_PER_SM = 64     # L2 -> SM bandwidth
MEMORY_LATENCY_US = 0.8          # a global load's latency, which a pipeline must cover
TILE_OVERHEAD_US = 0.5           # per block: prologue fill, epilogue, index set-up
MIN_BLOCK_US = 2.0               # a wave of a non-GEMM kernel, however small
LAUNCH_US = 1.5                  # one launch inside a CUDA graph
SPLITS = tuple(range(1, 33))     # split-K factors the model weighs
MAX_WORKSPACE_BYTES = 64 << 20   # split-K partial sums of one launch
GUESS_REGISTERS = 32             # per thread, for kernels without a count


@dataclass(frozen=True)
class Estimate:
    blocks: int
    blocks_per_sm: int
    waves: int
    flops: int
    bytes: int
    estimate_us: float

    def facts(self) -> dict:
        """The per-kernel record (`hidetc inspect --json`)."""
        return {"blocks_per_sm": self.blocks_per_sm, "waves": self.waves,
                "bytes": self.bytes, "estimate_us": round(self.estimate_us, 2)}


def _per_us(per_clk: float, target: CudaTarget) -> float:
    """A per-clock rate of one SM, per microsecond."""
    return per_clk * target.clock_mhz


def _dram_us(nbytes: int, target: CudaTarget) -> float:
    return nbytes / (target.dram_gbps * 1e3 * DRAM_SHARE)


@dataclass(frozen=True)
class Gemm:
    """One tensor-core GEMM launch: C[outer][M, N] = A[M, K] @ B[K, N] per outer index,
    with the operands' bytes (A and B once; broadcast operands are read once)."""
    m: int
    n: int
    k: int
    outer: int
    operand_bytes: int

    def tiles(self, cfg: TcConfig) -> int:
        return ceil_div(self.m, cfg.bm) * ceil_div(self.n, cfg.bn) * self.outer


def gemm_estimate(gemm: Gemm, cfg: TcConfig, target: CudaTarget,
                  registers: Optional[int] = None) -> Estimate:
    """See the module docstring."""
    splits = cfg.splits
    tiles = gemm.tiles(cfg)
    blocks = max(1, tiles * splits)
    k_tiles = ceil_div(gemm.k, cfg.bk)
    per = ceil_div(k_tiles, splits)
    registers = registers or cfg.registers_on(target.arch)
    resident = target.blocks_per_sm(cfg.threads, registers, cfg.shared_bytes)
    resident = max(1, resident)
    waves = ceil_div(blocks, target.sms * resident)
    active = min(resident, ceil_div(blocks, target.sms))
    share = MMA_SYNC_SHARE.get(target.arch, MMA_SYNC_SHARE_DEFAULT)
    mma_us = active * 2 * cfg.bm * cfg.bn * cfg.bk / (
        _per_us(target.tensor_flops_per_clk, target) * share)
    copy_us = active * (cfg.bm + cfg.bn) * cfg.bk * 2 / _per_us(L2_BYTES_PER_CLK_PER_SM,
                                                                target)
    latency_us = MEMORY_LATENCY_US / max(1, cfg.stages - 1)
    block_us = per * max(mma_us, copy_us, latency_us) + TILE_OVERHEAD_US
    workspace = tiles * splits * cfg.bm * cfg.bn * 4 if splits > 1 else 0
    nbytes = gemm.operand_bytes + gemm.m * gemm.n * gemm.outer * 2 + 2 * workspace
    time_us = max(waves * block_us, _dram_us(nbytes, target))
    if splits > 1:    # the last block of each tile reads S partial tiles through L2
        read_us = splits * cfg.bm * cfg.bn * 4 / _per_us(L2_BYTES_PER_CLK_PER_SM, target)
        time_us += ceil_div(tiles, target.sms) * (read_us + MEMORY_LATENCY_US)
    flops = 2 * gemm.m * gemm.n * gemm.k * gemm.outer
    return Estimate(blocks, resident, waves, flops, nbytes, time_us + LAUNCH_US)


def gemv_estimate(gemm: Gemm, cfg, target: CudaTarget,
                  registers: Optional[int] = None) -> Estimate:
    """A GEMV launch (`matmul_gemv`: `cfg` a GemvConfig): each block streams its CN
    columns of B over K in steps of warps x k lanes x unroll rows, one step's loads in
    flight together (a step takes at least MEMORY_LATENCY_US, or its FMAs' time on the
    SM's SIMT units when more); the DRAM roofline for the bytes, as reachable from the
    SMs the blocks occupy."""
    blocks = max(1, ceil_div(gemm.n, cfg.columns) * gemm.outer)
    regs = registers or (gemm.m * 8 + cfg.unroll * 4 + 40)
    resident = max(1, target.blocks_per_sm(cfg.threads, regs, cfg.shared_bytes(max(gemm.m, 1))))
    waves = ceil_div(blocks, target.sms * resident)
    active = min(resident, ceil_div(blocks, target.sms))
    steps = ceil_div(gemm.k, cfg.warps * cfg.k_lanes * cfg.unroll)
    fma_us = active * cfg.threads * gemm.m * 8 * cfg.unroll * 2 / (
        _per_us(target.simt_flops_per_clk, target) * SIMT_SHARE)
    block_us = steps * max(MEMORY_LATENCY_US, fma_us) + TILE_OVERHEAD_US
    nbytes = gemm.operand_bytes + gemm.m * gemm.n * gemm.outer * 2
    reach = min(1.0, 4 * min(blocks, target.sms) / target.sms)
    time_us = max(waves * block_us, _dram_us(nbytes, target) / reach)
    flops = 2 * gemm.m * gemm.n * gemm.k * gemm.outer
    return Estimate(blocks, resident, waves, flops, nbytes, time_us + LAUNCH_US)


def attention_estimate(fn: Function, task: Task, target: CudaTarget,
                       registers: Optional[int] = None,
                       shared_bytes: Optional[int] = None) -> Estimate:
    """A fused attention launch (`attention.py`: a block per 64 query rows and batch
    entry, a loop over 64-key tiles): per key tile the longest of its two MMAs' time on
    the SM (shared with the resident blocks), its K and V tiles' copy through L2, and one
    load latency (the tiles are not pipelined); the DRAM roofline below."""
    q, kt, v = task.inputs[0], task.inputs[1], task.inputs[2]
    d, sk, dv = q.shape[-1], kt.shape[-1], v.shape[-1]
    blocks = max(1, math.prod(fn.attr("grid") or (1,)))
    threads = max(1, math.prod(fn.attr("block") or (1,)))
    resident = max(1, target.blocks_per_sm(threads, registers or 160, shared_bytes or
                                           2 * 64 * (2 * d + dv)))
    waves = ceil_div(blocks, target.sms * resident)
    active = min(resident, ceil_div(blocks, target.sms))
    share = MMA_SYNC_SHARE.get(target.arch, MMA_SYNC_SHARE_DEFAULT)
    mma_us = active * 2 * 64 * 64 * (d + dv) / (_per_us(target.tensor_flops_per_clk, target)
                                                * share)
    copy_us = active * 64 * (d + dv) * 2 / _per_us(L2_BYTES_PER_CLK_PER_SM, target)
    block_us = ceil_div(sk, 64) * max(mma_us, copy_us, MEMORY_LATENCY_US) + TILE_OVERHEAD_US
    nbytes = task_bytes(task)
    time_us = max(waves * block_us, _dram_us(nbytes, target))
    return Estimate(blocks, resident, waves, task_flops(task), nbytes, time_us + LAUNCH_US)


def split_choices(gemm: Gemm, cfg: TcConfig, target: CudaTarget) -> list[TcConfig]:
    """`cfg` at each split of SPLITS that leaves no split empty, keeps the workspace
    under MAX_WORKSPACE_BYTES and fits the target (the split-K kernel's registers:
    `tc_common.fits`; its flag reuses the A tile, so no shared memory); `cfg` itself
    always."""
    k_tiles = ceil_div(gemm.k, cfg.bk)
    splits = [replace(cfg, splits=s) for s in SPLITS[1:]
              if (s - 1) * ceil_div(k_tiles, s) < k_tiles
              and gemm.tiles(cfg) * s * cfg.bm * cfg.bn * 4 <= MAX_WORKSPACE_BYTES]
    return [cfg] + [c for c in splits if fits(c, target)]


def with_best_split(gemm: Gemm, cfg: TcConfig, target: CudaTarget) -> TcConfig:
    """`cfg` (unsplit) at its cheapest split for this GEMM (the fewest splits among
    equals)."""
    return min(split_choices(gemm, replace(cfg, splits=1), target),
               key=lambda c: (round(gemm_estimate(gemm, c, target).estimate_us, 3), c.splits))


def gemm_choice(gemm: Gemm, configs: Iterable[TcConfig], target: CudaTarget) -> TcConfig:
    """The cheapest of `configs` (each at its cheapest split); among estimates equal to
    0.01 us, the one that occupies more SMs (up to all of them: what a latency-bound
    launch, which the model times alike, gains from), then the one whose tiles cover
    fewer rows and columns past the GEMM's (tensor-core work on zero-filled rows: a
    32-row tile where M <= 32), then the earlier."""
    best, best_key = None, (math.inf, 0, 0)
    for cfg in configs:
        choice = with_best_split(gemm, cfg, target)
        estimate = gemm_estimate(gemm, choice, target)
        padded = gemm.tiles(cfg) * cfg.bm * cfg.bn
        key = (round(estimate.estimate_us, 2), -min(estimate.blocks, target.sms), padded)
        if key < best_key:
            best, best_key = choice, key
    if best is None:
        raise ValueError("gemm_choice needs at least one config")
    return best


def task_bytes(task: Task) -> int:
    """The bytes a task's kernel reads and writes at least once (its buffer inputs and
    its outputs)."""
    inputs = [task.inputs[i] for i in task.buffer_inputs]
    return int(sum(t.nbytes for t in (*inputs, *task.outputs) if t is not None))


def kernel_estimate(fn: Function, task: Task, target: CudaTarget,
                    registers: Optional[int] = None,
                    shared_bytes: Optional[int] = None) -> Estimate:
    """The estimate of one launch of `fn` (built for `task`); `registers` and
    `shared_bytes` from ptxas when known."""
    gemm = fn.attr("gemm")
    if gemm is not None:
        m, n, k, outer, operand_bytes, cfg = gemm
        return gemm_estimate(Gemm(m, n, k, outer, operand_bytes), cfg, target, registers)
    gemv = fn.attr("gemv")
    if gemv is not None:
        m, n, k, outer, operand_bytes, cfg = gemv
        return gemv_estimate(Gemm(m, n, k, outer, operand_bytes), cfg, target, registers)
    if task.op == "FusedAttention":
        return attention_estimate(fn, task, target, registers, shared_bytes)
    blocks = max(1, math.prod(fn.attr("grid") or (1,)))
    threads = max(1, math.prod(fn.attr("block") or (1,)))
    resident = max(1, target.blocks_per_sm(threads, registers or GUESS_REGISTERS,
                                           shared_bytes or 0))
    waves = ceil_div(blocks, target.sms * resident)
    flops, nbytes = task_flops(task), task_bytes(task)
    used_sms = min(target.sms, blocks)
    compute_us = flops / (_per_us(target.simt_flops_per_clk, target) * SIMT_SHARE * used_sms)
    # a few SMs cannot draw the whole DRAM bandwidth: one reaches about a quarter's worth
    reach = min(1.0, 4 * used_sms / target.sms)
    time_us = max(compute_us, _dram_us(nbytes, target) / reach, waves * MIN_BLOCK_US)
    return Estimate(blocks, resident, waves, flops, nbytes, time_us + LAUNCH_US)


def task_space(gemm: Optional[Gemm], tiles: Sequence[TcConfig], target: CudaTarget
               ) -> list[TcConfig]:
    """The tuner's space for one GEMM: every tile config of the shape-free space `tiles`
    at the split the model picks for it (so the space stays as small as the tiles'),
    cheapest estimate first -- the order the tuner measures in. Without a GEMM (no
    task): `tiles` as they are."""
    if gemm is None:
        return list(tiles)
    chosen = {with_best_split(gemm, c, target): None for c in tiles}
    return sorted(chosen, key=lambda c: gemm_estimate(gemm, c, target).estimate_us)
