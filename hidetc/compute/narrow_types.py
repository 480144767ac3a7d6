"""The narrow ONNX element types: float8 (E4M3FN, E4M3FNUZ, E5M2, E5M2FNUZ), FLOAT8E8M0,
FLOAT4E2M1 and the sub-byte integers INT4, UINT4, INT2, UINT2, and the Cast to and
from them.

Representation: a graph dtype per type, named as ml_dtypes names it ("float8_e4m3fn",
"float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn",
"int4", "uint4", "int2", "uint2"), stored one element per byte: the byte is exactly the
ml_dtypes array's byte (the format's bits, zero-extended: int4 -8 is 0x08), so runtime
arrays are exchanged as they are. In kernels a narrow value is that byte (C `uint8_t`)
and only ever moved; arithmetic never sees one: `convert` turns a Cast into calls of
the conversion helpers below (`C_SOURCE`, plain C that is also valid CUDA device code
once prefixed).

Conversions (what onnx.reference's Cast computes, i.e. ml_dtypes `astype` plus the
ONNX `saturate` / `round_mode` rules):
  - to a float8/float4: from the source value as a double (exact for every source
    float), round to nearest even. saturate=1 (float8 only) first clips to the finite
    range [-max, max] (so +-inf -> +-max); NaN stays NaN. Without saturation a
    value rounding above max becomes inf (E5M2) or NaN (E4M3FN and the FNUZ types);
    FLOAT4E2M1 has neither and always saturates (NaN -> the zero of the opposite sign:
    ml_dtypes' choice, what the ONNX test data expects). The
    FNUZ types have no negative zero (-0 and negative underflow give +0).
  - to FLOAT8E8M0: onnx.numpy_helper.to_float8e8m0 on the float32 value: the biased
    float32 exponent (the sign is ignored), rounded up when any mantissa bit is set
    (round_mode "up"), by the guard/round/sticky rule ("nearest") or never ("down");
    inf/NaN -> 0xFF (NaN); saturate=1 keeps 0xFE from rounding up into NaN.
  - to INT4/UINT4/INT2/UINT2: C truncation to int32 (NaN and values outside int32 give
    0; integer sources are taken as int64), then the low 4 or 2 bits (wrapping).
  - from a narrow type: the exact value as float32 (ints as int32), then an ordinary
    cast to the target.
`reference_cast` is the same on numpy arrays (for constant folding and the oracle).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hidetc.graph.dtypes import (
    _INT_BITS,
    FLOAT8,
    NARROW_DTYPES,
    NARROW_FLOATS,
    NARROW_INTS,
    ROUND_MODES,
    reference_cast,
)
from hidetc.tir.ir import Call, Expr, cast

__all__ = ["FLOAT8", "NARROW_DTYPES", "NARROW_FLOATS", "NARROW_INTS", "ROUND_MODES",
           "C_FUNCTIONS", "C_SOURCE", "cast_function", "convert", "decode", "encode",
           "reference_cast"]

# float format -> (exponent bits, mantissa bits, bias, max finite, NaN encoding kind)
#   kind "fn": all-ones exponent and mantissa is NaN, no inf; "fnuz": 0x80 is NaN, no
#   inf, no -0; "ieee": IEEE inf/NaN; "none": no special values.
_FORMATS = {
    "float8_e4m3fn": (4, 3, 7, 448.0, "fn"),
    "float8_e4m3fnuz": (4, 3, 8, 240.0, "fnuz"),
    "float8_e5m2": (5, 2, 15, 57344.0, "ieee"),
    "float8_e5m2fnuz": (5, 2, 16, 57344.0, "fnuz"),
    "float4_e2m1fn": (2, 1, 1, 6.0, "none"),
}
_COMMON = """\
static inline float hidetc_fp_decode(uint32_t b, int eb, int mb, int bias) {
  uint32_t e = (b >> mb) & ((1u << eb) - 1u), m = b & ((1u << mb) - 1u);
  float v = e == 0 ? ldexpf((float)m, 1 - bias - mb)
                   : ldexpf((float)(m | (1u << mb)), (int)e - bias - mb);
  return ((b >> (eb + mb)) & 1u) ? -v : v;
}
/* |x| rounded to nearest even on a grid of eb exponent / mb mantissa bits, encoded
   without the sign; returns -1 when the rounded value exceeds maxv */
static inline int hidetc_fp_encode_abs(double a, int eb, int mb, int bias, double maxv) {
  int k;
  if (a == 0.0) return 0;
  frexp(a, &k);                       /* a = f * 2^k, f in [0.5, 1) */
  int e = k - 1 < 1 - bias ? 1 - bias : k - 1;
  double q = ldexp(1.0, e - mb);
  double r = rint(a / q) * q;
  if (r > maxv) return -1;
  if (r == 0.0) return 0;
  frexp(r, &k);
  int be = k - 1 + bias;
  if (be <= 0) return (int)(r / ldexp(1.0, 1 - bias - mb));
  return (be << mb) | ((int)(r / ldexp(1.0, k - 1 - mb)) - (1 << mb));
}
static inline uint8_t hidetc_fp_encode(double x, int eb, int mb, int bias, double maxv,
                                       int sat, int kind) {
  /* kind: 0 fn, 1 fnuz, 2 ieee, 3 none (see hidetc.compute.narrow_types) */
  uint32_t sign = signbit(x) ? 1u << (eb + mb) : 0u;
  uint32_t all = (1u << (eb + mb + 1)) - 1u;
  double a = fabs(x);
  if (isnan(x)) return (uint8_t)(kind == 1 ? 0x80u : kind == 3 ? (sign ^ (1u << (eb + mb))) :
                                 sign | (all >> 1));
  if (sat || kind == 3) a = a > maxv ? maxv : a;
  int bits = isinf(a) ? -1 : hidetc_fp_encode_abs(a, eb, mb, bias, maxv);
  if (bits < 0) return (uint8_t)(kind == 2 ? sign | (((1u << eb) - 1u) << mb) :
                                 kind == 0 ? all : 0x80u);
  if (bits == 0 && kind == 1) return 0;
  return (uint8_t)(sign | (uint32_t)bits);
}
static inline uint8_t hidetc_e8m0_encode(float x, int mode, int sat) {
  /* mode: 0 up, 1 down, 2 nearest (onnx.numpy_helper.to_float8e8m0) */
  union { float f; uint32_t u; } v; v.f = x;
  uint32_t e = (v.u >> 23) & 0xFFu;
  if (e == 0xFFu) return 0xFF;
  uint32_t inc = 0;
  if (mode == 0) inc = (v.u & 0x7FFFFFu) != 0;
  if (mode == 2) inc = (v.u & 0x400000u) && ((v.u & 0x200000u) || (v.u & 0x1FFFFFu) || e > 0);
  if (sat && e == 0xFEu) inc = 0;
  return (uint8_t)(e + inc);
}
static inline int32_t hidetc_int_trunc(double x) {
  return (x > -2147483649.0 && x < 2147483648.0) ? (int32_t)x : 0;
}
"""
_KIND = {"fn": 0, "fnuz": 1, "ieee": 2, "none": 3}


def _float_helpers(name: str) -> str:
    eb, mb, bias, maxv, kind = _FORMATS[name]
    bits = eb + mb + 1
    if kind == "fn":
        nan = f"(b & 0x{(1 << (bits - 1)) - 1:X}u) == 0x{(1 << (bits - 1)) - 1:X}u"
    elif kind == "fnuz":
        nan = "b == 0x80u"
    elif kind == "ieee":
        nan = f"(b & 0x7Fu) > 0x{((1 << eb) - 1) << mb:X}u"
    else:
        nan = "0"
    inf = (f"(b & 0x7Fu) == 0x{((1 << eb) - 1) << mb:X}u ? ((b & 0x80u) ? -INFINITY : "
           "INFINITY) : " if kind == "ieee" else "")
    lines = [f"static inline float hidetc_decode_{name}(uint8_t b) {{",
             f"  return ({nan}) ? NAN : {inf}hidetc_fp_decode(b, {eb}, {mb}, {bias});", "}"]
    for sat in (0, 1):
        lines += [f"static inline uint8_t hidetc_encode_{name}{'_sat' if sat else ''}"
                  "(double x) {",
                  f"  return hidetc_fp_encode(x, {eb}, {mb}, {bias}, {maxv!r}, {sat}, "
                  f"{_KIND[kind]});", "}"]
    return "\n".join(lines) + "\n"


def _e8m0_helpers() -> str:
    lines = ["static inline float hidetc_decode_float8_e8m0fnu(uint8_t b) {",
             "  return b == 0xFFu ? NAN : ldexpf(1.0f, (int)b - 127);", "}"]
    for mode_index, mode in enumerate(ROUND_MODES):
        for sat in (0, 1):
            lines += [f"static inline uint8_t hidetc_encode_float8_e8m0fnu_{mode}"
                      f"{'_sat' if sat else ''}(float x) {{",
                      f"  return hidetc_e8m0_encode(x, {mode_index}, {sat});", "}"]
    return "\n".join(lines) + "\n"


def _int_helpers(name: str) -> str:
    width, signed = _INT_BITS[name]
    mask = (1 << width) - 1
    shift = 8 - width
    decode = (f"(int32_t)((int8_t)(uint8_t)(b << {shift}) >> {shift})" if signed
              else f"(int32_t)(b & {mask}u)")
    return "\n".join([
        f"static inline int32_t hidetc_decode_{name}(uint8_t b) {{ return {decode}; }}",
        f"static inline uint8_t hidetc_encode_{name}(double x) {{",
        f"  return (uint8_t)((uint32_t)hidetc_int_trunc(x) & {mask}u);", "}",
        f"static inline uint8_t hidetc_encode_{name}_int(int64_t x) {{",
        f"  return (uint8_t)((uint64_t)x & {mask}u);", "}"]) + "\n"


C_SOURCE = _COMMON + "".join(_float_helpers(n) for n in _FORMATS) + _e8m0_helpers() + \
    "".join(_int_helpers(n) for n in NARROW_INTS)
C_FUNCTIONS = frozenset(
    [f"hidetc_decode_{n}" for n in NARROW_DTYPES]
    + [f"hidetc_encode_{n}{s}" for n in _FORMATS for s in ("", "_sat")]
    + [f"hidetc_encode_float8_e8m0fnu_{m}{s}" for m in ROUND_MODES for s in ("", "_sat")]
    + [f"hidetc_encode_{n}{s}" for n in NARROW_INTS for s in ("", "_int")])


def _is_int(dtype: str) -> bool:
    return dtype == "bool" or np.issubdtype(np.dtype(dtype), np.integer)


def decode(x: Expr) -> Expr:
    """A narrow value as its exact float32 (int32 for the integer types)."""
    out = "int32" if x.dtype in NARROW_INTS else "float32"
    return Call(f"hidetc_decode_{x.dtype}", (x,), out)


def encode(x: Expr, to: str, saturate: bool = True, round_mode: str = "up") -> Expr:
    """A non-narrow value converted to narrow type `to` (see the module docstring)."""
    if to in NARROW_INTS:
        if _is_int(x.dtype):
            return Call(f"hidetc_encode_{to}_int", (cast(x, "int64"),), to)
        return Call(f"hidetc_encode_{to}", (cast(x, "float64"),), to)
    sat = "_sat" if saturate and to in FLOAT8 + ("float8_e8m0fnu",) else ""
    if to == "float8_e8m0fnu":
        if round_mode not in ROUND_MODES:
            raise ValueError(f"Cast round_mode must be one of {ROUND_MODES}, got "
                             f"{round_mode!r}")
        return Call(f"hidetc_encode_{to}_{round_mode}{sat}", (cast(x, "float32"),), to)
    return Call(f"hidetc_encode_{to}{sat}", (cast(x, "float64"),), to)


def convert(x: Expr, to: str, attrs: Any = None) -> Expr:
    """Cast `x` to dtype `to` with the ONNX Cast rules; `attrs` may hold `saturate`
    (default 1) and `round_mode` (default "up"). Without narrow types a plain cast."""
    attrs = attrs or {}
    if x.dtype == to:
        return x
    if x.dtype not in NARROW_DTYPES and to not in NARROW_DTYPES:
        return cast(x, to)
    if x.dtype in NARROW_DTYPES:
        x = decode(x)
        if to not in NARROW_DTYPES:
            return cast(x, to)
    return encode(x, to, bool(attrs.get("saturate", 1)), str(attrs.get("round_mode", "up")))


def cast_function(src: str, dst: str) -> str | None:
    """The C helper a plain Cast from `src` to `dst` needs (only decoding is plain:
    casts to a narrow type carry ONNX attributes, see `convert`), else None."""
    return f"hidetc_decode_{src}" if src in NARROW_DTYPES and dst not in NARROW_DTYPES \
        else None
