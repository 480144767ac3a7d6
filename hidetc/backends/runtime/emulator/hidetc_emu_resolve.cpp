/* hidetc_emu_resolve.cpp -- results of the warp collectives, per the CUDA Programming
 * Guide (shuffles, votes) and the PTX ISA (shfl.sync operands, ldmatrix and mma fragment
 * layouts). Called by the scheduler once every participant has deposited its operands
 * in Fiber::in; each writes the participants' Fiber::out. */
#include "hidetc_emu_internal.h"

#include <cstring>

namespace hidetc_emu {

void resolve_shfl(int kind, int warp, unsigned part) {
  uint64_t vals[32];
  for (int l = 0; l < 32; l++)
    if (part >> l & 1) std::memcpy(&vals[l], g_fibers[warp * 32 + l].in, 8);
  for (int l = 0; l < 32; l++) {
    if (!(part >> l & 1)) continue;
    Fiber &f = g_fibers[warp * 32 + l];
    HidetcEmuShflIn in;
    std::memcpy(&in, f.in, sizeof in);
    /* PTX ISA, shfl.sync: c = (segment mask << 8) | clamp */
    int b = in.b & 31, cval = in.c & 31, seg = (in.c >> 8) & 31;
    int max_lane = (l & seg) | (cval & ~seg), min_lane = l & seg, j = l;
    bool ok = true;
    if (kind == HIDETC_EMU_SHFL_UP) { j = l - b; ok = j >= max_lane; }
    else if (kind == HIDETC_EMU_SHFL_DOWN) { j = l + b; ok = j <= max_lane; }
    else if (kind == HIDETC_EMU_SHFL_XOR) { j = l ^ b; ok = j <= max_lane; }
    else { j = min_lane | (b & ~seg); ok = j <= max_lane; }
    /* an inactive source lane gives an undefined value on the GPU: here, our own */
    if (!ok || j < 0 || j > 31 || !(part >> j & 1)) j = l;
    std::memcpy(f.out, &vals[j], 8);
  }
}

void resolve_vote(int kind, int warp, unsigned part) {
  unsigned ballot = 0;
  for (int l = 0; l < 32; l++) {
    int pred = 0;
    if (part >> l & 1) std::memcpy(&pred, g_fibers[warp * 32 + l].in, sizeof pred);
    if (pred) ballot |= 1u << l;
  }
  unsigned r = kind == HIDETC_EMU_BALLOT ? ballot
             : kind == HIDETC_EMU_ANY    ? (unsigned)(ballot != 0)
                                         : (unsigned)(ballot == part);
  for (int l = 0; l < 32; l++)
    if (part >> l & 1) std::memcpy(g_fibers[warp * 32 + l].out, &r, sizeof r);
}

static uint16_t load_b16(const void *row, int col) {
  uint16_t v;
  std::memcpy(&v, static_cast<const char *>(row) + 2 * col, 2);
  return v;
}

/* PTX ISA, ldmatrix .m8n8 .b16: lane i gives the address of row i%8 of matrix i/8;
 * lane l receives, per matrix, (row l/4, cols 2*(l%4), +1), transposed with .trans. */
void resolve_ldmatrix(int kind, int warp) {
  int base = kind >= HIDETC_EMU_LDMATRIX_X1_TRANS ? HIDETC_EMU_LDMATRIX_X1_TRANS : HIDETC_EMU_LDMATRIX_X1;
  bool trans = base == HIDETC_EMU_LDMATRIX_X1_TRANS;
  int n = 1 << (kind - base);
  const void *rows[32];
  for (int i = 0; i < 8 * n; i++) {
    std::memcpy(&rows[i], g_fibers[warp * 32 + i].in, sizeof(void *));
    if (reinterpret_cast<uintptr_t>(rows[i]) & 15)
      hidetc_emu_fail("%s: lane %d gives a row address %p that is not 16-byte aligned",
                      kKindNames[kind], i, rows[i]);
  }
  for (int l = 0; l < 32; l++) {
    uint32_t regs[4] = {0, 0, 0, 0};
    int r = l / 4, c = 2 * (l % 4);
    for (int m = 0; m < n; m++) {
      uint16_t lo = trans ? load_b16(rows[8 * m + c], r) : load_b16(rows[8 * m + r], c);
      uint16_t hi = trans ? load_b16(rows[8 * m + c + 1], r) : load_b16(rows[8 * m + r], c + 1);
      regs[m] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
    std::memcpy(g_fibers[warp * 32 + l].out, regs, sizeof regs);
  }
}

/* PTX ISA, mma.m16n8k16 .f16 and .bf16 (groupID g = lane/4, threadID_in_group t = lane%4):
 * A regs {(g,2t) (g+8,2t) (g,2t+8) (g+8,2t+8)} (+1 col in the high half),
 * B regs {(2t,g) (2t+8,g)} (+1 row in the high half), C/D {(g,2t) (g,2t+1) (g+8,2t) (g+8,2t+1)}.
 * Products are exact; the sum is accumulated in double and rounded to float once. */
static float element16(uint32_t bits, bool bf16) {
  return bf16 ? hidetc_emu_bf16_bits_to_f32((uint16_t)bits) : hidetc_emu_f16_bits_to_f32((uint16_t)bits);
}

void resolve_mma(int warp, bool bf16) {
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; l++) {
    uint32_t a[4], b[2];
    float c[4];
    const unsigned char *in = g_fibers[warp * 32 + l].in;
    std::memcpy(a, in, 16), std::memcpy(b, in + 16, 8), std::memcpy(c, in + 24, 16);
    int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) {
      int row = g + 8 * (i & 1), col = 2 * t + 8 * (i >> 1);
      A[row][col] = element16(a[i] & 0xffffu, bf16);
      A[row][col + 1] = element16(a[i] >> 16, bf16);
    }
    for (int i = 0; i < 2; i++) {
      B[2 * t + 8 * i][g] = element16(b[i] & 0xffffu, bf16);
      B[2 * t + 8 * i + 1][g] = element16(b[i] >> 16, bf16);
    }
    for (int i = 0; i < 4; i++) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = c[i];
  }
  for (int l = 0; l < 32; l++) {
    int g = l / 4, t = l % 4;
    float d[4];
    for (int i = 0; i < 4; i++) {
      int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
      double acc = C[row][col];
      for (int k = 0; k < 16; k++) acc += (double)A[row][k] * (double)B[k][col];
      d[i] = (float)acc;
    }
    std::memcpy(g_fibers[warp * 32 + l].out, d, sizeof d);
  }
}

/* PTX ISA, mma.m16n8k32 .u8 / .s8 (g = lane/4, t = lane%4; each register four elements,
 * low byte first, along k): A regs {(g, 4t..4t+3) (g+8, 4t..) (g, 16+4t..) (g+8, 16+4t..)},
 * B regs {(4t..4t+3, g) (16+4t.., g)}, C/D int32 {(g,2t) (g,2t+1) (g+8,2t) (g+8,2t+1)}.
 * Products exact; d = c + the sum of the 32 products, wrapping modulo 2^32 (no .satfinite).
 * The operand types follow the fragments (in + 40: bit 0 an int8 A, bit 1 an int8 B). */
static int element8(uint32_t reg, int q, bool is_signed) {
  uint8_t byte = (uint8_t)(reg >> (8 * q));
  return is_signed ? (int)(int8_t)byte : (int)byte;
}

void resolve_mma_int8(int warp) {
  int A[16][32], B[32][8];
  uint32_t C[16][8];
  int signs = 0;
  std::memcpy(&signs, g_fibers[warp * 32].in + 40, sizeof signs);
  for (int l = 0; l < 32; l++) {
    uint32_t a[4], b[2], c[4];
    const unsigned char *in = g_fibers[warp * 32 + l].in;
    std::memcpy(a, in, 16), std::memcpy(b, in + 16, 8), std::memcpy(c, in + 24, 16);
    int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++)
      for (int q = 0; q < 4; q++)
        A[g + 8 * (i & 1)][4 * t + 16 * (i >> 1) + q] = element8(a[i], q, signs & 1);
    for (int i = 0; i < 2; i++)
      for (int q = 0; q < 4; q++) B[4 * t + 16 * i + q][g] = element8(b[i], q, signs & 2);
    for (int i = 0; i < 4; i++) C[g + 8 * (i >> 1)][2 * t + (i & 1)] = c[i];
  }
  for (int l = 0; l < 32; l++) {
    int g = l / 4, t = l % 4;
    uint32_t d[4];
    for (int i = 0; i < 4; i++) {
      int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
      uint32_t acc = C[row][col];
      for (int k = 0; k < 32; k++) acc += (uint32_t)(A[row][k] * B[k][col]);
      d[i] = acc;
    }
    std::memcpy(g_fibers[warp * 32 + l].out, d, sizeof d);
  }
}

}  // namespace hidetc_emu
