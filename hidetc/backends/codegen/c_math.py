"""Vectorizable float32 math for the cpu target: `MATH_SOURCE` (C) and `FAST_FLOAT32`.

What: branch-free `static inline float` replacements for glibc's scalar `expf`,
`tanhf`, `erff` and `logf`. A loop calling glibc's functions stays scalar (one libm
call per element); these are plain arithmetic, integer bit manipulation (through a
union) and selects, so gcc inlines them and vectorizes the loop around them (8 lanes
of AVX2; `tests/codegen/test_c_math.py` checks the assembly). The C printer
(`hidetc/backends/codegen/c.py`) maps the IR's float32 `exp`, `tanh`, `erf`, `log` calls to
them by `FAST_FLOAT32` and puts `MATH_SOURCE` in every cpu translation unit's helper
prelude; its float32 `sigmoid` helper uses `hidetc_expf`. float64 keeps libm, and the
CUDA printer does not use these names (its math table is `c.MATH_FUNCTIONS`).

How:
  hidetc_expf   n = round(x log2 e) (the 1.5*2^23 shifter), r = x - n ln2 in two
                parts (Cody-Waite: ln2_hi = 355/512 makes n*ln2_hi exact), e^r by a
                degree-6 minimax polynomial (fma Horner down to the constant 1: 0.89
                ulp where `1 + (r + r^2 q)` gave 1.01), times 2^n built from
                exponent bits in two factors 2^(n/2) 2^(n - n/2): exact in the normal
                range, one rounding for denormal results. x is clamped to
                [-104, 89], so the result overflows to inf / underflows to 0 like
                expf; NaN passes the clamps and propagates.
  hidetc_tanhf  |x| < 0.625: |x| + |x|^3 Q(x^2) (degree 5 minimax Q); else
                1 - 2 / (hidetc_expf(2|x|) + 1), which saturates to 1 (exp -> inf);
                the sign is put back with copysignf (tanh(-0) = -0).
  hidetc_erff   |x| < 0.921875: |x| + |x| P(x^2) (P(0) = 2/sqrt(pi) - 1, degree 6);
                else 1 - hidetc_expf(t S(t)), t = min(|x|, 3.925) and t S(t) a
                degree-7 minimax fit of log(erfc(t)) weighted by erfc(t) (at 3.925 the
                float result is 1); copysignf puts the sign back.
  hidetc_logf   denormals scaled by 2^23 first; x = m 2^e with m in [sqrt(1/2),
                sqrt(2)), log1p(f = m - 1) = f - f^2/2 + f^3 L(f) (degree 8 minimax),
                plus e ln2 in two parts; selects give log(<0) = NaN, log(+-0) = -inf,
                log(inf) = inf, log(NaN) = NaN.
Both sides of every select are computed (no branches); the coefficients were fitted
in float64 (Lawson's iteratively reweighted least squares, a minimax approximation)
and rounded to float32. The fitted polynomials' own errors are below 4e-9 relative,
well under rounding.

Assumes: round-to-nearest; gcc with -mfma (fmaf becomes one vfmadd; without it fmaf is
a libm call: still correct, not fast); -ffp-contract=off is fine (the fmas are
explicit); no -ffast-math needed (comparisons must see NaN).

Guarantees: max error in ulp of the exact result (an ulp below the normal range is
2^-149, the denormal step), measured exhaustively over all 2^32 float32 inputs against
glibc's float64 functions during development; results agree with them on NaN, +-inf
and overflow for every input:
  hidetc_expf   0.891 ulp (x = 5.2016387); exp(-inf) = 0, exp(inf) = inf, exp(nan) = nan,
                exp(+-0) = 1, overflow to inf from x > 88.7228, 0 below -103.97.
  hidetc_tanhf  1.362 ulp (x = -0.630006, just past the polynomial's range);
                tanh(+-inf) = +-1, tanh(+-0) = +-0, tanh(nan) = nan.
  hidetc_erff   1.210 ulp (x = -0.962655); erf(+-inf) = +-1, erf(+-0) = +-0, erf(nan) = nan.
  hidetc_logf   0.810 ulp (x = 0.638584); the special values above.
`tests/codegen/test_c_math.py` asserts 1, 1.5, 1.5, 1 ulp over ~1e6 points each (and 3
ulp for the float32 sigmoid helper, 1 / (1 + hidetc_expf(-x))) and the special values.
"""
from __future__ import annotations

# IR math call -> C function, float32 arguments only (float64 keeps libm)
FAST_FLOAT32: dict[str, str] = {
    "exp": "hidetc_expf", "tanh": "hidetc_tanhf", "erf": "hidetc_erff", "log": "hidetc_logf",
}

MATH_SOURCE = """\
/* vectorizable float32 math (hidetc/backends/codegen/c_math.py) */
typedef union { float f; uint32_t u; } hidetc_f32bits;
static inline uint32_t hidetc_f2u(float f) { hidetc_f32bits b; b.f = f; return b.u; }
static inline float hidetc_u2f(uint32_t u) { hidetc_f32bits b; b.u = u; return b.f; }
typedef union { double f; uint64_t u; } hidetc_f64bits;   /* BitCast (compute/bitcast.py) */
static inline uint64_t hidetc_d2u(double f) { hidetc_f64bits b; b.f = f; return b.u; }
static inline double hidetc_u2d(uint64_t u) { hidetc_f64bits b; b.u = u; return b.f; }
/* c ? a : b on bits: a `?:` whose operands are computed gets them sunk into branches,
   which gcc then cannot if-convert (FP ops may trap), and the loop stays scalar */
static inline float hidetc_sel(int c, float a, float b) {
  uint32_t m = 0u - (uint32_t)(c != 0);
  return hidetc_u2f((hidetc_f2u(a) & m) | (hidetc_f2u(b) & ~m));
}
static inline float hidetc_expf(float x) {
  float xc = hidetc_sel(x > 89.0f, 89.0f, x);   /* NaN passes both clamps */
  xc = hidetc_sel(xc < -104.0f, -104.0f, xc);
  float t = xc * 1.44269504f + 12582912.0f;    /* 1.5 * 2^23: rounds to an integer */
  float n = t - 12582912.0f;
  int32_t ni = (int32_t)(hidetc_f2u(t) - 0x4B400000u);
  float r = fmaf(n, -0.693359375f, xc);
  r = fmaf(n, 2.12194440e-4f, r);
  float p = 1.381313312e-03f;
  p = fmaf(p, r, 8.369424380e-03f);
  p = fmaf(p, r, 4.166845605e-02f);
  p = fmaf(p, r, 1.666651517e-01f);
  p = fmaf(p, r, 4.999999404e-01f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  int32_t n1 = ni >> 1, n2 = ni - n1;          /* 2^n = 2^n1 * 2^n2, both normal */
  float s1 = hidetc_u2f((uint32_t)(n1 + 127) << 23);
  float s2 = hidetc_u2f((uint32_t)(n2 + 127) << 23);
  return (p * s1) * s2;
}
static inline float hidetc_tanhf(float x) {
  float a = fabsf(x), s = a * a;
  float q = 2.142962068e-03f;
  q = fmaf(q, s, -8.177398704e-03f);
  q = fmaf(q, s, 2.170070261e-02f);
  q = fmaf(q, s, -5.394676328e-02f);
  q = fmaf(q, s, 1.333320588e-01f);
  q = fmaf(q, s, -3.333333135e-01f);
  float small = fmaf(q * s, a, a);
  float big = 1.0f - 2.0f / (hidetc_expf(2.0f * a) + 1.0f);
  return copysignf(hidetc_sel(a < 0.625f, small, big), x);
}
static inline float hidetc_erff(float x) {
  float a = fabsf(x), s = a * a;
  float p = 8.370141586e-05f;
  p = fmaf(p, s, -8.142715669e-04f);
  p = fmaf(p, s, 5.201033317e-03f);
  p = fmaf(p, s, -2.685939893e-02f);
  p = fmaf(p, s, 1.128369570e-01f);
  p = fmaf(p, s, -3.761263490e-01f);
  p = fmaf(p, s, 1.283791661e-01f);
  float small = fmaf(p, a, a);
  float t = hidetc_sel(a > 3.925f, 3.925f, a);  /* NaN passes */
  float q = -1.159116891e-05f;
  q = fmaf(q, t, 3.263450053e-04f);
  q = fmaf(q, t, -3.656591289e-03f);
  q = fmaf(q, t, 2.379135415e-02f);
  q = fmaf(q, t, -1.062701494e-01f);
  q = fmaf(q, t, -6.351316571e-01f);
  q = fmaf(q, t, -1.128653169e+00f);
  float big = 1.0f - hidetc_expf(q * t);
  return copysignf(hidetc_sel(a < 0.921875f, small, big), x);
}
static inline float hidetc_logf(float x) {
  int tiny = x < 1.17549435e-38f;              /* denormals (and <= 0) */
  uint32_t b = hidetc_f2u(hidetc_sel(tiny, x * 8388608.0f, x));
  int32_t e = (int32_t)((b >> 23) & 0xffu) - (tiny ? 150 : 127);
  float m = hidetc_u2f((b & 0x7fffffu) | 0x3f800000u);  /* [1, 2) */
  int halve = m > 1.41421354f;
  m = hidetc_sel(halve, m * 0.5f, m);
  float f = m - 1.0f, ef = (float)(e + (halve ? 1 : 0));
  float l = 6.746638566e-02f;
  l = fmaf(l, f, -1.167565137e-01f);
  l = fmaf(l, f, 1.188816279e-01f);
  l = fmaf(l, f, -1.240558922e-01f);
  l = fmaf(l, f, 1.421955228e-01f);
  l = fmaf(l, f, -1.666799635e-01f);
  l = fmaf(l, f, 2.000211924e-01f);
  l = fmaf(l, f, -2.500000894e-01f);
  l = fmaf(l, f, 3.333331347e-01f);
  float f2 = f * f;
  float y = fmaf(l * f, f2, -0.5f * f2);
  float r = fmaf(ef, 0.693359375f, fmaf(ef, -2.12194440e-4f, y) + f);
  r = hidetc_sel(x < 0.0f, NAN, r);
  r = hidetc_sel(x == 0.0f, -INFINITY, r);
  r = hidetc_sel(x == INFINITY, INFINITY, r);
  return hidetc_sel(x != x, x, r);
}
"""
