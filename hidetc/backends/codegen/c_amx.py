"""The AMX pieces the bf16 and int8 GEMM blocks share (`c_bf16`, `c_int8`).

`AMX_PRELUDE`: the tile configuration type and the constructor that asks Linux for the
AMX state once when the library is loaded (`arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)`: a process gets the tile registers only after asking; harmless
where AMX is absent -- the call fails and no AMX kernel is built for such a machine).
The C printer carries it once in a unit that calls either block.

`amx_block(...)`: the C of one AMX block -- C[rows][panels * 16] = A x B with 16x16
C tiles, 2 x 2 of them per step (tmm0-3), A tiles of 16 rows x 64 bytes (tmm4-5), B
tiles of 16 rows x 64 bytes (tmm6-7); the loops run over K blocks of `ksteps` tiles,
32-row groups, then column-panel pairs (the two A tiles of a group reused from L1 by
every panel pair); C tiles start at zero in the first K block and are loaded back in
the later ones. The tile configuration is loaded on every call (another library in the
process may have changed the thread's) and released at the end. A's tiles are
contiguous KBs (`a_tile` elements each, a row group `16 * lda` elements apart), a
panel's B tiles contiguous KBs (`b_tile` elements each) -- the layouts both callers
pack (their module docstrings).
"""
from __future__ import annotations

AMX_PRELUDE = r"""
/* AMX set-up (hidetc.backends.codegen.c_amx) */
extern long syscall(long number, ...);
__attribute__((constructor)) static void hidetc_amx_permit(void) {
  syscall(158 /* SYS_arch_prctl, x86-64 */, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
          18 /* XFEATURE_XTILEDATA */);
}
typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} hidetc_tilecfg;
"""


def amx_block(name: str, features: str, params: str, types: tuple[str, str, str],
              lda: str, k_unit: int, ksteps: int, a_tile: int, b_tile: int, dp: str) -> str:
    """The C function `name(params)` (see the module docstring): `types` are A's, B's
    and C's element types, `lda` the expression of A's row length, `k_unit` the k per
    tile, `dp` the tile instruction (`_tile_dpbf16ps`, `_tile_dpbusd`)."""
    a_t, b_t, c_t = types
    return rf"""
__attribute__((noinline, unused, target("{features}")))
static void {name}({params}) {{
  hidetc_tilecfg cfg = {{0}};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {{ cfg.rows[t] = 16; cfg.colsb[t] = 64; }}
  _tile_loadconfig(&cfg);
  long groups = (rows + 15) / 16, steps = kp / {k_unit};
  for (long k0 = 0; k0 < steps; k0 += {ksteps}) {{
    long k1 = k0 + {ksteps} < steps ? k0 + {ksteps} : steps;
    for (long g = 0; g < groups; g += 2) {{
      int two_rows = g + 1 < groups;
      const {a_t} *a0 = a + g * 16 * {lda}, *a1 = a0 + 16 * {lda};
      for (long p = 0; p < panels; p += 2) {{
        int two_cols = p + 1 < panels;
        const {b_t} *b0 = b + p * pst, *b1 = b0 + pst;
        {c_t} *c0 = c + g * 16 * ldc + p * 16;
        if (k0 == 0) {{
          _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        }} else {{
          _tile_loadd(0, c0, ldc * 4);
          if (two_cols) _tile_loadd(1, c0 + 16, ldc * 4);
          if (two_rows) {{
            _tile_loadd(2, c0 + 16 * ldc, ldc * 4);
            if (two_cols) _tile_loadd(3, c0 + 16 * ldc + 16, ldc * 4);
          }}
        }}
        for (long s = k0; s < k1; ++s) {{
          _tile_loadd(4, a0 + s * {a_tile}, 64);
          _tile_loadd(6, b0 + s * {b_tile}, 64);
          {dp}(0, 4, 6);
          if (two_cols) {{ _tile_loadd(7, b1 + s * {b_tile}, 64); {dp}(1, 4, 7); }}
          if (two_rows) {{
            _tile_loadd(5, a1 + s * {a_tile}, 64);
            {dp}(2, 5, 6);
            if (two_cols) {dp}(3, 5, 7);
          }}
        }}
        _tile_stored(0, c0, ldc * 4);
        if (two_cols) _tile_stored(1, c0 + 16, ldc * 4);
        if (two_rows) {{
          _tile_stored(2, c0 + 16 * ldc, ldc * 4);
          if (two_cols) _tile_stored(3, c0 + 16 * ldc + 16, ldc * 4);
        }}
      }}
    }}
  }}
  _tile_release();
}}
"""
