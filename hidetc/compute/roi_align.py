"""The compute definition of RoiAlign (`ROI_ALIGN["RoiAlign"]`): each output element
Y[r, c, ph, pw] from its index alone, with the semantics of `hidetc.graph.ops.roi_align`
(its `check`; the same formulas in float64, the result cast to X's dtype once).

The roi's start and bin size come from loads of rois[r] (and batch_indices[r], clamped
into [0, N)); per axis each of the s samples gives (valid, low, high, weights) as in the
reference; avg sums over the s*s points select(valid_y && valid_x, hy*hx*X[y_low,
x_low] + hy*lx*X[y_low, x_high] + ly*hx*X[y_high, x_low] + ly*lx*X[y_high, x_high], 0)
and divides by s*s; max takes the maximum over the points of the largest weighted
corner term (0 for a point outside). Indices are int32, clamped into [0, size) as
GridSample's are (`grid_sample.clamped_index`: in float64 before the cast, as integers
after it). Expressions are trees:
s*s*4 loads of X, each with its index expressions (s = 2: 16), so a large sampling_ratio
makes a large kernel.
"""
from __future__ import annotations

from hidetc.compute.grid_sample import F64, I32, clamped_index
from hidetc.compute.indexing import Load
from hidetc.compute.task import Task
from hidetc.graph.ops.roi_align import check
from hidetc.tir.ir import Const, Expr, call, cast, logical_and, maximum, minimum, select


def _f(v: float) -> Expr:
    return Const(float(v), F64)


def _i(v: int) -> Expr:
    return Const(int(v), I32)


def _samples(start: Expr, bin_size: Expr, p: Expr, s: int, size: int
             ) -> list[tuple[Expr, list[tuple[Expr, Expr]]]]:
    """Per sample along one axis: (valid, [(low index, weight), (high index, weight)])."""
    out = []
    for i in range(s):
        v = start + cast(p, F64) * bin_size + _f(i + 0.5) * bin_size / _f(s)
        valid = logical_and(v >= _f(-1.0), v <= _f(size))
        v = maximum(v, _f(0.0))
        floor = call("floor", v)
        at_end = floor >= _f(size - 1)
        low = select(at_end, _f(size - 1), floor)
        frac = select(at_end, _f(0.0), v - low)
        high = select(at_end, _f(size - 1), low + _f(1.0))
        out.append((valid, [(clamped_index(low, size), _f(1.0) - frac),
                            (clamped_index(high, size), frac)]))
    return out


def _roi_align(task: Task, idx: list[Expr], load: Load) -> Expr:
    attrs = dict(task.attrs)
    check(task.inputs, attrs)
    n, _, h, w = task.inputs[0].shape
    oh, ow = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    s = int(attrs["sampling_ratio"])
    scale = float(attrs.get("spatial_scale", 1.0))
    half = attrs.get("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    r, c, ph, pw = idx
    coords = [cast(load(1, [r, _i(k)]), F64) * _f(scale) - _f(0.5 if half else 0.0)
              for k in range(4)]
    width, height = coords[2] - coords[0], coords[3] - coords[1]
    if not half:
        width, height = maximum(width, _f(1.0)), maximum(height, _f(1.0))
    batch = cast(load(2, [r]), I32)
    batch = minimum(maximum(batch, _i(0)), _i(n - 1))
    ys = _samples(coords[1], height / _f(oh), ph, s, h)
    xs = _samples(coords[0], width / _f(ow), pw, s, w)
    is_max = attrs.get("mode", "avg") == "max"
    total = None
    for valid_y, taps_y in ys:
        for valid_x, taps_x in xs:
            terms = [wy * wx * cast(load(0, [batch, c, iy, ix]), F64)
                     for iy, wy in taps_y for ix, wx in taps_x]
            if is_max:
                value = maximum(maximum(terms[0], terms[1]), maximum(terms[2], terms[3]))
            else:
                value = terms[0] + terms[1] + terms[2] + terms[3]
            value = select(logical_and(valid_y, valid_x), value, _f(0.0))
            total = value if total is None else (maximum(total, value) if is_max
                                                 else total + value)
    if not is_max:
        total = total / _f(s * s)
    return cast(total, task.outputs[0].dtype)


ROI_ALIGN = {"RoiAlign": _roi_align}
