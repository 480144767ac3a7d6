"""GridSample (INJECTIVE), opset-20/22 form: X [N, C, D1..Dk] sampled at the normalized
coordinates of grid [N, O1..Ok, k] gives Y [N, C, O1..Ok]; attributes mode (linear,
nearest, cubic; the importer maps opset 16's bilinear/bicubic), padding_mode (zeros,
border, reflection) and align_corners (0/1).

Semantics are those of onnx's reference implementation (op_grid_sample.py), axis by
axis (`check` and the constants below are shared with the compute definition,
`hidetc.compute.grid_sample`):
  - the grid's last axis lists the coordinates in reverse dimension order: grid[..., 0]
    is along Dk (the width), grid[..., k-1] along D1;
  - denormalization to x in [lo, hi] (`bounds`): align_corners: x = (g + 1) / 2 (d - 1)
    (lo, hi = 0, d - 1), else x = ((g + 1) d - 1) / 2 (lo, hi = -0.5, d - 0.5);
  - nearest rounds x half to even first; a coordinate outside [lo, hi] is clamped to
    [0, d - 1] (border) or reflected at lo and hi until inside (reflection, period
    2 (hi - lo); with hi == lo it is lo); zeros leaves it;
  - linear reads the taps floor(x) + {0, 1} with weights (1 - t, t), cubic the taps
    floor(x) + {-1, 0, 1, 2} with Keys' coefficients of t (a = -0.75), t = x - floor(x);
    the k axes combine as a tensor product; nearest reads the one tap int(x);
  - a tap i outside [0, d) reads 0 (zeros), the clamped index (border) or the reflected
    index int(reflect(i)) (reflection).
Coordinates, weights and sums are float64; the result is cast to X's dtype once (nearest
copies the element: exact in every dtype). onnx's reference rounds the denormalized
coordinate to float32 and interpolates in X's dtype: results differ by float32 rounding
(a nearest pick only where that rounding moves x across a .5 tie). X may be an integer
tensor with nearest only. The reference divides by zero reflecting a one-element axis
with align_corners; here that axis reads its only element.
"""
from __future__ import annotations

import itertools

import numpy as np

from hidetc.graph.ir import FLOAT_DTYPES, TensorType
from hidetc.graph.ops.common import INTS, arity, dtype_in, fail, fmt
from hidetc.graph.ops.registry import OpKind, define

MODES = ("linear", "nearest", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")
GRID_DTYPES = ("float16", "float32", "float64")
CUBIC_A = -0.75


def check(types, attrs: dict) -> tuple[int, ...]:
    """Validate inputs and attributes (ShapeError); returns the output shape."""
    op = "GridSample"
    arity(op, types, 2)
    mode = attrs.get("mode", "linear")
    if mode not in MODES:
        fail(op, f"mode={mode!r}, expected one of {', '.join(MODES)}")
    padding = attrs.get("padding_mode", "zeros")
    if padding not in PADDING_MODES:
        fail(op, f"padding_mode={padding!r}, expected one of {', '.join(PADDING_MODES)}")
    if int(attrs.get("align_corners", 0)) not in (0, 1):
        fail(op, f"align_corners={attrs.get('align_corners')!r}, expected 0 or 1")
    allowed = FLOAT_DTYPES + (INTS if mode == "nearest" else ())
    dtype_in(op, types, 0, allowed)
    dtype_in(op, types, 1, GRID_DTYPES)
    x, grid = types[0].shape, types[1].shape
    if len(x) < 3:
        fail(op, f"input 0 (X) has shape {fmt(x)}, expected [N,C,D1,...,Dk] with k >= 1")
    k = len(x) - 2
    if len(grid) != k + 2 or grid[0] != x[0] or grid[-1] != k:
        fail(op, f"input 1 (grid) has shape {fmt(grid)}, expected [{x[0]},O1,...,O{k},{k}] "
                 f"for X of shape {fmt(x)}")
    if any(d == 0 for d in x[2:]):
        fail(op, f"input 0 (X) has shape {fmt(x)}, expected non-empty spatial dimensions")
    return (x[0], x[1]) + tuple(grid[1:-1])


def bounds(d: int, align: bool) -> tuple[float, float]:
    """[lo, hi]: where the normalized range [-1, 1] lands on an axis of d elements."""
    return (0.0, d - 1.0) if align else (-0.5, d - 0.5)


def denormalize_coeffs(d: int, align: bool) -> tuple[float, float]:
    """(scale, offset) with x = g * scale + offset."""
    return ((d - 1) / 2.0, (d - 1) / 2.0) if align else (d / 2.0, (d - 1) / 2.0)


def cubic_coeffs(t):
    """Keys' four coefficients of t in [0, 1) (a = -0.75), as the reference writes them."""
    a = CUBIC_A
    s, q, r = t + 1.0, 1.0 - t, 2.0 - t
    return [((a * s - 5 * a) * s + 8 * a) * s - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * q - (a + 3)) * q * q + 1,
            ((a * r - 5 * a) * r + 8 * a) * r - 4 * a]


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    span = hi - lo
    if span == 0:
        return np.full_like(x, lo)
    period = 2 * span
    m = np.mod(x - lo, period)
    return lo + np.where(m <= span, m, period - m)


def _coordinate(g: np.ndarray, d: int, attrs: dict) -> np.ndarray:
    """The sampled coordinate along one axis after rounding (nearest) and padding."""
    align = bool(attrs.get("align_corners", 0))
    scale, offset = denormalize_coeffs(d, align)
    x = g * scale + offset
    if attrs.get("mode", "linear") == "nearest":
        x = np.rint(x)
    lo, hi = bounds(d, align)
    outside = (x < lo) | (x > hi)
    padding = attrs.get("padding_mode", "zeros")
    if padding == "border":
        x = np.where(outside, np.clip(x, 0, d - 1), x)
    elif padding == "reflection":
        x = np.where(outside, _reflect(x, lo, hi), x)
    return x


def _taps(g: np.ndarray, d: int, attrs: dict) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per tap: (index in [0, d), weight, valid) arrays shaped like g."""
    x = _coordinate(g, d, attrs)
    mode = attrs.get("mode", "linear")
    padding = attrs.get("padding_mode", "zeros")
    if mode == "nearest":
        positions, weights = [np.trunc(x)], [np.ones_like(x)]
    else:
        low = np.floor(x)
        t = x - low
        weights = [1.0 - t, t] if mode == "linear" else cubic_coeffs(t)
        first = 0 if mode == "linear" else -1
        positions = [low + (first + j) for j in range(len(weights))]
    taps = []
    for p, w in zip(positions, weights):
        valid = (p >= 0) & (p <= d - 1)
        if padding == "reflection":
            lo, hi = bounds(d, bool(attrs.get("align_corners", 0)))
            p = np.where(valid, p, np.trunc(_reflect(p, lo, hi)))
            valid = np.ones_like(valid)
        elif padding == "border":
            valid = np.ones_like(valid)
        index = np.clip(np.nan_to_num(p), 0, d - 1).astype(np.int64)
        taps.append((index, w, valid))
    return taps


def _grid_sample_ref(inputs, attrs):
    x, grid = inputs[0], inputs[1]
    check([TensorType(str(x.dtype), x.shape), TensorType(str(grid.dtype), grid.shape)], attrs)
    k = x.ndim - 2
    g = grid.astype(np.float64)
    per_axis = [_taps(g[..., k - 1 - i], x.shape[2 + i], attrs) for i in range(k)]
    n_index = np.arange(x.shape[0]).reshape((-1,) + (1,) * k)
    data = np.moveaxis(x, 1, -1)                       # [N, D1..Dk, C]
    nearest = attrs.get("mode", "linear") == "nearest"
    total = None
    for combo in itertools.product(*per_axis):
        where = tuple(index for index, _, _ in combo)
        valid = np.logical_and.reduce([v for _, _, v in combo])
        value = data[(n_index,) + where]                # [N, O1..Ok, C]
        value = np.where(valid[..., None], value, np.zeros((), x.dtype))
        if nearest:
            total = value
            continue
        weight = np.prod([w for _, w, _ in combo], axis=0)
        term = value.astype(np.float64) * weight[..., None]
        total = term if total is None else total + term
    out = np.moveaxis(total, -1, 1)
    return [out.astype(x.dtype)]


def _grid_sample_infer(types, attrs, values):
    return [TensorType(types[0].dtype, check(types, attrs))]


define("GridSample", OpKind.INJECTIVE, _grid_sample_infer, _grid_sample_ref)
