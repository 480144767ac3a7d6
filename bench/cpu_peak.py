"""The peak arithmetic throughput of one core of this CPU: f32 FMA (AVX-512 or AVX2);
where the CPU has AVX512_VNNI / AVX-VNNI, int8 quad dot products (`vpdpbusd` on zmm /
ymm: each u8 x s8 product and its add counted as 2 int8 ops), and with AMX-INT8 tile
dot products (`tdpbusd`, 16x16 int32 += 16x64 u8 x 64x16 s8); where it has
AVX512_BF16, bf16 pair dot products (`vdpbf16ps`); where it has
AMX-BF16, tile dot products (`tdpbf16ps`, 16x16 f32 += 16x32 bf16 x 32x16 bf16) -- what
issue 37's "GEMM micro-kernel at >= 80% of the bf16 peak" is measured against.

    python bench/cpu_peak.py [--seconds 0.5] [--out RESULT.json]

Each kernel is a tight loop over 24 independent accumulator registers (enough to cover
the instruction's latency on two FMA ports), compiled by gcc with the ISA's flags and
timed single-threaded over repeated calls (the best of 5); AMX runs four independent
tile accumulators (the process asks Linux for the tile state first). GFLOP/s counts an
FMA as 2 flops per f32 lane, a `vdpbf16ps` as 4 per f32 lane (two products, two adds)
and a `tdpbf16ps` as 16 x 16 x 32 x 2. Where AMX runs, also a first AMX GEMM of
1024^3 (operands packed outside the clock, 2 x 2 tiles per block, no cache blocking:
what a simple kernel reaches, beside the peak), checked against the bf16-rounded
product. The results name the CPU (`/proc/cpuinfo`'s model name) and its flags.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hidetc import cpu_isa  # noqa: E402
from hidetc.backends.toolchain.gcc import build_shared_library  # noqa: E402
from hidetc.driver.tune.keys import cpu_device  # noqa: E402

CHAINS = 24
GEMM_N = 1024      # the AMX GEMM's n x n x n (a multiple of 32)

SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#define CHAINS @CHAINS@
/* f32: CHAINS independent FMA chains of 16 (AVX-512) or 8 (AVX2) lanes */
float fma_loop(int64_t iters) {
#ifdef __AVX512F__
  __m512 acc[CHAINS], a = _mm512_set1_ps(1.0000001f), b = _mm512_set1_ps(0.9999999f);
  for (int c = 0; c < CHAINS; ++c) acc[c] = _mm512_set1_ps((float)c);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 64
    for (int c = 0; c < CHAINS; ++c) acc[c] = _mm512_fmadd_ps(a, acc[c], b);
  __m512 s = acc[0];
  for (int c = 1; c < CHAINS; ++c) s = _mm512_add_ps(s, acc[c]);
  return _mm512_reduce_add_ps(s);
#else
  __m256 acc[CHAINS], a = _mm256_set1_ps(1.0000001f), b = _mm256_set1_ps(0.9999999f);
  for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_set1_ps((float)c);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 64
    for (int c = 0; c < CHAINS; ++c) acc[c] = _mm256_fmadd_ps(a, acc[c], b);
  float out[8]; __m256 s = acc[0];
  for (int c = 1; c < CHAINS; ++c) s = _mm256_add_ps(s, acc[c]);
  _mm256_storeu_ps(out, s);
  return out[0];
#endif
}
#ifdef __AMX_BF16__
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16];
                 uint8_t rows[16]; } tile_config;
/* 4 x tdpbf16ps per iteration into 4 independent 16x16 f32 tiles; < 0: no permission */
float amx_loop(int64_t iters) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */))
    return -1.0f;
  static uint16_t a[16 * 32], b[16 * 32];
  static float c[16 * 16];
  tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
  for (int i = 0; i < 16 * 32; ++i) { a[i] = 0x3f80; b[i] = 0x3f80; }
  _tile_loadconfig(&cfg);
  _tile_loadd(4, a, 64); _tile_loadd(5, b, 64); _tile_loadd(6, a, 64); _tile_loadd(7, b, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 6, 5); _tile_dpbf16ps(3, 6, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}
#ifdef __AMX_INT8__
/* 4 x tdpbusd per iteration into 4 independent 16x16 int32 tiles (16 x 64 u8 x s8) */
int32_t amx_int8_loop(int64_t iters) {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */))
    return -1;
  static uint8_t a[16 * 64], b[16 * 64];
  static int32_t c[16 * 16];
  tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
  for (int i = 0; i < 16 * 64; ++i) { a[i] = 1; b[i] = 1; }
  _tile_loadconfig(&cfg);
  _tile_loadd(4, a, 64); _tile_loadd(5, b, 64); _tile_loadd(6, a, 64); _tile_loadd(7, b, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbusd(0, 4, 5); _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 6, 5); _tile_dpbusd(3, 6, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}
#endif
/* A GEMM of n x n x n (n a multiple of 32) on AMX, single-threaded, as a first kernel
 * would do it: A packed as [n/16][n/32][16][32] bf16 and B in the pair layout
 * [n/16][n/32][16 k-pairs][16][2] (both outside the clock), 2 x 2 C tiles of 16 x 16
 * per 32 x 32 block, K walked in steps of 32, no cache blocking. Returns the best of
 * `reps` seconds; *err the largest relative error of 64 sampled entries against the
 * product of the bf16-rounded inputs (double sums). */
static uint16_t to_bf16(float f) { uint32_t u; memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }
static float from_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f;
  memcpy(&f, &u, 4); return f; }
static double seconds_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec; }
double amx_gemm(int n, int reps, double *err) {
  if (syscall(SYS_arch_prctl, 0x1023, 18)) return -1.0;
  size_t nn = (size_t)n * n, kb_n = n / 32;
  float *a = malloc(4 * nn), *b = malloc(4 * nn), *c = aligned_alloc(64, 4 * nn);
  uint16_t *ap = aligned_alloc(64, 2 * nn), *bp = aligned_alloc(64, 2 * nn);
  for (size_t i = 0; i < nn; ++i) { a[i] = (float)((int)(i * 37 % 101) - 50) / 64.0f;
                                    b[i] = (float)((int)(i * 53 % 97) - 48) / 64.0f; }
  for (int ib = 0; ib < n / 16; ++ib) for (size_t kb = 0; kb < kb_n; ++kb)
    for (int r = 0; r < 16; ++r) for (int k = 0; k < 32; ++k)
      ap[((ib * kb_n + kb) * 16 + r) * 32 + k] =
          to_bf16(a[(size_t)(ib * 16 + r) * n + kb * 32 + k]);
  for (int jb = 0; jb < n / 16; ++jb) for (size_t kb = 0; kb < kb_n; ++kb)
    for (int kp = 0; kp < 16; ++kp) for (int j = 0; j < 16; ++j) for (int e = 0; e < 2; ++e)
      bp[(((jb * kb_n + kb) * 16 + kp) * 16 + j) * 2 + e] =
          to_bf16(b[(kb * 32 + 2 * kp + e) * n + jb * 16 + j]);
  tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
  _tile_loadconfig(&cfg);
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    double t0 = seconds_now();
    for (int i0 = 0; i0 < n; i0 += 32) for (int j0 = 0; j0 < n; j0 += 32) {
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      const uint16_t *a0 = ap + (size_t)(i0 / 16) * kb_n * 512, *a1 = a0 + kb_n * 512;
      const uint16_t *b0 = bp + (size_t)(j0 / 16) * kb_n * 512, *b1 = b0 + kb_n * 512;
      for (size_t kb = 0; kb < kb_n; ++kb) {
        _tile_loadd(4, a0 + kb * 512, 64); _tile_loadd(5, a1 + kb * 512, 64);
        _tile_loadd(6, b0 + kb * 512, 64); _tile_loadd(7, b1 + kb * 512, 64);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
      }
      float *c0 = c + (size_t)i0 * n + j0, *c1 = c0 + (size_t)16 * n;
      _tile_stored(0, c0, 4 * n); _tile_stored(1, c0 + 16, 4 * n);
      _tile_stored(2, c1, 4 * n); _tile_stored(3, c1 + 16, 4 * n);
    }
    double dt = seconds_now() - t0;
    if (dt < best) best = dt;
  }
  _tile_release();
  *err = 0;
  for (int s = 0; s < 64; ++s) {
    int i = (s * 131) % n, j = (s * 197) % n;
    double ref = 0, d;
    for (int k = 0; k < n; ++k)
      ref += (double)from_bf16(to_bf16(a[(size_t)i * n + k])) *
             from_bf16(to_bf16(b[(size_t)k * n + j]));
    d = (ref - c[(size_t)i * n + j]) / (ref < 0 ? 1 - ref : 1 + ref);
    d = d < 0 ? -d : d;
    if (d > *err) *err = d;
  }
  free(a); free(b); free(c); free(ap); free(bp);
  return best;
}
#endif
#ifdef __AVX512VNNI__
/* int8: CHAINS independent vpdpbusd chains on zmm (16 int32 lanes, 4 u8 x s8 each) */
int32_t vnni_loop(int64_t iters) {
  __m512i acc[CHAINS], a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(1);
  for (int c = 0; c < CHAINS; ++c) acc[c] = _mm512_set1_epi32(c);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 64
    for (int c = 0; c < CHAINS; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
  __m512i s = acc[0];
  for (int c = 1; c < CHAINS; ++c) s = _mm512_add_epi32(s, acc[c]);
  return _mm512_reduce_add_epi32(s);
}
#endif
#ifdef __AVXVNNI__
/* int8: the same with AVX-VNNI on ymm (8 int32 lanes; its VEX encoding reaches only
   ymm0-15: 12 chains, so none spills) */
int32_t avxvnni_loop(int64_t iters) {
  __m256i acc[12], a = _mm256_set1_epi8(1), b = _mm256_set1_epi8(1);
  for (int c = 0; c < 12; ++c) acc[c] = _mm256_set1_epi32(c);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 64
    for (int c = 0; c < 12; ++c) acc[c] = _mm256_dpbusd_avx_epi32(acc[c], a, b);
  int32_t out[8], total = 0;
  __m256i s = acc[0];
  for (int c = 1; c < 12; ++c) s = _mm256_add_epi32(s, acc[c]);
  _mm256_storeu_si256((__m256i *)out, s);
  for (int c = 0; c < 8; ++c) total += out[c];
  return total;
}
#endif
#ifdef __AVX512BF16__
/* bf16: CHAINS independent vdpbf16ps chains (16 f32 lanes, 32 bf16 pairs each) */
float dpbf16_loop(int64_t iters) {
  __m512 acc[CHAINS];
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (int c = 0; c < CHAINS; ++c) acc[c] = _mm512_set1_ps((float)c);
  for (int64_t i = 0; i < iters; ++i)
#pragma GCC unroll 64
    for (int c = 0; c < CHAINS; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  __m512 s = acc[0];
  for (int c = 1; c < CHAINS; ++c) s = _mm512_add_ps(s, acc[c]);
  return _mm512_reduce_add_ps(s);
}
#endif
"""


def _rate(fn, flops_per_iter: float, seconds: float) -> float:
    """GFLOP/s of `fn(iters)`: iterations grown until a call takes `seconds / 5`, best
    of 5 calls."""
    iters = 1000
    while True:
        start = time.perf_counter()
        fn(iters)
        took = time.perf_counter() - start
        if took > seconds / 5:
            break
        iters *= 4
    best = min(_timed(fn, iters) for _ in range(5))
    return flops_per_iter * iters / best / 1e9


def seconds_per_call(kernel, args, calls: int = 1) -> float:
    """Wall seconds per `kernel(*args)` over `calls` back-to-back calls (the GEMM
    benchmarks' timer)."""
    start = time.perf_counter()
    for _ in range(calls):
        kernel(*args)
    return (time.perf_counter() - start) / calls


def _timed(fn, iters: int) -> float:
    start = time.perf_counter()
    fn(iters)
    return time.perf_counter() - start


def measure(seconds: float) -> dict:
    """The peaks of one core of this CPU (see the module docstring), as a dict."""
    flags = cpu_isa.host_flags()
    isa = cpu_isa.host_best()
    bf16 = cpu_isa.BF16 in flags
    amx = "amx_bf16" in flags
    amx_int8 = "amx_int8" in flags
    vnni, avxvnni = "avx512_vnni" in flags, "avx_vnni" in flags
    opt = ["-O2", *isa.gcc_flags] + (["-mavx512bw", "-mavx512bf16"] if bf16 else []) + \
        (["-mamx-tile", "-mamx-bf16"] if amx else []) + \
        (["-mavx512bw", "-mavx512vnni"] if vnni else []) + (["-mavxvnni"] if avxvnni else []) + \
        (["-mamx-tile", "-mamx-int8"] if amx_int8 else [])
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = build_shared_library({"peak": SOURCE.replace("@CHAINS@", str(CHAINS))},
                                        Path(tmp) / "peak.so", opt_flags=opt)
        lib = ctypes.CDLL(str(lib_path))
    result = {"cpu": cpu_device().removeprefix("cpu:"), "isa": isa.name,
              "features": list(cpu_isa.host_features()), "chains": CHAINS}
    lib.fma_loop.restype = ctypes.c_float
    lib.fma_loop.argtypes = [ctypes.c_int64]
    result["f32_fma_gflops"] = _rate(lib.fma_loop, CHAINS * isa.lanes * 2, seconds)
    if bf16:
        lib.dpbf16_loop.restype = ctypes.c_float
        lib.dpbf16_loop.argtypes = [ctypes.c_int64]
        result["bf16_dp_gflops"] = _rate(lib.dpbf16_loop, CHAINS * 16 * 4, seconds)
        result["bf16_over_f32"] = result["bf16_dp_gflops"] / result["f32_fma_gflops"]
    for name, flag, lanes, chains in (("vnni", vnni, 16, CHAINS), ("avxvnni", avxvnni, 8, 12)):
        if flag:        # int8 ops: each u8 x s8 product and its add, 4 per int32 lane
            loop = getattr(lib, f"{name}_loop")
            loop.restype, loop.argtypes = ctypes.c_int32, [ctypes.c_int64]
            result[f"int8_{name}_gops"] = _rate(loop, chains * lanes * 8, seconds)
    if amx_int8 and amx:      # (its loop shares the AMX-BF16 block's set-up)
        lib.amx_int8_loop.restype = ctypes.c_int32
        lib.amx_int8_loop.argtypes = [ctypes.c_int64]
        if lib.amx_int8_loop(1) >= 0:
            result["int8_amx_gops"] = _rate(lib.amx_int8_loop, 4 * 16 * 16 * 64 * 2, seconds)
    if amx:
        lib.amx_loop.restype = ctypes.c_float
        lib.amx_loop.argtypes = [ctypes.c_int64]
        if lib.amx_loop(1) < 0:
            result["amx_note"] = "Linux refused the AMX tile state (arch_prctl)"
        else:
            result["amx_bf16_gflops"] = _rate(lib.amx_loop, 4 * 16 * 16 * 32 * 2, seconds)
            result["amx_over_f32"] = result["amx_bf16_gflops"] / result["f32_fma_gflops"]
            lib.amx_gemm.restype = ctypes.c_double
            lib.amx_gemm.argtypes = [ctypes.c_int, ctypes.c_int,
                                     ctypes.POINTER(ctypes.c_double)]
            err = ctypes.c_double()
            secs = lib.amx_gemm(GEMM_N, 5, ctypes.byref(err))
            result["amx_gemm"] = {"n": GEMM_N, "gflops": 2 * GEMM_N ** 3 / secs / 1e9,
                                  "of_amx_peak": 2 * GEMM_N ** 3 / secs / 1e9 /
                                  result["amx_bf16_gflops"], "max_rel_err": err.value}
    return result


def report(result: dict, out: Path | None) -> int:
    """Print `result` as JSON, and write it to `out` when given."""
    print(json.dumps(result, indent=1))
    if out:
        out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    return report(measure(a.seconds), a.out)


if __name__ == "__main__":
    sys.exit(main())
