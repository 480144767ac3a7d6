"""The compute definition of GridSample (`GRID_SAMPLE["GridSample"]`): each output
element Y[n, c, o1..ok] is computed from its index alone (so any injective schedule and
fusion serve it), with the semantics of `hidetc.graph.ops.grid_sample` (shared: the
checks, bounds, denormalization and cubic coefficients).

Per spatial axis i (size d) the grid value g = grid[n, o1..ok, k-1-i] gives the float64
coordinate x = g * scale + offset, rounded half to even for nearest (rint). Taps:
  - nearest: x clamped to [0, d - 1] (border) or reflected into [lo, hi] (reflection,
    below), then the index trunc(x); with zeros a coordinate outside [0, d - 1] reads 0;
  - linear / cubic: x padded (border: a coordinate outside [lo, hi] becomes 0 or d - 1;
    for linear without align_corners x is clamped to [-1, d] instead, which reads the
    same taps; reflection: reflected; zeros: clamped to [-3, d + 2], beyond which every
    tap reads 0 anyway), y = x + 4 > 0, the taps p = floor(y) - 4 + j (j in 0..1 /
    -1..2) with weights (1 - t, t) / Keys' coefficients of t = fmod(y, 1) (exactly
    y - floor(y): taps and weights agree at integers); zeros: a tap outside [0, d - 1]
    contributes 0; border: the index clamped; reflection: the reflected tap.
Reflection is hi - |fmod(|x - lo|, 2 span) - span| (span = hi - lo; lo when span is 0):
x appears once in the tree, and it is exact on the half-integer positions of nearest
and of taps (a coordinate inside [lo, hi] maps to itself up to an ulp; interpolation
is continuous there). The sums nest like the reference's interpolation: the last
spatial axis innermost, each tap's term select(valid, weight * inner, 0); the float64
result is cast to X's dtype once. Indices are int32, clamped into [0, d) in float64
before the cast (huge coordinates) and as integers after it (NaN). Expressions are
trees (no common subexpressions): a k-d cubic sample has 4^k loads, each with k index
expressions, so 3-D cubic kernels are large (~150 KB of C).
"""
from __future__ import annotations

from typing import Optional

from hidetc.compute.indexing import Compute, Load
from hidetc.compute.task import Task
from hidetc.graph.ops.grid_sample import bounds, check, cubic_coeffs, denormalize_coeffs
from hidetc.tir.ir import (
    Const,
    Expr,
    as_expr,
    call,
    cast,
    logical_and,
    maximum,
    minimum,
    select,
)

F64 = "float64"
I32 = "int32"
SHIFT = 4.0   # linear/cubic: taps from floor(x + SHIFT) with x + SHIFT > 0 (see _axis_taps)
Tap = tuple[Expr, Optional[Expr], Optional[Expr]]   # (index, weight, valid)


def _f(value: float) -> Const:
    return Const(float(value), F64)


def _i(value: int) -> Const:
    return Const(int(value), I32)


def _reflect(x: Expr, lo: float, hi: float) -> Expr:
    """x reflected at lo and hi until inside: hi - |fmod(|x - lo|, 2 span) - span| (x once
    in the tree; exact for the half-integer positions of taps and of nearest)."""
    span = hi - lo
    if span == 0:
        return _f(lo)
    u = call("abs", x - lo if lo else x)
    return _f(hi) - call("abs", call("fmod", u, _f(2 * span)) - span)


def _padded(x: Expr, d: int, attrs: dict) -> Expr:
    """The coordinate after padding_mode: border clamps a coordinate outside [lo, hi] to
    [0, d - 1], reflection reflects it, zeros leaves it (clamped to [-3, d + 2] here: every
    tap of a coordinate beyond that reads 0 either way)."""
    align = bool(attrs.get("align_corners", 0))
    lo, hi = bounds(d, align)
    padding = attrs.get("padding_mode", "zeros")
    if padding == "border":
        if align:   # [lo, hi] == [0, d - 1]: the clamp is the identity inside
            return minimum(maximum(x, _f(0.0)), _f(d - 1))
        if attrs.get("mode", "linear") == "linear":
            # both taps of any x in [-1, 0] read element 0 (and of [d - 1, d] element
            # d - 1): clamping to [-1, d] instead of [0, d - 1] changes no result
            return minimum(maximum(x, _f(-1.0)), _f(d))
        return select(x < _f(lo), _f(0.0), select(x > _f(hi), _f(d - 1), x))
    if padding == "reflection":
        return _reflect(x, lo, hi)
    return minimum(maximum(x, _f(-3.0)), _f(d + 2))


def clamped_index(p: Expr, d: int) -> Expr:
    """int32 index of the integer-valued position p, clamped into [0, d) (before the cast
    against overflow, after it against NaN)."""
    i = cast(minimum(maximum(p, _f(0.0)), _f(d - 1)), I32)
    return minimum(maximum(i, _i(0)), _i(d - 1))


def _inside(p: Expr, d: int) -> Expr:
    """p (integer-valued) in [0, d - 1], with p once in the tree."""
    half = (d - 1) / 2.0
    return call("abs", p - half if half else p) <= _f(half)


def _axis_taps(attrs: dict, g: Expr, d: int) -> list[Tap]:
    align = bool(attrs.get("align_corners", 0))
    lo, hi = bounds(d, align)
    scale, offset = denormalize_coeffs(d, align)
    x = cast(g, F64) * scale + offset
    mode = attrs.get("mode", "linear")
    padding = attrs.get("padding_mode", "zeros")
    if mode == "nearest":
        x = call("round", x)
        if padding == "border":
            x = minimum(maximum(x, _f(0.0)), _f(d - 1))
        elif padding == "reflection":
            x = _reflect(x, lo, hi)
        return [(clamped_index(x, d), None, _inside(x, d) if padding == "zeros" else None)]
    # y > 0, so fmod(y, 1) is y - floor(y) exactly, and both come from the same y
    y = _padded(x, d, attrs) + SHIFT
    t = call("fmod", y, _f(1.0))
    weights = [_f(1.0) - t, t] if mode == "linear" else cubic_coeffs(t)
    first = 0 if mode == "linear" else -1
    taps: list[Tap] = []
    for j, w in enumerate(weights):
        p = call("floor", y) + (first + j - SHIFT)
        if padding == "reflection":
            p = _reflect(p, lo, hi)
        taps.append((clamped_index(p, d), w, _inside(p, d) if padding == "zeros" else None))
    return taps


def _grid_sample(task: Task, idx: list[Expr], load: Load) -> Expr:
    attrs = dict(task.attrs)
    check(task.inputs, attrs)
    shape = task.inputs[0].shape
    k = len(shape) - 2
    n, c, out = idx[0], idx[1], list(idx[2:])
    taps = [_axis_taps(attrs, load(1, [n] + out + [_i(k - 1 - i)]), shape[2 + i])
            for i in range(k)]
    dtype = task.outputs[0].dtype
    if attrs.get("mode", "linear") == "nearest":
        value = load(0, [n, c] + [axis[0][0] for axis in taps])
        valid = [axis[0][2] for axis in taps if axis[0][2] is not None]
        return select(logical_and(*valid), value, cast(as_expr(0), dtype)) if valid else value

    def weighted(level: int, src: list[Expr]) -> Expr:
        if level == k:
            return cast(load(0, [n, c] + src), F64)
        total: Optional[Expr] = None
        for index, weight, valid in taps[level]:
            term = weighted(level + 1, src + [index]) * weight
            if valid is not None:
                term = select(valid, term, _f(0.0))
            total = term if total is None else total + term
        return total

    return cast(weighted(0, []), dtype)


GRID_SAMPLE: dict[str, Compute] = {"GridSample": _grid_sample}
