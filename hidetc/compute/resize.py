"""The compute definition of Resize (`RESIZE["Resize"]`): each output element is a
weighted sum of input taps, computed from its index alone (so any injective schedule
and fusion serve it).

Per interpolated axis (`hidetc.graph.ops.resize.resize_spec`, in the reference's order)
the element's output position y gives the source coordinate x_ori in float64 with the
reference's own formula and order of operations (`axis_coords`, shared), ratio =
x_ori - floor(x_ori) (1 at integers), the n taps starting where the reference's
nearest-neighbour window starts (edge-clamped indices) and the mode's coefficients of
ratio (nearest, linear, cubic with cubic_coeff_a, their antialias forms, exclude_outside
renormalization). The value nests the sums like the reference's one-axis-at-a-time
interpolation: the first interpolated axis innermost, extrapolation_value substituted
per axis for tf_crop_and_resize positions outside the input; sums run left to right
in float64 and the result is cast back saturating (integers rounded half to even).
nearest without exclude_outside picks the one tap with coefficient 1 instead (exact in
every dtype, no float64 round trip). Coordinates and ratios are float64 on both targets;
nvcc may contract a coefficient's a*b+c into an fma (an ulp of float64, far below any
tolerance).
"""
from __future__ import annotations

import math

import numpy as np

from hidetc.compute.indexing import Compute, Load, present
from hidetc.compute.task import Task
from hidetc.graph.ops.resize import AxisSpec, axis_coords, resize_spec, tap_count
from hidetc.graph.symbolic import SymDim
from hidetc.tir.ir import (
    Const,
    Expr,
    call,
    cast,
    eq,
    logical_and,
    logical_or,
    maximum,
    minimum,
    select,
)

F64 = "float64"


def _f(value: float) -> Const:
    return Const(float(value), F64)


def _coeffs(attrs: dict, ratio: Expr, scale: float) -> list[Expr]:
    mode = attrs.get("mode", "nearest")
    n, start = tap_count(attrs, scale)
    if mode == "nearest":
        rule = attrs.get("nearest_mode", "round_prefer_floor")
        second = {"round_prefer_floor": ratio > _f(0.5), "round_prefer_ceil": ratio >= _f(0.5),
                  "floor": eq(ratio, _f(1.0)), "ceil": Const(True, "bool")}[rule]
        second = logical_or(second, eq(ratio, _f(1.0)))
        return [select(second, _f(0.0), _f(1.0)), select(second, _f(1.0), _f(0.0))]
    a = float(attrs.get("cubic_coeff_a", -0.75))
    if not attrs.get("antialias", 0):
        if mode == "linear":
            return [_f(1.0) - ratio, ratio]
        return _cubic(a, ratio, _f(1.0) - ratio)
    s = min(scale, 1.0)
    raw = []
    for i in range(start, start + n):
        x = call("abs", (_f(i) - ratio) * s)
        if mode == "linear":
            raw.append(minimum(maximum(_f(1.0) - x, _f(0.0)), _f(1.0)))
        else:
            near = x * x * x * (a + 2) - x * x * (a + 3) + 1.0
            far = x * x * x * a - x * x * (5 * a) + x * (8 * a) - 4 * a
            raw.append(select(x <= _f(1.0), near, select(x < _f(2.0), far, _f(0.0))))
    return _normalized(raw)


def _cubic(a: float, r: Expr, q: Expr) -> list[Expr]:
    """The reference's four cubic coefficients (ratio r, q = 1 - r)."""
    return [(((r + 1.0) * a - 5 * a) * (r + 1.0) + 8 * a) * (r + 1.0) - 4 * a,
            ((r * (a + 2)) - (a + 3)) * r * r + 1.0,
            ((q * (a + 2)) - (a + 3)) * q * q + 1.0,
            (((q + 1.0) * a - 5 * a) * (q + 1.0) + 8 * a) * (q + 1.0) - 4 * a]


def _normalized(coeffs: list[Expr], guard_zero: bool = False) -> list[Expr]:
    total = coeffs[0]
    for c in coeffs[1:]:
        total = total + c
    if guard_zero:
        total = select(eq(total, _f(0.0)), _f(1.0), total)
    return [c / total for c in coeffs]


def _axis_taps(attrs: dict, a: AxisSpec, y: Expr):
    """(clamped tap indices, coefficients, extrapolated condition or None)."""
    x_ori, bounds = axis_coords(attrs, a, cast(y, F64))
    x_ori = _f(0.0) if x_ori is None else x_ori
    low = call("floor", x_ori)
    ratio = select(eq(x_ori, low), _f(1.0), x_ori - low)
    coeffs = _coeffs(attrs, ratio, a.scale)
    n = len(coeffs)
    pad = math.ceil(n / 2)
    padded = x_ori + float(pad)
    p = call("floor", padded)
    first = cast(p, "int32") + select(eq(padded - p, _f(0.0)), Const(-(n // 2) - pad, "int32"),
                                      Const(-(n // 2) + 1 - pad, "int32"))
    taps = [first + k if k else first for k in range(n)]
    if attrs.get("exclude_outside", 0):
        coeffs = _normalized([select(logical_and(t >= 0, t < a.in_n), c, _f(0.0))
                              for t, c in zip(taps, coeffs)], guard_zero=True)
    clamped = [minimum(maximum(t, Const(0, "int32")), Const(a.in_n - 1, "int32")) for t in taps]
    outside = None if bounds is None else logical_or(x_ori < _f(bounds[0]), x_ori > _f(bounds[1]))
    return clamped, coeffs, outside


def _saturate(value: Expr, dtype: str) -> Expr:
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        if dtype == F64:
            return value
        top = float(np.finfo(dtype).max)
        return cast(minimum(maximum(value, _f(-top)), _f(top)), dtype)
    info = np.iinfo(dtype)
    rounded = call("round", value)
    return cast(minimum(maximum(rounded, _f(info.min)), _f(info.max)), dtype)


def _params(task: Task) -> list:
    out = []
    for i in (1, 2, 3):
        value = task.param(i)
        if value is None or not present(task, i):
            out.append(None)
        elif any(isinstance(v, SymDim) for v in np.ravel(np.asarray(value, dtype=object))):
            out.append(np.asarray(value, dtype=object))   # sizes holding symbolic ones
        else:
            out.append(np.asarray(value, dtype=task.inputs[i].dtype))
    return out


def _resize(task: Task, idx: list[Expr], load: Load) -> Expr:
    attrs = dict(task.attrs)
    spec = resize_spec(attrs, tuple(task.inputs[0].shape), *_params(task))
    taps = {a.axis: _axis_taps(attrs, a, idx[a.axis]) for a in spec.axes}
    order = list(spec.axes)
    extrapolation = _f(float(attrs.get("extrapolation_value", 0.0)))
    if attrs.get("mode", "nearest") == "nearest" and not attrs.get("exclude_outside", 0):
        src = list(idx)
        outside = []
        for a in order:
            clamped, coeffs, out = taps[a.axis]
            src[a.axis] = select(eq(coeffs[1], _f(1.0)), clamped[1], clamped[0])
            outside += [] if out is None else [out]
        value = load(0, src)
        if not outside:
            return value
        cond = outside[0]
        for c in outside[1:]:
            cond = logical_or(cond, c)
        return select(cond, _saturate(extrapolation, value.dtype), value)
    sample = load(0, list(idx))

    def weighted(level: int, src: list[Expr]) -> Expr:
        if level < 0:
            return cast(load(0, src), F64)
        a = order[level]
        clamped, coeffs, out = taps[a.axis]
        total: Expr | None = None
        for t, c in zip(clamped, coeffs):
            s = list(src)
            s[a.axis] = t
            term = weighted(level - 1, s) * c
            total = term if total is None else total + term
        return total if out is None else select(out, extrapolation, total)

    return _saturate(weighted(len(order) - 1, list(idx)), sample.dtype)


RESIZE: dict[str, Compute] = {"Resize": _resize}
