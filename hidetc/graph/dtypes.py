"""Dtype facts the graph's rules need, and the numpy references of BitCast and of the
Cast to and from the narrow types (float8, float4, int4, int2): the catalogue's
references, constant folding and the IR interpreter use these; `compute.bitcast` and
`compute.narrow_types` build the kernels' expressions on the same facts.

`WIDTHS`: each dtype's bit width as BitCast reads it (storage as hidetc keeps it: a
narrow type is its bits zero-extended in a byte; bool one byte). `reference_bitcast` is
numpy's view of the bytes (bool: nonzero bytes); `reference_cast` is onnx.reference's
Cast, with the kernels' wrapping of floats to the narrow integers.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

WIDTHS: dict[str, int] = {
    **dict.fromkeys(("float64", "int64", "uint64"), 64),
    **dict.fromkeys(("float32", "int32", "uint32"), 32),
    **dict.fromkeys(("float16", "bfloat16", "int16", "uint16"), 16),
    **dict.fromkeys(("int8", "uint8", "bool", "float8_e4m3fn", "float8_e4m3fnuz",
                     "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"), 8),
    **dict.fromkeys(("int4", "uint4", "float4_e2m1fn"), 4),
    **dict.fromkeys(("int2", "uint2"), 2),
}
FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
NARROW_FLOATS = FLOAT8 + ("float4_e2m1fn", "float8_e8m0fnu")
NARROW_INTS = ("int4", "uint4", "int2", "uint2")
NARROW_DTYPES = NARROW_FLOATS + NARROW_INTS
ROUND_MODES = ("up", "down", "nearest")

_INT_BITS = {"int4": (4, True), "uint4": (4, False), "int2": (2, True), "uint2": (2, False)}


def width_mismatch(src: str, dst: str) -> str | None:
    """Why `src` cannot be bitcast to `dst` (None when it can)."""
    if src not in WIDTHS:
        return f"{src} has no bit width BitCast reads"
    if dst not in WIDTHS:
        return f"to={dst} is not a type BitCast writes"
    if WIDTHS[src] != WIDTHS[dst]:
        return (f"the input is {src} ({WIDTHS[src]} bits) and to={dst} is {WIDTHS[dst]} "
                f"bits: BitCast needs the same width")
    return None


def reference_bitcast(x: np.ndarray, dst: str) -> np.ndarray:
    """The numpy view of `x`'s bytes as `dst` (bool: nonzero bytes), same shape."""
    x = np.asarray(x)
    if not x.flags.c_contiguous:
        x = x.copy()
    if dst == "bool":
        return x.view(np.uint8) != 0
    return x.view(np.dtype(dst))


def reference_cast(x: np.ndarray, to: str, saturate: bool = True,
                   round_mode: str = "up") -> np.ndarray:
    """numpy Cast with the ONNX rules (onnx.reference's Cast). A symbolic shape value
    (an object array of ints and SymDims) stays one when cast to an integer type."""
    x = np.asarray(x)
    if x.dtype == object and np.dtype(to).kind in "iu":
        return x.copy()
    if to == "float8_e8m0fnu":
        return _e8m0(x.astype(np.float32), saturate, round_mode)
    if to in FLOAT8 and saturate:
        info = ml_dtypes.finfo(to)
        wide = x.astype(np.float64)
        return np.clip(wide, float(info.min), float(info.max)).astype(to)
    if to in NARROW_INTS and x.dtype.kind == "f":   # spelled out: ml_dtypes 0.7 changed it
        return _wrap_int(x, to)
    return x.astype(to)


def _wrap_int(x: np.ndarray, to: str) -> np.ndarray:
    """Float -> INT4/UINT4/INT2/UINT2 as the kernels do it: truncated toward zero to
    int32 (NaN and values outside int32 give 0), then the low bits, wrapped."""
    width, signed = _INT_BITS[to]
    wide = x.astype(np.float64)
    ok = np.isfinite(wide) & (wide > -2147483649.0) & (wide < 2147483648.0)
    low = np.trunc(np.where(ok, wide, 0.0)).astype(np.int64) & ((1 << width) - 1)
    if signed:
        low = np.where(low >= 1 << (width - 1), low - (1 << width), low)
    return low.astype(np.int8).astype(to)


def _e8m0(x: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    bits = x.view(np.uint32)
    e = ((bits >> 23) & 0xFF).astype(np.uint16)
    if round_mode == "up":
        inc = (bits & 0x7FFFFF) != 0
    elif round_mode == "nearest":
        inc = ((bits & 0x400000) != 0) & (((bits & 0x200000) != 0) | ((bits & 0x1FFFFF) != 0)
                                          | (e > 0))
    elif round_mode == "down":
        inc = np.zeros(e.shape, bool)
    else:
        raise ValueError(f"Cast round_mode must be one of {ROUND_MODES}, got {round_mode!r}")
    inc &= e != 0xFF
    if saturate:
        inc &= e != 0xFE
    return (e + inc).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
