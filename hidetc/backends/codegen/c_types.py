"""C types, constants and helper functions of the cpu printer (`hidetc.backends.codegen.c`).

`C_TYPES` (shared with the CUDA printer) and the cpu-only `CPU_TYPES` (float16 as gcc's
`_Float16`, bfloat16 as its uint16_t bits, a narrow type as its byte); `c_type(dtype)`;
`const_text(Const)` (floats round-trip exactly, NaN/inf as macros, the most negative
integers as expressions, float16 exact through float, bfloat16 as its rounded bits);
`helpers_source()`: the static inline helpers every cpu translation unit carries (NaN
propagating min/max per type, sigmoid, the bfloat16 conversions, the vectorizable float32
math of `c_math` and the narrow-type conversions of `compute.narrow_types`).
"""
from __future__ import annotations

import numpy as np

from hidetc.backends.codegen.c_math import FAST_FLOAT32, MATH_SOURCE
from hidetc.backends.codegen.c_scratch import SCRATCH_SOURCE
from hidetc.compute.narrow_types import C_SOURCE as NARROW_SOURCE
from hidetc.compute.narrow_types import NARROW_DTYPES
from hidetc.tir.ir import FLOATS, Const

C_TYPES = {"bool": "bool", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
           "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t",
           "uint32": "uint32_t", "uint64": "uint64_t", "float32": "float",
           "float64": "double"}
# cpu-only storage types (C_TYPES is shared with the CUDA printer, which types these its
# own way): float16 is gcc's _Float16, bfloat16 its bits, a narrow type its byte
CPU_TYPES = {**C_TYPES, "float16": "_Float16", "bfloat16": "uint16_t",
             **{d: "uint8_t" for d in NARROW_DTYPES}}
HALF = ("float16", "bfloat16")   # computed in float, rounded to the half type per operation

# (`|`, not `||`: no short-circuit branch, so gcc if-converts a lane loop of them and
# vectorizes it -- the same value: both operands are plain comparisons)
_HELPERS_FLOAT = """\
static inline {t} hidetc_max_{d}({t} a, {t} b) {{ return ((a != a) | (a > b)) ? a : b; }}
static inline {t} hidetc_min_{d}({t} a, {t} b) {{ return ((a != a) | (a < b)) ? a : b; }}
static inline {t} hidetc_sigmoid_{d}({t} x) {{ return ({t})1 / (({t})1 + {exp}(-x)); }}
static inline {t} hidetc_rsqrt_{d}({t} x) {{ return ({t})1 / sqrt{s}(x); }}
"""
_HELPERS_INT = """\
static inline {t} hidetc_max_{d}({t} a, {t} b) {{ return a > b ? a : b; }}
static inline {t} hidetc_min_{d}({t} a, {t} b) {{ return a < b ? a : b; }}
"""
_HELPERS_HALF = """\
static inline uint16_t hidetc_h2u(_Float16 h) {
  union { _Float16 h; uint16_t u; } v; v.h = h; return v.u;
}
static inline _Float16 hidetc_u2h(uint16_t u) {
  union { uint16_t u; _Float16 h; } v; v.u = u; return v.h;
}
static inline float hidetc_bf2f(uint16_t h) {
  union { uint32_t u; float f; } v; v.u = (uint32_t)h << 16; return v.f;
}
static inline uint16_t hidetc_f2bf(float f) {
  union { float f; uint32_t u; } v; v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
static inline _Float16 hidetc_max_float16(_Float16 a, _Float16 b) {
  return (a != a || a > b) ? a : b;
}
static inline _Float16 hidetc_min_float16(_Float16 a, _Float16 b) {
  return (a != a || a < b) ? a : b;
}
static inline uint16_t hidetc_max_bfloat16(uint16_t a, uint16_t b) {
  float x = hidetc_bf2f(a), y = hidetc_bf2f(b); return (x != x || x > y) ? a : b;
}
static inline uint16_t hidetc_min_bfloat16(uint16_t a, uint16_t b) {
  float x = hidetc_bf2f(a), y = hidetc_bf2f(b); return (x != x || x < y) ? a : b;
}
"""

def c_type(dtype: str) -> str:
    ctype = CPU_TYPES.get(dtype)
    if ctype is None:
        raise NotImplementedError(f"dtype {dtype!r} has no C type")
    return ctype



def helpers_source() -> str:
    parts = [MATH_SOURCE]
    for d in ("float32", "float64"):
        f32 = d == "float32"
        parts.append(_HELPERS_FLOAT.format(t=C_TYPES[d], d=d, s="f" if f32 else "",
                                           exp=FAST_FLOAT32["exp"] if f32 else "exp"))
    for d in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
              "uint64"):
        parts.append(_HELPERS_INT.format(t=C_TYPES[d], d=d))
    parts.append(_HELPERS_HALF)
    parts.append(NARROW_SOURCE)
    parts.append(SCRATCH_SOURCE)
    parts.append(PARALLEL_SOURCE)
    return "".join(parts)


# Parallel loops (`CPrinter._parallel_for`): the iterations are split into one contiguous
# share per thread, as a static schedule would, so a thread works on the same part of
# the image in kernel after kernel and finds the rows the previous kernel wrote in its
# own core's L2 (with dynamic chunks, half of every activation crossed cores: MobileNet-
# V2's depthwise convs ran no faster on two threads than on one). A thread takes its
# share front to back in chunks, then takes the chunks left in the others' shares from
# their back ends, so a thread the OS deschedules does not hold the kernel up (which a
# plain static schedule would). A share is one 64-bit word (front | back << 32) changed
# by compare-and-swap, one cache line per thread; the team may be smaller or larger
# than `omp_get_max_threads()` says (a kernel called inside a parallel region): every
# thread scans every share before it leaves, so all iterations run exactly once.
PARALLEL_SOURCE = """\
#define HIDETC_PAR_SLOTS 64
typedef struct { uint64_t word; char pad[56]; } __attribute__((aligned(64))) hidetc_par_slot;
typedef struct { hidetc_par_slot slot[HIDETC_PAR_SLOTS]; uint64_t chunk; int n; } hidetc_par_t;
static inline void hidetc_par_init(hidetc_par_t *p, uint64_t extent, uint64_t chunk) {
  int n = 1;
#ifdef _OPENMP
  n = omp_get_max_threads();
#endif
  if (n > HIDETC_PAR_SLOTS) n = HIDETC_PAR_SLOTS;
  if ((uint64_t)n > extent) n = extent > 0 ? (int)extent : 1;
  p->n = n;
  p->chunk = chunk > 0 ? chunk : 1;
  for (int t = 0; t < n; ++t)
    p->slot[t].word = (extent * (t + 1) / n) << 32 | (extent * t / n);
}
static inline int hidetc_par_take(uint64_t *w, int front, uint64_t chunk, int64_t *lo,
                                  int64_t *hi) {
  uint64_t old = __atomic_load_n(w, __ATOMIC_RELAXED), f, b, nw;
  for (;;) {
    f = old & 0xffffffffu;
    b = old >> 32;
    if (f >= b) return 0;
    if (front) {        /* the owner: [f, f + chunk) */
      uint64_t e = b - f > chunk ? f + chunk : b;
      *lo = (int64_t)f; *hi = (int64_t)e; nw = b << 32 | e;
    } else {            /* a thief: [b - chunk, b) */
      uint64_t s = b - f > chunk ? b - chunk : f;
      *lo = (int64_t)s; *hi = (int64_t)b; nw = s << 32 | f;
    }
    if (__atomic_compare_exchange_n(w, &old, nw, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
      return 1;
  }
}
static inline int hidetc_par_next(hidetc_par_t *p, int64_t *lo, int64_t *hi) {
  int n = p->n, me = 0;
#ifdef _OPENMP
  me = omp_get_thread_num() % n;
#endif
  if (hidetc_par_take(&p->slot[me].word, 1, p->chunk, lo, hi)) return 1;
  for (int k = 1; k < n; ++k)
    if (hidetc_par_take(&p->slot[(me + k) % n].word, 0, p->chunk, lo, hi)) return 1;
  return 0;
}
"""


# constants -------------------------------------------------------------------------------
def _float_text(value: float, dtype: str) -> str:
    v = np.dtype(dtype).type(value)
    if np.isnan(v):
        return "NAN" if dtype == "float32" else "((double)NAN)"
    if np.isinf(v):
        inf = "INFINITY" if dtype == "float32" else "((double)INFINITY)"
        return inf if v > 0 else f"(-{inf})"
    text = str(v) if dtype == "float32" else repr(float(v))
    if not any(ch in text for ch in ".en"):
        text += ".0"
    text += "f" if dtype == "float32" else ""
    return f"({text})" if text.startswith("-") else text


_INT_SUFFIX = {"int32": "", "int64": "LL", "uint32": "u", "uint64": "ull"}


def _int_text(value: int, dtype: str) -> str:
    value = int(value)
    info = np.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise ValueError(f"constant {value} does not fit {dtype}")
    if dtype not in _INT_SUFFIX:
        return f"(({c_type(dtype)}){value})"
    if value == info.min and value < 0:  # -2**31 is not a literal in C
        return f"({value + 1}{_INT_SUFFIX[dtype]} - 1)"
    text = f"{value}{_INT_SUFFIX[dtype]}"
    return f"({text})" if value < 0 else text


def const_text(c: Const) -> str:
    if c.dtype == "bool":
        return "true" if c.value else "false"
    if c.dtype == "float16":   # every float16 value is a float32 one: exact
        return f"((_Float16){_float_text(float(np.float16(c.value)), 'float32')})"
    if c.dtype == "bfloat16":  # the bits (round to nearest even, as ml_dtypes)
        bits = int(np.array(c.value, np.float32).astype("bfloat16").view(np.uint16))
        return f"((uint16_t)0x{bits:04x})"
    if c.dtype in NARROW_DTYPES:
        raise NotImplementedError(f"a {c.dtype} constant in a kernel (narrow types are "
                                  "only moved and converted)")
    if c.dtype in FLOATS:
        c_type(c.dtype)
        return _float_text(c.value, c.dtype)
    return _int_text(c.value, c.dtype)
