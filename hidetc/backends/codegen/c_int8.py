"""The int8 GEMM block helpers of the cpu printer: C source carried by a translation unit
that calls them (`hidetc.tir.intrinsics.INT8_CALLS`, registered there with `defined_in`
"c_int8"; the C printer appends `INT8_SOURCE` to such a module only).

All four compute the same block, the inner part of `hidetc.schedules.cpu.gemm_int8`:

    C[rows][panels * 16] (int32, row stride ldc) = A' x B', exactly, where
    A': uint8 in 16 x 64 tiles, [round_up(rows, 16) / 16][kp / 64][16][64] (row r,
        column k at ((r / 16) * (kp / 64) + k / 64) * 1024 + (r % 16) * 64 + k % 64;
        kp % 64 == 0): one tile a contiguous KB, as the bf16 blocks' A;
    B': `panels` panels of 16 columns, panel p at b + p * pst (int32 units): kp / 4
        rows of 16 int32, each the 4 consecutive k of one column as int8 (k % 4 in byte
        k % 4: the layout `vpdpbusd` reads);
    C: writable for round_up(rows, 32) rows and panels * 16 columns.

Every product of a uint8 and an int8 is at most 2^15 in magnitude and every sum is
taken in int32, so the block is exact while K * 255 * 128 < 2^31 (K < 65793; the kernel
refuses larger K).

- `hidetc_i8_gemm_amx` (AMX-INT8: Sapphire Rapids and on): `tdpbusd`, 16 x 16 int32 C
  tiles += a 16 x 64 uint8 A tile x a 16-quad-row B tile -- the A and B layouts above
  are the tiles' (one A tile a KB of apack, one B tile 16 rows of a panel); 2 x 2 C
  tiles per step, K blocks of 1024, as the bf16 AMX block (`c_bf16`, whose notes on the
  tile configuration and Linux's permission apply: `c_amx`, shared with it).
- `hidetc_i8_gemm_vnni` (AVX512_VNNI: Ice Lake, Sapphire Rapids, Zen 4 and on):
  `vpdpbusd` on zmm: 8 rows x 32 columns of int32 accumulators (16 zmm) per micro-tile,
  each k quad a broadcast A quad times two B rows. `vpdpbusd` (without the `s`) wraps
  instead of saturating; the sums never get there (above).
- `hidetc_i8_gemm_avxvnni` (AVX-VNNI on AVX2 CPUs: Alder Lake and on, Zen 5): the same
  with the VEX-encoded `vpdpbusd` on ymm, 6 rows x 16 columns (12 of the 16 ymm it can
  name: 4 rows left the chains' latency uncovered, bench/results/2026-12-07-int8.md), rows
  past `rows` read row 0 and are not stored.
- `hidetc_i8_gemm_avx2` (any AVX2 CPU): exact without VNNI. `vpmaddubsw` would add two
  u8 x s8 products into a saturating int16 (255 * 127 * 2 > 2^15: silently wrong), so the
  operands are widened to int16 and `vpmaddwd` adds pairs of int16 products into int32:
  per k quad and 4 columns one ymm of (k0k1, k2k3) partial sums per column, the pairs
  summed once at the end (`vphaddd` and a lane permute). 2 rows x 16 columns.

Each is `noinline` with a `target` attribute: the rest of the unit keeps the target
ISA's flags (`hidetc.backends.toolchain.gcc.flags_for`), and only int8 kernels call them.
"""
from __future__ import annotations

from hidetc.backends.codegen.c_amx import amx_block

INT8_SOURCE = r"""
/* int8 GEMM blocks (hidetc.backends.codegen.c_int8) */
static inline int32_t hidetc_i8_quad(const uint8_t *p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

""" + amx_block(
    "hidetc_i8_gemm_amx", "amx-tile,amx-int8",
    "const uint8_t *a, long kp, const int32_t *b, long pst, int32_t *c, long ldc, long rows, "
    "long panels", ("uint8_t", "int32_t", "int32_t"), "kp", 64, 16, 1024, 256,
    "_tile_dpbusd") + r"""
/* (the accumulators are named variables, not an array: gcc 12 shuffled an array's
   zmm accumulators between registers on every step of the K loop) */
#define HIDETC_I8_ROW(r, v0, v1)                                                  \
  { __m512i x = _mm512_set1_epi32(hidetc_i8_quad(ak + r * 64));                   \
    c##r##0 = _mm512_dpbusd_epi32(c##r##0, x, v0);                                \
    c##r##1 = _mm512_dpbusd_epi32(c##r##1, x, v1); }
#define HIDETC_I8_STORE(r)                                                        \
  { _mm512_storeu_si512((void *)(cr + r * ldc), c##r##0);                         \
    if (two) _mm512_storeu_si512((void *)(cr + r * ldc + 16), c##r##1); }

__attribute__((noinline, unused, target("avx512f,avx512bw,avx512vnni")))
static void hidetc_i8_gemm_vnni(const uint8_t *a, long kp, const int32_t *b, long pst,
                                int32_t *c, long ldc, long rows, long panels) {
  long blocks = (rows + 7) / 8, quads = kp / 4;
  for (long p = 0; p < panels; p += 2) {
    int two = p + 1 < panels;
    const int32_t *b0 = b + p * pst, *b1 = two ? b0 + pst : b0;
    for (long blk = 0; blk < blocks; ++blk) {
      const uint8_t *ar = a + (blk / 2) * 16 * kp + (blk % 2) * 8 * 64;
      __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
              c21 = c00, c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00,
              c60 = c00, c61 = c00, c70 = c00, c71 = c00;
      for (long i = 0; i < quads; ++i) {
        __m512i v0 = _mm512_loadu_si512((const void *)(b0 + i * 16));
        __m512i v1 = _mm512_loadu_si512((const void *)(b1 + i * 16));
        const uint8_t *ak = ar + (i / 16) * 1024 + (i % 16) * 4;
        HIDETC_I8_ROW(0, v0, v1) HIDETC_I8_ROW(1, v0, v1) HIDETC_I8_ROW(2, v0, v1)
        HIDETC_I8_ROW(3, v0, v1) HIDETC_I8_ROW(4, v0, v1) HIDETC_I8_ROW(5, v0, v1)
        HIDETC_I8_ROW(6, v0, v1) HIDETC_I8_ROW(7, v0, v1)
      }
      int32_t *cr = c + blk * 8 * ldc + p * 16;
      HIDETC_I8_STORE(0) HIDETC_I8_STORE(1) HIDETC_I8_STORE(2) HIDETC_I8_STORE(3)
      HIDETC_I8_STORE(4) HIDETC_I8_STORE(5) HIDETC_I8_STORE(6) HIDETC_I8_STORE(7)
    }
  }
}

/* (inline asm, not _mm256_dpbusd_avx_epi32: gcc 12 copied every accumulator through
   another register, or the stack, on each step of the K loop) */
#define HIDETC_I8_DPBUSD_Y(acc, x, v)                                             \
  __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(x), "x"(v))
#define HIDETC_I8_ROW_Y(r)                                                        \
  { __m256i x = _mm256_set1_epi32(hidetc_i8_quad(ar##r + off));                    \
    HIDETC_I8_DPBUSD_Y(y##r##0, x, v0); HIDETC_I8_DPBUSD_Y(y##r##1, x, v1); }
#define HIDETC_I8_STORE_Y(r)                                                      \
  { int32_t *cr = r0 + r < rows ? c + (r0 + r) * ldc + p * 16 : spare;            \
    _mm256_storeu_si256((__m256i *)cr, y##r##0);                                   \
    _mm256_storeu_si256((__m256i *)(cr + 8), y##r##1); }
#define HIDETC_I8_AROW(r)                                                         \
  const uint8_t *ar##r = a + ((r0 + r < rows ? r0 + r : 0) / 16) * 16 * kp +     \
                         ((r0 + r < rows ? r0 + r : 0) % 16) * 64;

__attribute__((noinline, unused, target("avx2,avxvnni")))
static void hidetc_i8_gemm_avxvnni(const uint8_t *a, long kp, const int32_t *b, long pst,
                                   int32_t *c, long ldc, long rows, long panels) {
  long quads = kp / 4;
  int32_t spare[16] __attribute__((aligned(32)));   /* the stores of rows past `rows` */
  for (long p = 0; p < panels; ++p) {
    const int32_t *bp = b + p * pst;
    for (long r0 = 0; r0 < rows; r0 += 6) {      /* 6 rows: 12 of the 16 ymm */
      HIDETC_I8_AROW(0) HIDETC_I8_AROW(1) HIDETC_I8_AROW(2)
      HIDETC_I8_AROW(3) HIDETC_I8_AROW(4) HIDETC_I8_AROW(5)
      __m256i y00 = _mm256_setzero_si256(), y01 = y00, y10 = y00, y11 = y00, y20 = y00,
              y21 = y00, y30 = y00, y31 = y00, y40 = y00, y41 = y00, y50 = y00, y51 = y00;
      for (long i = 0; i < quads; ++i) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(bp + i * 16));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(bp + i * 16 + 8));
        long off = (i / 16) * 1024 + (i % 16) * 4;
        HIDETC_I8_ROW_Y(0) HIDETC_I8_ROW_Y(1) HIDETC_I8_ROW_Y(2)
        HIDETC_I8_ROW_Y(3) HIDETC_I8_ROW_Y(4) HIDETC_I8_ROW_Y(5)
      }
      HIDETC_I8_STORE_Y(0) HIDETC_I8_STORE_Y(1) HIDETC_I8_STORE_Y(2)
      HIDETC_I8_STORE_Y(3) HIDETC_I8_STORE_Y(4) HIDETC_I8_STORE_Y(5)
    }
  }
}

__attribute__((noinline, unused, target("avx2")))
static void hidetc_i8_gemm_avx2(const uint8_t *a, long kp, const int32_t *b, long pst,
                                int32_t *c, long ldc, long rows, long panels) {
  long blocks = (rows + 1) / 2, quads = kp / 4;
  for (long p = 0; p < panels; ++p) {
    const int32_t *bp = b + p * pst;
    for (long blk = 0; blk < blocks; ++blk) {
      const uint8_t *ar = a + (blk / 8) * 16 * kp + (blk % 8) * 2 * 64;
      __m256i acc[2][4];
      for (int r = 0; r < 2; ++r)
        for (int q = 0; q < 4; ++q) acc[r][q] = _mm256_setzero_si256();
      for (long i = 0; i < quads; ++i) {
        __m256i lo = _mm256_loadu_si256((const __m256i *)(bp + i * 16));
        __m256i hi = _mm256_loadu_si256((const __m256i *)(bp + i * 16 + 8));
        __m256i w[4] = {_mm256_cvtepi8_epi16(_mm256_castsi256_si128(lo)),
                        _mm256_cvtepi8_epi16(_mm256_extracti128_si256(lo, 1)),
                        _mm256_cvtepi8_epi16(_mm256_castsi256_si128(hi)),
                        _mm256_cvtepi8_epi16(_mm256_extracti128_si256(hi, 1))};
        const uint8_t *ak = ar + (i / 16) * 1024 + (i % 16) * 4;
        for (int r = 0; r < 2; ++r) {
          __m128i q8 = _mm_cvtsi32_si128(hidetc_i8_quad(ak + r * 64));
          __m256i x = _mm256_broadcastq_epi64(_mm_cvtepu8_epi16(q8));
          for (int q = 0; q < 4; ++q)
            acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(x, w[q]));
        }
      }
      int32_t *cr = c + blk * 2 * ldc + p * 16;
      for (int r = 0; r < 2; ++r) {
        __m256i s0 = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[r][0], acc[r][1]), 0xd8);
        __m256i s1 = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[r][2], acc[r][3]), 0xd8);
        _mm256_storeu_si256((__m256i *)(cr + r * ldc), s0);
        _mm256_storeu_si256((__m256i *)(cr + r * ldc + 8), s1);
      }
    }
  }
}
"""
