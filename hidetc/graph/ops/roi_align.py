"""RoiAlign (INJECTIVE), opset-16/22 form: X [N, C, H, W], rois [R, 4] (x1, y1, x2, y2 in
X's coordinates before spatial_scale), batch_indices [R] (int64) -> Y [R, C, OH, OW];
attributes mode (avg, max), output_height/output_width, sampling_ratio, spatial_scale,
coordinate_transformation_mode (half_pixel, output_half_pixel; the importer gives
opset 10's nodes output_half_pixel, their only behaviour).

Semantics of onnx's reference (and ONNX Runtime), per roi r, output bin (ph, pw):
  - start = rois[r] * spatial_scale - (0.5 if half_pixel else 0); roi size = end -
    start, at least 1 with output_half_pixel; bin = size / OH (OW);
  - s x s sample points (s = sampling_ratio) at y = start_y + ph * bin_h + (iy + 0.5) *
    bin_h / s (x likewise); a point with y < -1, y > H, x < -1 or x > W counts 0;
    otherwise y = max(y, 0), y_low = floor(y), y_high = y_low + 1, both H - 1 (and y =
    H - 1) once y_low >= H - 1; weights hy = 1 - ly, ly = y - y_low (x likewise);
  - avg: the mean over the s*s points of hy*hx*X[y_low, x_low] + hy*lx*X[y_low, x_high] +
    ly*hx*X[y_high, x_low] + ly*lx*X[y_high, x_high]; max: the maximum over the points
    of the largest of those four weighted terms (not of their sum: the reference's
    definition, which ONNX Runtime shares).
Coordinates, weights and sums are float64, the result cast to X's dtype once.
sampling_ratio 0 ("adaptive": ceil(roi size / output size) points, which depends on the
rois' values) is refused: the tap count of a compiled kernel is fixed. A batch index is
clamped into [0, N) (the reference would fail on one outside).
"""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import FLOAT_DTYPES, TensorType
from hidetc.graph.ops.common import arity, dtype_in, fail, fmt
from hidetc.graph.ops.registry import OpKind, define

MODES = ("avg", "max")
TRANSFORMS = ("half_pixel", "output_half_pixel")


def check(types, attrs: dict) -> tuple[int, ...]:
    """Validate inputs and attributes (ShapeError); returns the output shape."""
    op = "RoiAlign"
    arity(op, types, 3)
    dtype_in(op, types, 0, FLOAT_DTYPES)
    dtype_in(op, types, 1, FLOAT_DTYPES)
    dtype_in(op, types, 2, ("int64", "int32"))
    if attrs.get("mode", "avg") not in MODES:
        fail(op, f"mode={attrs.get('mode')!r}, expected avg or max")
    if attrs.get("coordinate_transformation_mode", "half_pixel") not in TRANSFORMS:
        fail(op, f"coordinate_transformation_mode="
                 f"{attrs.get('coordinate_transformation_mode')!r}, expected half_pixel or "
                 f"output_half_pixel")
    x, rois, idx = (t.shape for t in types)
    if len(x) != 4:
        fail(op, f"input X has shape {fmt(x)}, expected [N, C, H, W]")
    if len(rois) != 2 or rois[1] != 4 or idx != rois[:1]:
        fail(op, f"rois {fmt(rois)} and batch_indices {fmt(idx)}: expected [R, 4] and [R]")
    oh, ow = (int(attrs.get(k, 1)) for k in ("output_height", "output_width"))
    if oh < 1 or ow < 1:
        fail(op, f"output_height {oh} and output_width {ow} must be >= 1")
    if int(attrs.get("sampling_ratio", 0)) < 1:
        fail(op, f"sampling_ratio={int(attrs.get('sampling_ratio', 0))}: the adaptive "
                 f"sample count (0) depends on each roi's size at run time; a positive "
                 f"sampling_ratio is supported")
    return (rois[0], x[1], oh, ow)


def _axis_taps(start, bin_size, out: int, s: int, size: int):
    """Per output position and sample (numpy, shape [R, out, s]): (valid, low, high,
    weight of low, weight of high) along one axis, the reference's rules."""
    p = np.arange(out, dtype=np.float64)[None, :, None]
    i = np.arange(s, dtype=np.float64)[None, None, :]
    start, bin_size = start[:, None, None], bin_size[:, None, None]
    v = start + p * bin_size + (i + 0.5) * bin_size / s
    valid = (v >= -1.0) & (v <= size)
    v = np.maximum(v, 0.0)
    at_end = np.floor(v) >= size - 1
    low = np.where(at_end, size - 1, np.minimum(np.floor(v), size - 1)).astype(np.int64)
    high = np.where(at_end, size - 1, low + 1)
    v = np.where(at_end, low, v)
    frac = v - low
    return valid, low, high, 1.0 - frac, frac


def _roi_geometry(rois: np.ndarray, attrs: dict):
    """(start_y, start_x, bin_h, bin_w) per roi, float64."""
    scale = float(attrs.get("spatial_scale", 1.0))
    half = attrs.get("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    r = rois.astype(np.float64) * scale - (0.5 if half else 0.0)
    width, height = r[:, 2] - r[:, 0], r[:, 3] - r[:, 1]
    if not half:
        width, height = np.maximum(width, 1.0), np.maximum(height, 1.0)
    oh, ow = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    return r[:, 1], r[:, 0], height / oh, width / ow


def _roi_align_ref(inputs, attrs):
    x, rois, batch = inputs
    types = [TensorType(str(a.dtype), a.shape) for a in inputs]
    _, c, oh, ow = check(types, attrs)
    s = int(attrs["sampling_ratio"])
    h, w = x.shape[2:]
    sy, sx, bh, bw = _roi_geometry(rois, attrs)
    vy, y0, y1, hy, ly = _axis_taps(sy, bh, oh, s, h)          # [R, OH, s]
    vx, x0, x1, hx, lx = _axis_taps(sx, bw, ow, s, w)          # [R, OW, s]
    b = np.clip(batch.astype(np.int64), 0, x.shape[0] - 1)
    data = np.moveaxis(x, 1, -1).astype(np.float64)           # [N, H, W, C]
    bb = b[:, None, None, None, None]
    ys = [(y0, hy), (y1, ly)]
    xs = [(x0, hx), (x1, lx)]
    terms = []
    for yi, wy in ys:
        for xi, wx in xs:
            value = data[bb, yi[:, :, :, None, None], xi[:, None, None, :, :]]
            weight = wy[:, :, :, None, None] * wx[:, None, None, :, :]
            terms.append(weight[..., None] * value)           # [R, OH, s, OW, s, C]
    valid = (vy[:, :, :, None, None] & vx[:, None, None, :, :])[..., None]
    if attrs.get("mode", "avg") == "max":
        sample = np.where(valid, np.maximum.reduce(terms), 0.0)
        out = sample.max(axis=(2, 4))
    else:
        sample = np.where(valid, terms[0] + terms[1] + terms[2] + terms[3], 0.0)
        out = sample.sum(axis=(2, 4)) / (s * s)
    return [np.moveaxis(out, -1, 1).astype(x.dtype)]         # [R, C, OH, OW]


def _roi_align_infer(types, attrs, values):
    return [TensorType(types[0].dtype, check(types, attrs))]


define("RoiAlign", OpKind.INJECTIVE, _roi_align_infer, _roi_align_ref)
