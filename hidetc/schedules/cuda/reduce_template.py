"""CUDA template: row reductions -- Reduce* over any axes, Softmax/LogSoftmax along one
axis, LayerNormalization over the trailing axes, GlobalAveragePool/GlobalMaxPool.

Rows: every task is a set of independent rows of n elements (`reduce_rows.RowView`:
contiguous, or strided through the input's merged dims).

Schedule, for a config (threads T per row, rows R per block, vector V, cache):
- a block of T * R threads owns R consecutive rows: thread t works on row
  `blockIdx.x * R + t // T` as lane `t % T` of the row's group (T >= 32: a warp never
  spans two rows); grid ceil(rows / R).
- a thread's share of its row is the chunks c = s * T + lane (s < steps = ceil(n / TV))
  of V consecutive elements, each loaded by aligned vector copies (<= 16 bytes each)
  into registers; consecutive lanes read consecutive chunks (coalesced). V applies to
  contiguous rows only and only as far as it divides n (the effective width is the
  largest power of two <= V dividing n; strided rows use 1), so a chunk lies wholly
  inside the row and is aligned.
- each thread folds its elements serially, then `group_allreduce` (common.py) combines
  the T lanes of the row: an xor-shuffle butterfly per warp, and with T > 32 one partial
  per warp in shared memory, one __syncthreads and a butterfly over the partials. T = 32
  is a warp per row: shuffles only, no shared memory, no barrier. Every lane ends with
  the row's total, so a later pass needs no broadcast.
- cache (multi-pass ops only: Softmax, LogSoftmax, LayerNormalization,
  ReduceLogSumExp): the thread's steps * V elements stay in a register array between
  the passes (the chunk loop is unrolled, so its indices are constants), and the row is
  read from global memory once. When they do not fit (more than `cache_registers()`
  32-bit registers) the kernel re-reads the row in every pass instead -- decided at build
  time, so every config is correct on every shape.
- rows past the end (rows % R != 0) and chunks past the row end are predicated: their
  threads still reach every barrier and shuffle but load and store nothing.

Numerics: float16 and bfloat16 rows are loaded, cached, accumulated and computed in
float32 and rounded once at the store; float64 stays float64; bool and 8/16-bit ints
compute in int32 (shuffles need 32-bit values), other ints in their dtype, with the
dtype's limits as the Max/Min identities. Softmax subtracts the row max; LogSoftmax is
(x - max) - log(sum). ReduceLogSumExp is log(sum(exp(x - m))) + m, m the row max (0 when
not finite, like the reference). LayerNormalization is two-pass on shifted data: K =
x[row, 0], d = mean(x - K), var = mean(((x - K) - d)^2), y = ((x - K) - d) /
sqrt(var + eps) * scale + bias (scale and bias may broadcast): a deviation never goes
through a rounded mean (a float32 mean near 1e4 alone is off by up to 5e-4) and the
variance never through E[x^2] - E[x]^2. Cached, the rows hold x - K (LayerNorm) or
exp(x - max) (Softmax) after the second pass, so nothing is computed twice.

Space (independent of the shape; `config_space(op)`): T in {32, ..., 1024} x R in {1,
..., 32} with T * R <= 1024 (21 layouts) x V in {1, 2, 4, 8} x cache in {False, True}:
168 configs for the multi-pass ops, 84 (cache False) for the single-pass ones, which
read each element once anyway. Pruned by the hardware limits (<= 1024 threads per
block; static shared memory <= 48 KiB, here at most 2 x 32 x 8 bytes).

Default (`default_config`): V the widest vector (<= 16 bytes) dividing n; T = 32 (a
warp per row), doubled while a thread would have more than 8 chunks, then while the
rows do not fill the GPU (rows * T < 1024 * SMs) and each thread keeps >= 2 chunks; R
doubled up to 256-thread blocks while at least one block per SM remains; cache on.

Assumes: buffers 16-byte aligned (hidetc's arena and weights are 64-byte aligned).
Guarantees: correct for every config on every shape, empty rows and empty reductions
included; no memory access outside the operands.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.graph.symbolic import SymDim
from hidetc.schedules.common.reducers import INF, REDUCERS
from hidetc.schedules.cuda.common import (
    SHARED_LIMIT,
    WARP,
    at_least_one,
    ceil_div,
    group_allreduce,
)
from hidetc.schedules.cuda.reduce_rows import (
    GLOBAL_POOLS,
    RowView,
    compute_dtype,
    effective_vector,
    view_of,
)
from hidetc.schedules.template import Target
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.cuda import copy
from hidetc.tir.ir import (
    FLOATS,
    Buffer,
    Const,
    Expr,
    ExprLike,
    Function,
    Var,
    as_expr,
    block_idx,
    call,
    cast,
    logical_and,
    maximum,
    minimum,
    select,
    thread_idx,
)

MAX_THREADS = 1024             # threads per block on every GPU of sm_80 and newer
THREADS_PER_ROW = (32, 64, 128, 256, 512, 1024)
ROWS_PER_BLOCK = (1, 2, 4, 8, 16, 32)
VECTORS = (1, 2, 4, 8)
VECTOR_BYTES = 16
CACHE_REGISTERS = 32           # 32-bit registers per thread for the cached row
MAX_REDUCTIONS = 2             # group reductions per kernel (each its own shared buffer)
MULTI_PASS = ("Softmax", "LogSoftmax", "LayerNormalization", "ReduceLogSumExp")
OPS = ("Softmax", "LogSoftmax", "LayerNormalization") + tuple(REDUCERS) + tuple(GLOBAL_POOLS)


@dataclass(frozen=True)
class ReduceConfig:
    threads: int     # threads per row (a power of two, 32..1024)
    rows: int        # rows per block
    vector: int      # elements per access of contiguous rows
    cache: bool      # keep the thread's elements in registers between passes

    @property
    def block_threads(self) -> int:
        return self.threads * self.rows

    def shared_bytes(self) -> int:
        if self.threads <= WARP:
            return 0
        return MAX_REDUCTIONS * (self.block_threads // WARP) * 8

    def cache_registers(self) -> int:
        """Registers a thread may spend on its cached elements (64K per SM)."""
        return CACHE_REGISTERS if self.block_threads <= 512 else CACHE_REGISTERS // 2


def check_config(cfg: ReduceConfig) -> Optional[str]:
    """Why `cfg` breaks a hardware or layout limit, or None when it fits."""
    if cfg.threads not in THREADS_PER_ROW or cfg.rows not in ROWS_PER_BLOCK:
        return "threads per row must be a power of two in 32..1024, rows 1..32"
    if cfg.vector not in VECTORS:
        return f"vector must be one of {VECTORS}"
    if cfg.block_threads > MAX_THREADS:
        return f"{cfg.block_threads} threads > {MAX_THREADS}"
    if cfg.shared_bytes() > SHARED_LIMIT:
        return f"{cfg.shared_bytes()} bytes of shared memory > {SHARED_LIMIT}"
    return None


def config_space(op: str) -> list[ReduceConfig]:
    caches = (False, True) if op in MULTI_PASS else (False,)
    configs = [ReduceConfig(t, r, v, c) for t, r, v, c in
               itertools.product(THREADS_PER_ROW, ROWS_PER_BLOCK, VECTORS, caches)]
    return [c for c in configs if check_config(c) is None]


def default_config(op: str, view: RowView, dtype: str, sms: int = 132) -> ReduceConfig:
    """See Default in the module docstring."""
    n, rows = view.n, max(view.rows, 1)
    itemsize = np.dtype(dtype).itemsize
    v = max((p for p in VECTORS if p * itemsize <= VECTOR_BYTES), default=1)
    v = effective_vector(v, view)
    t = 32
    while t < 1024 and ceil_div(n, t * v) > 8:
        t *= 2
    while t < 1024 and rows * t < 1024 * sms and n >= 2 * 2 * t * v:
        t *= 2
    r = 1
    while t * r < 256 and ceil_div(rows, 2 * r) >= sms:
        r *= 2
    return ReduceConfig(t, r, v, op in MULTI_PASS)


# the kernel ------------------------------------------------------------------------------
Body = Callable[..., Optional[Expr]]
Index = Callable[[Expr], tuple]
Side = tuple[Buffer, Index, bool]


class _RowKernel:
    """The thread layout of one config over a RowView; emits passes and reductions."""

    def __init__(self, task: Task, cfg: ReduceConfig, name: str, view: RowView):
        problem = check_config(cfg)
        if problem:
            raise ValueError(f"reduction config {cfg}: {problem}")
        self.task, self.cfg, self.view = task, cfg, view
        self.dt = task.inputs[0].dtype
        self.cdt = compute_dtype(self.dt)
        self.v = effective_vector(cfg.vector, view)
        self.steps = at_least_one(ceil_div(view.n, cfg.threads * self.v))
        registers = self.steps * self.v * max(1, np.dtype(self.cdt).itemsize // 4)
        # a row of symbolic length has no constant register count: read again per pass
        self.cached = cfg.cache and task.op in MULTI_PASS and \
            not isinstance(self.steps, SymDim) and registers <= cfg.cache_registers()
        self.kb = KernelBuilder(name, "cuda")
        self.x = self.kb.buffer("x", self.dt, view.buffer_shape())
        tid = thread_idx()
        self.lane = tid % cfg.threads
        self.row = block_idx() * cfg.rows + tid // cfg.threads
        self.valid: Expr = as_expr(True) if view.rows % cfg.rows == 0 else self.row < view.rows
        self.cache: Optional[Buffer] = None
        self.loaded = False
        self.reductions = 0

    def finish(self) -> Function:
        grid = (at_least_one(ceil_div(self.view.rows, self.cfg.rows)), 1, 1)
        return self.kb.finish(grid=grid, block=(self.cfg.block_threads, 1, 1))

    def const(self, value: float) -> Const:
        return Const(float(value) if self.cdt in FLOATS else int(value), self.cdt)

    def declare(self, name: str, init: ExprLike) -> Var:
        return self.kb.declare(name, self.cdt, init)

    def chunk_ok(self, c: Expr) -> Expr:
        n = self.view.n
        conds = [] if n % (self.cfg.threads * self.v) == 0 else [c * self.v < n]
        return logical_and(self.valid, *conds)

    def load(self, buf: Buffer, index: Index, c: Expr, vector: bool = True) -> list[Expr]:
        """The V elements of chunk c of `buf` (index(k): element k's buffer index), by
        vector copies when `vector` and the chunk's bytes allow."""
        v, kb = self.v, self.kb
        nbytes = v * np.dtype(buf.dtype).itemsize
        if v == 1 or nbytes % 4 or not vector:
            return [buf[index(c * v + e)] for e in range(v)]
        stage = kb.alloc(f"{buf.name}_v", buf.dtype, (v,))
        piece = min(nbytes, VECTOR_BYTES)
        per = piece * v // nbytes
        for p in range(nbytes // piece):
            kb.emit(copy(stage[p * per], buf[index(c * v + p * per)], piece))
        return [stage[e] for e in range(v)]

    def store(self, out: Buffer, c: Expr, values: list[Expr]) -> None:
        v, kb = self.v, self.kb
        values = [cast(y, out.dtype) for y in values]
        nbytes = v * np.dtype(out.dtype).itemsize
        index = lambda k: self.view.index(self.row, k)  # noqa: E731
        if v == 1 or nbytes % 4:
            for e, y in enumerate(values):
                kb.store(out, index(c * v + e), y)
            return
        stage = kb.alloc(f"{out.name}_v", out.dtype, (v,))
        for e, y in enumerate(values):
            kb.store(stage, (e,), y)
        piece = min(nbytes, VECTOR_BYTES)
        per = piece * v // nbytes
        for p in range(nbytes // piece):
            kb.emit(copy(out[index(c * v + p * per)], stage[p * per], piece))

    def sweep(self, body: Body, out: Optional[Buffer] = None, side: Sequence[Side] = ()
              ) -> None:
        """One pass over this thread's elements: `body(slot, k, value, *side_values)` per
        element (value in the compute dtype: from the cache, or loaded); with `out`, the
        bodies' results are stored at (row, k). `side`: (buffer, index(k), vector ok)
        of per-element operands shared by all rows (LayerNorm's scale and bias)."""
        if self.view.n == 0:
            return
        kb, v, cdt = self.kb, self.v, self.cdt
        if self.cached and self.cache is None:
            self.cache = kb.alloc("cache", cdt, (self.steps * v,))
        kind = "unroll" if self.cached else "serial"
        with kb.for_range(self.steps, kind=kind, name="s") as s:
            c = s * self.cfg.threads + self.lane
            with kb.if_then(self.chunk_ok(c)):
                if self.cached and self.loaded:
                    values: list[Expr] = [self.cache[s * v + e] for e in range(v)]
                else:
                    values = [cast(x, cdt) for x in
                              self.load(self.x, lambda k: self.view.index(self.row, k), c)]
                    if self.cached:
                        for e, x in enumerate(values):
                            kb.store(self.cache, (s * v + e,), x)
                        values = [self.cache[s * v + e] for e in range(v)]
                sides = [[cast(y, cdt) for y in self.load(b, index, c, vec)]
                         for b, index, vec in side]
                results = [body(s * v + e, c * v + e, x, *[sd[e] for sd in sides])
                           for e, x in enumerate(values)]
                if out is not None:
                    self.store(out, c, results)  # type: ignore[arg-type]
        self.loaded = True

    def update_cache(self, slot: Expr, value: Expr) -> bool:
        """Replace a cached element (what later passes see); False when not caching."""
        if self.cached:
            self.kb.store(self.cache, (slot,), value)
        return self.cached

    def fold(self, name: str, identity: ExprLike, combine, term: Body) -> Var:
        """acc = combine over the row of term(slot, k, value), in every lane."""
        acc = self.declare(name, identity)
        self.sweep(lambda slot, k, x, *s: self.kb.assign(acc, combine(acc, term(slot, k, x))))
        self.reductions += 1
        if self.reductions > MAX_REDUCTIONS:
            raise ValueError(f"more than {MAX_REDUCTIONS} reductions: see shared_bytes()")
        group_allreduce(self.kb, acc, combine, self.cfg.threads, self.cfg.block_threads, name)
        return acc


def _add(a: Expr, b: Expr) -> Expr:
    return a + b


def _mul(a: Expr, b: Expr) -> Expr:
    return a * b


def _identity(value: float, dtype: str, cdt: str) -> Const:
    """A reduction's identity in dtype `dtype`, as a `cdt` constant (+-inf become the
    integer limits; for bool False/True)."""
    if dtype in FLOATS:
        return Const(float(value), cdt)
    if dtype == "bool":
        return Const(int(value > 0), cdt)
    info = np.iinfo(dtype)
    return Const(int(min(max(value, info.min), info.max)), cdt)


def _reduce(k: _RowKernel, op: str) -> None:
    kb, cdt, n = k.kb, k.cdt, k.view.n
    out = kb.buffer("out", k.task.outputs[0].dtype, (k.view.rows,))
    if k.view.rows == 0:
        return
    is_float = cdt in FLOATS
    if op == "ReduceLogSumExp":
        top = k.fold("top", k.const(-INF), maximum, lambda s, i, x: x)
        shift = k.declare("shift", select(logical_and(top > -INF, top < INF), top, 0.0))
        total = k.fold("total", k.const(0), _add, lambda s, i, x: call("exp", x - shift))
        result: Expr = call("log", total) + shift
    else:
        init, combine = {"ReduceMax": (-INF, maximum), "ReduceMin": (INF, minimum),
                         "ReduceProd": (1.0, _mul)}.get(op, (0.0, _add))
        if op in ("ReduceSumSquare", "ReduceL2"):
            term: Body = lambda s, i, x: x * x  # noqa: E731
        elif op == "ReduceL1" and (is_float or not cdt.startswith("u")):
            term = lambda s, i, x: call("abs", x)  # noqa: E731
        else:
            term = lambda s, i, x: x  # noqa: E731
        acc = k.fold("acc", _identity(init, k.dt, cdt), combine, term)
        result = acc
        if op == "ReduceMean":
            result = acc / (k.const(n) if is_float else Const(max(n, 1), cdt))
        elif op == "ReduceL2":
            result = call("sqrt", acc) if is_float else cast(
                call("sqrt", cast(acc, "float64")), cdt)
        elif op == "ReduceLogSum":
            result = call("log", acc)
    with kb.if_then(logical_and(k.lane < 1, k.valid)):
        kb.store(out, (k.row,), cast(result, out.dtype))


def _softmax(k: _RowKernel, log: bool) -> None:
    kb = k.kb
    out = kb.buffer("out", k.dt, k.view.buffer_shape())
    if k.view.rows == 0 or k.view.n == 0:
        return
    top = k.fold("top", k.const(-INF), maximum, lambda s, i, x: x)

    def exp_term(slot, i, x):
        e = kb.declare("e", k.cdt, call("exp", x - top))
        if not log:
            k.update_cache(slot, e)
        return e

    total = k.fold("total", k.const(0), _add, exp_term)
    if log:
        log_total = k.declare("log_total", call("log", total))
        k.sweep(lambda s, i, x: (x - top) - log_total, out=out)
    elif k.cached:
        k.sweep(lambda s, i, e: e / total, out=out)
    else:
        k.sweep(lambda s, i, x: call("exp", x - top) / total, out=out)


def _layernorm(k: _RowKernel) -> None:
    kb, task, cdt = k.kb, k.task, k.cdt
    x_shape = task.inputs[0].shape
    normalized = x_shape[task.attr("axis", -1) % len(x_shape):]

    def side(i: int, name: str) -> Side:
        """Scale or bias: flat when full-size, else broadcast (unidirectionally)."""
        shape = task.inputs[i].shape
        if math.prod(shape) == k.view.n:
            return kb.buffer(name, k.dt, (k.view.n,)), lambda e: (e,), True
        buf = kb.buffer(name, k.dt, shape or (1,))
        return buf, lambda e: tuple(broadcast_index(unravel(e, normalized), shape)) or (0,), False

    sides = [side(1, "scale")] + ([side(2, "bias")] if 2 in task.buffer_inputs else [])
    out = kb.buffer("out", k.dt, k.view.buffer_shape())
    if k.view.rows == 0 or k.view.n == 0:
        return
    n, eps = k.view.n, float(task.attr("epsilon", 1e-5))
    shift = k.declare("shift", k.const(0))
    with kb.if_then(k.valid):
        kb.assign(shift, cast(k.x[k.row, 0], cdt))

    def centred(slot, i, x):
        xk = kb.declare("xk", cdt, x - shift)
        k.update_cache(slot, xk)
        return xk

    d = k.fold("mean", k.const(0), _add, centred)
    kb.assign(d, d / float(n))
    dev = (lambda x: x - d) if k.cached else (lambda x: (x - shift) - d)

    def square(slot, i, x):
        y = kb.declare("dev", cdt, dev(x))
        return y * y

    var = k.fold("var", k.const(0), _add, square)
    inv = k.declare("inv", as_expr(1.0, var) / call("sqrt", var / float(n) + eps))
    if len(sides) == 1:
        k.sweep(lambda s, i, x, g: dev(x) * inv * g, out=out, side=sides)
    else:
        k.sweep(lambda s, i, x, g, b: dev(x) * inv * g + b, out=out, side=sides)


def build_row_kernel(task: Task, cfg: ReduceConfig, name: str) -> Function:
    """The kernel of `cfg` for `task` (see the module docstring)."""
    if task.op not in OPS:
        raise UnsupportedOpError(f"{task.op}: not served by the CUDA reduction template")
    k = _RowKernel(task, cfg, name, view_of(task))
    if task.op in ("Softmax", "LogSoftmax"):
        _softmax(k, task.op == "LogSoftmax")
    elif task.op == "LayerNormalization":
        _layernorm(k)
    else:
        _reduce(k, GLOBAL_POOLS.get(task.op, task.op))
    return k.finish()


class ReduceTemplate:
    name = "cuda.reduce"
    precisions = ("f32", "f16", "bf16")

    def space(self, task: Task, target: Target) -> Sequence[ReduceConfig]:
        return config_space(task.op)

    def default(self, task: Task, target: Target) -> ReduceConfig:
        return default_config(task.op, view_of(task), task.inputs[0].dtype,
                              getattr(target, "sms", 132))

    def build(self, task: Task, config: ReduceConfig, name: str, target: Target) -> Function:
        return build_row_kernel(task, config, name)


TEMPLATE = ReduceTemplate()
