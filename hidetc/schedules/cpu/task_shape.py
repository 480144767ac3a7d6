"""The task shapes of the blocked GEMM (`microkernel.py`): how `blocking` clamps a
`GemmConfig` to one M x N x K problem and cuts it into parallel tasks of MT rows x NC
columns (`_Shape.best`: balanced over the cores, least repacking, and, for callers whose
rows are an activation's positions or tokens, the rows kept with the core that uses
them from kernel to kernel), plus the cache-line helpers its buffers use."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hidetc.graph.guards import hint_value
from hidetc.target import CpuTarget

if TYPE_CHECKING:
    from hidetc.schedules.cpu.microkernel import GemmConfig

LINE = 16  # f32 per 64-byte cache line
CBUF_BYTES = 256 * 1024  # most task accumulator rows kept per task (half an L2)
FMA_UNITS = 2    # FMA instructions issued per cycle (vector_lanes floats each)
A_STREAM = 1.0   # cycles per A element a task streams (the input: 0.25 measured too cheap)
UNEVEN = 1.1     # a row split this much over the even one is rebalanced (`_Shape.best`)
REMOTE_ROW_COST = 4   # an activation float read from the other core, in weight floats
                      # streamed from L3 (`_Shape.best`, local_rows)


@dataclass(frozen=True)
class Blocking:
    """A GemmConfig clamped to one problem. A task is MT rows (a multiple of MC) by NC
    columns (a multiple of the caller's column unit: NR for MatMul, an output row for
    the im2col gather); ncw = NC rounded up to NR panels (cbuf's width), ncp = bpack's
    row stride (ncw rounded up to an odd number of cache lines)."""
    m: int
    n: int
    k: int
    mr: int
    nr: int
    mc: int
    nc: int
    kc: int
    mt: int
    pack_a: bool
    pack_b: bool
    lanes: int       # f32 lanes of the target's vector registers (8 AVX2, 16 AVX-512)

    @property
    def m_tiles(self) -> int:
        return -(-self.m // self.mt)

    @property
    def n_tiles(self) -> int:
        return -(-self.n // self.nc)

    @property
    def k_blocks(self) -> int:
        return -(-self.k // self.kc)

    @property
    def ncw(self) -> int:
        return round_up(self.nc, self.nr)

    @property
    def ncp(self) -> int:
        return odd_lines(self.ncw)


def odd_lines(floats: int) -> int:
    """`floats` rounded up to an odd number of cache lines (in floats): rows (or planes)
    that far apart do not all map to the same L1 sets."""
    lines = -(-floats // LINE)
    return (lines + 1 - lines % 2) * LINE


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def blocking(cfg: GemmConfig, m: int, n: int, k: int, batch: int, target: CpuTarget,
             n_unit: int | None = None, k_unit: int = 1, gather: bool = False,
             local_rows: bool = False) -> Blocking:
    """Clamp `cfg` to `batch` independent M x N x K problems: MC a multiple of MR, NC of
    `n_unit` (default NR), KC of `k_unit`; then choose the task shape (`_Shape`;
    `gather`: packing B is an im2col gather, dearer than a row copy; `local_rows`: the
    rows are the activation's positions or tokens, B the weights, and the caller's
    tasks run the row tiles outermost (one problem, or the same row split for every
    problem), so a row split keeps each core on its own part of the activations from
    kernel to kernel). Symbolic sizes: the tiles are chosen at the build's hint sizes
    (`guards.hint_value`: predicated tiles are right at every size), the Blocking keeps
    the symbolic M, N, K for the code's extents."""
    sizes = m, n, k
    m, n, k, batch = (hint_value(v) for v in (m, n, k, batch))   # (tiles: at the hint)
    mr, nr = max(1, min(cfg.mr, m)), cfg.nr  # M < MR: no rows computed twice
    unit = n_unit or nr
    mc = max(mr, min(round_up(cfg.mc, mr), round_up(max(m, 1), mr)))
    nc = max(unit, min(cfg.nc // unit * unit, round_up(max(n, 1), unit)))
    kc = max(k_unit, min(cfg.kc // k_unit * k_unit, k))
    shape = _Shape(m, n, max(k, 1), batch, target.cores, mr, nr, mc, unit, gather,
                   local_rows, target.vector_lanes)
    m, n, k = sizes
    mt, nc = shape.best(nc)
    return Blocking(m, n, k, mr, nr, mc, nc, kc, mt, cfg.pack_a, cfg.pack_b,
                    target.vector_lanes)


@dataclass(frozen=True)
class _Shape:
    """The task-shape choice: MT rows (a multiple of MC, or of MR splitting the rows
    evenly over the cores: `best`) x NC columns per task, with NC
    equalized over the column tiles (N=196 in 2 tiles is 98 + 98, not 182 + 14). Each
    candidate is costed in rough cycles -- FMAs over the padded MR x NR tiles (16 a
    cycle), B packed once per task, A streamed once per task -- and the static OpenMP
    schedule gives the busiest core ceil(tasks / cores) tasks; the cheapest busiest core
    wins. Candidates: up to 4x more column tiles than NC allows, any row split, cbuf
    within CBUF_BYTES."""
    m: int
    n: int
    k: int
    batch: int
    cores: int
    mr: int
    nr: int
    mc: int
    unit: int
    gather: bool
    local_rows: bool = False
    lanes: int = 8

    def widths(self, nc: int, tn0: int | None = None) -> set[int]:
        """Column tile widths: NC (or `tn0` tiles), up to 4x more tiles, equalized and
        rounded to the unit."""
        tn0 = tn0 or -(-max(self.n, 1) // nc)
        return {round_up(-(-max(self.n, 1) // tn), self.unit) for tn in range(tn0, 4 * tn0 + 1)}

    def tasks(self, mt: int, nc: int) -> int:
        return self.batch * -(-max(self.m, 1) // mt) * -(-max(self.n, 1) // nc)

    def candidates(self, nc: int) -> list[tuple[int, int]]:
        m_blocks = -(-max(self.m, 1) // self.mc)
        out = []
        for b in self.widths(nc):
            cap = max(1, CBUF_BYTES // (round_up(b, self.nr) * 4 * self.mc))
            out += [(self.mc * -(-m_blocks // t), b) for t in range(1, m_blocks + 1)
                    if -(-m_blocks // t) <= cap]
        if max(self.tasks(*c) for c in out) < self.cores:
            out += self.filling()
        return out

    def filling(self) -> list[tuple[int, int]]:
        """Where MC-block row tiles and up to 4x the config's column tiles give fewer
        tasks than cores (a 128-token GEMM on 64 cores): row tiles of any multiple of
        MR and as many column tiles as make one to two tasks per core, within cbuf."""
        out = []
        for t in range(1, min(self.cores, -(-max(self.m, 1) // self.mr)) + 1):
            mt = round_up(-(-max(self.m, 1) // t), self.mr)
            rows = self.batch * -(-max(self.m, 1) // mt)
            lo, hi = -(-self.cores // rows), -(-2 * self.cores // rows)
            for tn in range(lo, min(hi, -(-max(self.n, 1) // self.unit)) + 1):
                b = round_up(-(-max(self.n, 1) // tn), self.unit)
                if mt * round_up(b, self.nr) * 4 <= CBUF_BYTES:
                    out.append((mt, b))
        return out

    def even_rows(self, nc: int, whole: bool = False) -> list[tuple[int, int]]:
        """The rows split evenly over the cores (MT a multiple of MR only, its last MC
        block short: 784 positions in MC=64 blocks split 448 + 336, here 392 + 392)."""
        if self.m <= self.mr * self.cores:
            return []
        mt = round_up(-(-self.m // self.cores), self.mr)
        return [(mt, b) for b in self.widths(nc, 1 if whole else None)
                if mt * round_up(b, self.nr) * 4 <= CBUF_BYTES]

    def busiest_core(self, mt: int, nc: int) -> float:
        rows, cols = min(mt, max(self.m, 1)), min(nc, max(self.n, 1))
        tasks = self.batch * -(-self.m // mt) * -(-self.n // nc)
        fma = (round_up(rows, self.mr) * padded_cols(cols, self.nr, self.lanes) * self.k
               / (FMA_UNITS * self.lanes))
        pack = cols * self.k * (1.0 if self.gather else 0.25)
        pack += rows * self.k * A_STREAM
        return -(-tasks // self.cores) * (fma + pack + 2000)

    def best(self, nc: int) -> tuple[int, int]:
        """The cheapest candidate; when that splits the rows at most once per core and
        more than UNEVEN over an even split (13 MC blocks of 64 over 2 cores: 448 +
        336), or not at all (the columns split instead: every core reads the whole
        input), also the rows split evenly over the cores; after a column split over
        more rows than columns, at any width (with fewer rows than columns the weights
        are the bigger read and stay split); and, for `local_rows` (positions or tokens
        as rows, row tiles outermost), after a split into more row tiles than cores.
        Not offered otherwise: an even split of an uneven pair of MC blocks measured
        slower. (Each rule's measurements: bench/results/2026-12-01-prefetch-even-rows.md
        and 2026-12-01-parallel-shares.md.)

        For `local_rows`, where the cheapest candidate does not split the rows at all
        (every core reads all rows and writes a slab of columns) and the weights
        (K x N) are lighter than the activations such a split moves between the cores
        (M x (K + N): the input rows the other core wrote, the output rows the next
        kernel reads on the other core), an activation float counted REMOTE_ROW_COST
        weight floats (the weights stream from L3 either way, prefetched; a row split
        reads all of them on every core), the rows split evenly whatever the cost
        says: parallel loops give each core the same share of the rows in kernel after
        kernel (`codegen.c`), so a row split keeps a layer's activations in the L2 of
        the core that uses them. REMOTE_ROW_COST = 4 takes ResNet-50's 14x14 1x1s and
        BERT-base's projections (both faster in the models: bench/results/
        2026-12-01-parallel-shares.md) and leaves GPT-2's 768x50257 head split by columns
        (a factor of 8 would split its rows, both cores reading its 154 MB of weights)."""
        def cost(c: tuple[int, int]) -> tuple[float, int]:
            return self.busiest_core(*c), -c[1]
        pick = min(self.candidates(nc), key=cost)
        even = self.even_rows(nc, whole=pick[0] >= self.m >= self.n)
        if not even:
            return pick
        if (self.local_rows and pick[0] >= self.m
                and self.k * self.n < REMOTE_ROW_COST * self.m * (self.k + self.n)):
            return min(even, key=cost)      # the rows stay with the core that has them
        tiles = -(-self.m // pick[0])
        if ((self.local_rows and tiles > self.cores)
                or (tiles <= self.cores and min(pick[0], self.m) > UNEVEN * even[0][0])):
            pick = min([pick] + even, key=cost)
        return pick


def padded_cols(cols: int, nr: int, lanes: int) -> int:
    """Columns the micro-kernels compute for `cols` outputs (NR panels, a `lanes`-wide
    tail)."""
    full = cols // nr * nr
    rest = cols - full
    return full + (round_up(rest, lanes) if 0 < rest <= lanes else round_up(rest, nr))
