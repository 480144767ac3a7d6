"""The bf16 GEMM block helpers of the cpu printer: C source carried by a translation unit
that calls them (`hidetc.tir.intrinsics.BF16_CALLS`, registered there with `defined_in`
"c_bf16"; the C printer appends `BF16_SOURCE` to such a module only).

Both compute the same block, the inner part of `hidetc.schedules.cpu.gemm_bf16`:

    C[rows][panels * 16] (f32, row stride ldc floats) = A x B, where
    A: bf16 bits in 16 x 32 tiles, [round_up(rows, 32) / 16][kp / 32][16][32] (row r,
       column k at ((r / 16) * (lda / 32) + k / 32) * 512 + (r % 16) * 32 + k % 32; lda
       == kp, kp % 32 == 0, zero past K): each AMX A tile one contiguous KB, so its
       rows never compete for the same L1 sets as a row-major A's would (a 2 KB row
       stride puts all 16 rows in two sets);
    B: `panels` panels of 16 columns, panel p at b + p * pst: kp/2 rows of 16 column
       pairs (B[2i][j], B[2i+1][j]) -- the pair-interleaved layout both instructions
       read (zero past N and past K);
    C: writable for round_up(rows, 32) rows and panels * 16 columns.

Every product of two bf16 is exact in f32 and both instructions accumulate in f32
(`vdpbf16ps` adds each pair's two products to the lane with round-to-nearest-even and
denormals flushed, as AMX's `tdpbf16ps` does), so the block is the f32 product of the
bf16-rounded operands up to the order of the f32 additions.

- `hidetc_bf16_gemm_amx` (AMX-BF16: Sapphire Rapids and on): 16x16 f32 C tiles, 2 x 2 of
  them per step (tmm0-3), A tiles 16 rows x 32 bf16 (tmm4-5), B tiles 16 pair rows x 16
  columns (tmm6-7); the loops run over K blocks of 1024, 32-row groups, then column-panel
  pairs (the two A tiles of a group reused from L1 by every panel pair); C tiles start
  at zero in the first K block and are loaded back in the later ones. Smaller K blocks
  (256) measured slower: the C tiles' loads and stores cost more than the L1 reuse
  gained (bench/results/2026-12-07-bf16.md). The tile
  configuration is loaded on every call (a thread's configuration may have been changed
  by other code in the process between calls: ONNX Runtime's, another library's) and
  released at the end. Linux gives a process the AMX state only after it asks
  (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): the module's constructor asks
  once when the library is loaded (harmless where AMX is absent: the call fails and no
  AMX kernel is built for such a machine).
- `hidetc_bf16_gemm_dp` (AVX512_BF16 without AMX: Zen 4, Cooper Lake): 8 rows x 32
  columns of f32 accumulators (16 zmm) per micro-tile, each k pair a broadcast A pair
  times two B rows.

Both are `noinline` functions with a `target` attribute, so the rest of the unit keeps
the target ISA's flags (`hidetc.backends.toolchain.gcc.flags_for`): only these functions
use the instructions, and only kernels of a bf16 compile call them.
"""
from __future__ import annotations

BF16_SOURCE = r"""
/* bf16 GEMM blocks (hidetc.backends.codegen.c_bf16) */
extern long syscall(long number, ...);
__attribute__((constructor)) static void hidetc_amx_permit(void) {
  syscall(158 /* SYS_arch_prctl, x86-64 */, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
          18 /* XFEATURE_XTILEDATA */);
}
#define HIDETC_AMX_KSTEPS 32  /* K block: 32 x 32 = 1024 (bench/results/2026-12-07-bf16.md) */
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} hidetc_tilecfg;

__attribute__((noinline, unused, target("amx-tile,amx-bf16")))
static void hidetc_bf16_gemm_amx(const uint16_t *a, long lda, const uint16_t *b, long pst,
                                 float *c, long ldc, long rows, long panels, long kp) {
  hidetc_tilecfg cfg = {0};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
  _tile_loadconfig(&cfg);
  long groups = (rows + 15) / 16, steps = kp / 32;
  for (long k0 = 0; k0 < steps; k0 += HIDETC_AMX_KSTEPS) {
    long k1 = k0 + HIDETC_AMX_KSTEPS < steps ? k0 + HIDETC_AMX_KSTEPS : steps;
    for (long g = 0; g < groups; g += 2) {
      int two_rows = g + 1 < groups;
      const uint16_t *a0 = a + g * 16 * lda, *a1 = a0 + 16 * lda;
      for (long p = 0; p < panels; p += 2) {
        int two_cols = p + 1 < panels;
        const uint16_t *b0 = b + p * pst, *b1 = b0 + pst;
        float *c0 = c + g * 16 * ldc + p * 16;
        if (k0 == 0) {
          _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        } else {
          _tile_loadd(0, c0, ldc * 4);
          if (two_cols) _tile_loadd(1, c0 + 16, ldc * 4);
          if (two_rows) {
            _tile_loadd(2, c0 + 16 * ldc, ldc * 4);
            if (two_cols) _tile_loadd(3, c0 + 16 * ldc + 16, ldc * 4);
          }
        }
        for (long s = k0; s < k1; ++s) {
          _tile_loadd(4, a0 + s * 512, 64);
          _tile_loadd(6, b0 + s * 512, 64);
          _tile_dpbf16ps(0, 4, 6);
          if (two_cols) { _tile_loadd(7, b1 + s * 512, 64); _tile_dpbf16ps(1, 4, 7); }
          if (two_rows) {
            _tile_loadd(5, a1 + s * 512, 64);
            _tile_dpbf16ps(2, 5, 6);
            if (two_cols) _tile_dpbf16ps(3, 5, 7);
          }
        }
        _tile_stored(0, c0, ldc * 4);
        if (two_cols) _tile_stored(1, c0 + 16, ldc * 4);
        if (two_rows) {
          _tile_stored(2, c0 + 16 * ldc, ldc * 4);
          if (two_cols) _tile_stored(3, c0 + 16 * ldc + 16, ldc * 4);
        }
      }
    }
  }
  _tile_release();
}

__attribute__((noinline, unused, target("avx512f,avx512bf16")))
static void hidetc_bf16_gemm_dp(const uint16_t *a, long lda, const uint16_t *b, long pst,
                                float *c, long ldc, long rows, long panels, long kp) {
  long blocks = (rows + 7) / 8, pairs = kp / 2;
  for (long p = 0; p < panels; p += 2) {
    int two = p + 1 < panels;
    const uint16_t *b0 = b + p * pst, *b1 = two ? b0 + pst : b0;
    for (long blk = 0; blk < blocks; ++blk) {
      const uint16_t *ar = a + (blk / 2) * 16 * lda + (blk % 2) * 8 * 32;
      __m512 acc[8][2];
      for (int r = 0; r < 8; ++r) { acc[r][0] = _mm512_setzero_ps(); acc[r][1] = acc[r][0]; }
      for (long i = 0; i < pairs; ++i) {
        __m512i v0 = _mm512_loadu_si512((const void *)(b0 + i * 32));
        __m512i v1 = _mm512_loadu_si512((const void *)(b1 + i * 32));
        const uint16_t *ak = ar + (i / 16) * 512 + (i % 16) * 2;
        for (int r = 0; r < 8; ++r) {
          uint32_t pair;
          __builtin_memcpy(&pair, ak + r * 32, 4);
          __m512i x = _mm512_set1_epi32((int)pair);
          acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)x, (__m512bh)v0);
          acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)x, (__m512bh)v1);
        }
      }
      float *cr = c + blk * 8 * ldc + p * 16;
      for (int r = 0; r < 8; ++r) {
        _mm512_storeu_ps(cr + r * ldc, acc[r][0]);
        if (two) _mm512_storeu_ps(cr + r * ldc + 16, acc[r][1]);
      }
    }
  }
}
"""
