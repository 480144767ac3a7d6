"""Every emulated intrinsic against an independent reference: shuffles of all kinds and
widths (CUDA Programming Guide semantics), votes with partial masks, __syncwarp,
float16 conversions on every half and on float/double edge values (numpy's correctly
rounded conversions), bfloat16 conversions the same way (every bfloat16, float and double
ties, the reference rounding written out here), atomics, the ldmatrix fragment layouts
and mma.m16n8k16 on f16 and on bf16 operands (PTX ISA layouts, written out here
independently of the emulator). The hand-written kernels
are one .cu unit that nvcc must also compile for sm_80 and sm_90."""
import shutil

import ml_dtypes  # noqa: F401  (the "bfloat16" dtype name)
import numpy as np
import pytest
from helpers.kernel_device import kernel_module

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR
from hidetc.backends.toolchain.nvcc import compile_cubins

NVCC = shutil.which("nvcc")
RNG = np.random.default_rng(1)
SOURCE = r"""
#include "hidetc_cuda.h"

extern "C" __global__ void shuffles(const float *in, float *out, double *outd, half *outh,
                                    int delta, int width, int src) {
  int t = threadIdx.x, n = blockDim.x;
  float v = in[t];
  out[0 * n + t] = __shfl_sync(0xffffffffu, v, src + t % 3, width);
  out[1 * n + t] = __shfl_up_sync(0xffffffffu, v, delta, width);
  out[2 * n + t] = __shfl_down_sync(0xffffffffu, v, delta, width);
  out[3 * n + t] = __shfl_xor_sync(0xffffffffu, v, delta, width);
  outd[t] = __shfl_down_sync(0xffffffffu, (double)v * 3.0, delta, width);
  outh[t] = __shfl_xor_sync(0xffffffffu, __float2half_rn(v), delta, width);
}

extern "C" __global__ void votes(const float *in, unsigned *ballot, int *any, int *all,
                                 unsigned mask) {
  int t = threadIdx.x, lane = t % 32;
  ballot[t] = 0xdeadbeefu; any[t] = -7; all[t] = -7;
  if (mask >> lane & 1) {
    ballot[t] = __ballot_sync(mask, in[t] > 0.0f);
    any[t] = __any_sync(mask, in[t] > 1.0f);
    all[t] = __all_sync(mask, in[t] > -1.0f);
  }
}

extern "C" __global__ void syncwarp_neighbours(const int *in, int *out) {
  __shared__ int s[32];
  int lane = threadIdx.x;
  s[lane] = in[lane] * 2;
  __syncwarp();
  out[lane] = s[(lane + 1) % 32];
}

extern "C" __global__ void half_convert(const unsigned short *hbits, float *h2f,
                                        const float *f, unsigned short *f2h,
                                        const double *d, unsigned short *d2h, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    h2f[i] = __half2float(__ushort_as_half(hbits[i]));
    f2h[i] = __half_as_ushort(__float2half_rn(f[i]));
    d2h[i] = __half_as_ushort(__double2half(d[i]));
  }
}

extern "C" __global__ void bf16_convert(const unsigned short *bbits, float *b2f,
                                        const float *f, unsigned short *f2b,
                                        const double *d, unsigned short *d2b, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    b2f[i] = __bfloat162float(__ushort_as_bfloat16(bbits[i]));
    f2b[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f[i]));
    d2b[i] = __bfloat16_as_ushort(__double2bfloat16(d[i]));
  }
}

extern "C" __global__ void atomics(const int *keys, const float *vals, int *hist,
                                   float *fsum, int *maxi, int *slot, int *winners, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  atomicAdd(&hist[keys[i]], 1);
  atomicAdd(&fsum[keys[i]], vals[i]);
  atomicMax(&maxi[keys[i]], i);
  atomicMin(&maxi[7 + keys[i]], i);
  atomicSub(&hist[7 + keys[i]], 2);
  atomicExch(&slot[1], 42);
  if (atomicCAS(&slot[0], -1, i) == -1) atomicAdd(&winners[0], 1);
}

/* every vector copy helper and cp.async size; 64 threads, one 16-byte chunk each */
extern "C" __global__ void copies(const float *in, float *out) {
  __shared__ __align__(16) float s[3][256];
  int t = threadIdx.x;
  hidetc_cp_async16(&s[0][4 * t], &in[4 * t], t % 5 != 0);
  hidetc_cp_async8(&s[1][4 * t], &in[4 * t], true);
  hidetc_cp_async8(&s[1][4 * t + 2], &in[4 * t + 2], t % 5 != 0);
  for (int k = 0; k < 4; k++) hidetc_cp_async4(&s[2][4 * t + k], &in[4 * t + k], k != t % 4);
  hidetc_cp_async_commit();
  hidetc_cp_async_wait_group(0);
  __syncthreads();
  hidetc_copy16(&out[4 * t], &s[0][4 * t]);
  hidetc_copy8(&out[256 + 4 * t], &s[1][4 * t]);
  hidetc_copy8(&out[256 + 4 * t + 2], &s[1][4 * t + 2]);
  for (int k = 0; k < 4; k++) hidetc_copy4(&out[512 + 4 * t + k], &s[2][4 * t + k]);
  hidetc_ld_f4(&out[768 + 4 * t], &in[4 * t]);
}

/* rows[r] is 8 halves (16 bytes); lane i gives row perm(i) as row i%8 of matrix i/8 */
extern "C" __global__ void ldmatrix_layouts(const unsigned short *src, unsigned *out) {
  __shared__ __align__(16) unsigned short rows[32][8];
  int lane = threadIdx.x;
  for (int k = 0; k < 8; k++) rows[lane][k] = src[lane * 8 + k];
  __syncthreads();
  const void *row = &rows[(lane * 7 + 3) % 32][0];
  unsigned r[4];
  hidetc_ldmatrix_x1(r, row);       for (int k = 0; k < 1; k++) out[(0 * 32 + lane) * 4 + k] = r[k];
  hidetc_ldmatrix_x2(r, row);       for (int k = 0; k < 2; k++) out[(1 * 32 + lane) * 4 + k] = r[k];
  hidetc_ldmatrix_x4(r, row);       for (int k = 0; k < 4; k++) out[(2 * 32 + lane) * 4 + k] = r[k];
  hidetc_ldmatrix_x1_trans(r, row); for (int k = 0; k < 1; k++) out[(3 * 32 + lane) * 4 + k] = r[k];
  hidetc_ldmatrix_x2_trans(r, row); for (int k = 0; k < 2; k++) out[(4 * 32 + lane) * 4 + k] = r[k];
  hidetc_ldmatrix_x4_trans(r, row); for (int k = 0; k < 4; k++) out[(5 * 32 + lane) * 4 + k] = r[k];
}

/* fragments gathered from global memory per the PTX ISA layout (no ldmatrix) */
extern "C" __global__ void mma_fragments(const unsigned short *A, const unsigned short *B,
                                         const float *C, float *D, int bf16) {
  int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  unsigned a[4], b[2];
  float c[4], d[4];
  for (int i = 0; i < 4; i++) {
    int row = g + 8 * (i % 2), col = 2 * t + 8 * (i / 2);
    a[i] = A[row * 16 + col] | (unsigned)A[row * 16 + col + 1] << 16;
    c[i] = C[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  }
  for (int i = 0; i < 2; i++)
    b[i] = B[(2 * t + 8 * i) * 8 + g] | (unsigned)B[(2 * t + 8 * i + 1) * 8 + g] << 16;
  if (bf16) hidetc_mma_m16n8k16_bf16f32(d, a, b, c);
  else hidetc_mma_m16n8k16_f16f32(d, a, b, c);
  for (int i = 0; i < 4; i++) D[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}

#ifdef HIDETC_EMULATE
extern "C" void shuffles_emu_entry(void **a) {
  shuffles((const float *)a[0], (float *)a[1], (double *)a[2], (half *)a[3], *(int *)a[4],
           *(int *)a[5], *(int *)a[6]);
}
extern "C" void votes_emu_entry(void **a) {
  votes((const float *)a[0], (unsigned *)a[1], (int *)a[2], (int *)a[3], *(unsigned *)a[4]);
}
extern "C" void syncwarp_neighbours_emu_entry(void **a) {
  syncwarp_neighbours((const int *)a[0], (int *)a[1]);
}
extern "C" void half_convert_emu_entry(void **a) {
  half_convert((const unsigned short *)a[0], (float *)a[1], (const float *)a[2],
               (unsigned short *)a[3], (const double *)a[4], (unsigned short *)a[5], *(int *)a[6]);
}
extern "C" void bf16_convert_emu_entry(void **a) {
  bf16_convert((const unsigned short *)a[0], (float *)a[1], (const float *)a[2],
               (unsigned short *)a[3], (const double *)a[4], (unsigned short *)a[5], *(int *)a[6]);
}
extern "C" void atomics_emu_entry(void **a) {
  atomics((const int *)a[0], (const float *)a[1], (int *)a[2], (float *)a[3], (int *)a[4],
          (int *)a[5], (int *)a[6], *(int *)a[7]);
}
extern "C" void copies_emu_entry(void **a) { copies((const float *)a[0], (float *)a[1]); }
extern "C" void ldmatrix_layouts_emu_entry(void **a) {
  ldmatrix_layouts((const unsigned short *)a[0], (unsigned *)a[1]);
}
extern "C" void mma_fragments_emu_entry(void **a) {
  mma_fragments((const unsigned short *)a[0], (const unsigned short *)a[1],
                (const float *)a[2], (float *)a[3], *(int *)a[4]);
}
#endif
"""


@pytest.fixture(scope="module")
def module():
    return kernel_module({"emu_intrinsics": SOURCE})


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_nvcc_compiles_the_intrinsics(tmp_path):
    compile_cubins({"emu_intrinsics": SOURCE}, ("sm_80", "sm_90"), tmp_path,
                   include_dirs=[CUDA_INCLUDE_DIR], ptx=False)


# shuffles: the Programming Guide's wording, per lane -----------------------------------
def ref_shuffle(kind, values, arg, width):
    out = values.copy()
    for t in range(len(values)):
        lane, base = t % 32, t - t % 32
        seg = lane - lane % width
        if kind == "idx":
            src = seg + (arg[t] % width)          # srcLane modulo width, in my segment
        elif kind == "up":
            src = lane - arg if lane - arg >= seg else lane        # no wrap-around
        elif kind == "down":
            src = lane + arg if lane + arg < seg + width else lane
        else:  # xor: earlier segments are readable, later ones give my own value
            src = lane ^ arg if (lane ^ arg) < seg + width else lane
        out[t] = values[base + src]
    return out


@pytest.mark.parametrize("delta,width,src", [(1, 32, 0), (5, 32, 30), (16, 32, 7),
                                             (1, 16, 3), (3, 8, 13), (2, 4, 1), (8, 8, -1),
                                             (31, 32, 2)])
def test_shuffles(module, delta, width, src):
    n = 64
    x = RNG.standard_normal(n).astype(np.float32)
    out, outd, outh = np.zeros(4 * n, np.float32), np.zeros(n), np.zeros(n, np.float16)
    module.launch("shuffles", 1, n, [x, out, outd, outh, np.int32(delta), np.int32(width),
                                     np.int32(src)])
    srcs = np.array([src + t % 3 for t in range(n)])
    np.testing.assert_array_equal(out[:n], ref_shuffle("idx", x, srcs, width))
    for k, kind in enumerate(("up", "down", "xor"), start=1):
        np.testing.assert_array_equal(out[k * n:(k + 1) * n], ref_shuffle(kind, x, delta, width),
                                      err_msg=kind)
    np.testing.assert_array_equal(outd, ref_shuffle("down", x.astype(np.float64) * 3, delta,
                                                    width))
    np.testing.assert_array_equal(outh, ref_shuffle("xor", x.astype(np.float16), delta, width))


@pytest.mark.parametrize("mask", [0xFFFFFFFF, 0x0000FFFF, 0x5555AAAA, 0x80000001])
def test_votes_with_masks(module, mask):
    x = RNG.uniform(-1.5, 1.5, 64).astype(np.float32)
    ballot, anyv, allv = np.zeros(64, np.uint32), np.zeros(64, np.int32), np.zeros(64, np.int32)
    module.launch("votes", 1, 64, [x, ballot, anyv, allv, np.uint32(mask)])
    for w in range(2):
        lanes = [lane for lane in range(32) if mask >> lane & 1]
        xs = x[32 * w:32 * w + 32]
        want = sum(1 << lane for lane in lanes if xs[lane] > 0)
        for lane in range(32):
            t = 32 * w + lane
            if lane in lanes:
                assert ballot[t] == want
                assert anyv[t] == int(any(xs[j] > 1 for j in lanes))
                assert allv[t] == int(all(xs[j] > -1 for j in lanes))
            else:
                assert (ballot[t], anyv[t], allv[t]) == (0xDEADBEEF, -7, -7)


def test_syncwarp_orders_shared_memory(module):
    x = np.arange(32, dtype=np.int32) * 3
    out = np.zeros(32, np.int32)
    module.launch("syncwarp_neighbours", 1, 32, [x, out])
    np.testing.assert_array_equal(out, np.roll(x * 2, -1))


# float16 conversions -------------------------------------------------------------------
def _edge_floats():
    half_ulps = np.arange(0, 1 << 16, dtype=np.uint16).view(np.float16).astype(np.float64)
    finite = half_ulps[np.isfinite(half_ulps)]
    mids = (np.sort(finite)[:-1] + np.sort(finite)[1:]) / 2           # exact ties
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 65536, 1e30,
                2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001, 2.0 ** -26, 6.1e-5, 1e-45]
    return np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                           specials, -np.array(specials)])


def test_half_conversions_every_half_and_edge_values(module):
    n = 1 << 16
    hbits = np.arange(n, dtype=np.uint16)
    f = np.concatenate([_edge_floats().astype(np.float32), RNG.integers(
        0, 2 ** 32, n, dtype=np.uint32).view(np.float32)])[:n]
    d = np.concatenate([_edge_floats(), (RNG.standard_normal(n) * 1e3)])[:n]
    d[::7] = np.nextafter(d[::7].astype(np.float16).astype(np.float64), np.inf)  # near ties
    h2f, f2h, d2h = np.zeros(n, np.float32), np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    module.launch("half_convert", 64, 256, [hbits, h2f, f, f2h, d, d2h, np.int32(n)])
    np.testing.assert_array_equal(h2f.view(np.uint32), hbits.view(np.float16).astype(
        np.float32).view(np.uint32))  # exact bits, NaN payloads included
    with np.errstate(over="ignore"):
        for got, src in ((f2h, f), (d2h, d)):
            want = src.astype(np.float16)
            nan = np.isnan(want)
            assert (np.isnan(got.view(np.float16)) == nan).all()
            np.testing.assert_array_equal(got[~nan], want.view(np.uint16)[~nan])


# bfloat16 conversions ------------------------------------------------------------------
BF16_MAX = (2.0 - 2.0 ** -7) * 2.0 ** 127


def bf16_rounded(x: np.ndarray) -> np.ndarray:
    """float64 -> the nearest bfloat16 (ties to even), as float64, written out: the
    quantum is 2^(e - 8) for |x| in [2^(e-1), 2^e) (8 significant bits), at least the
    smallest subnormal 2^-133; past the largest finite value plus half its quantum, inf.
    (ml_dtypes rounds a double to float first: twice.)"""
    out = np.array(x, np.float64)
    finite = np.isfinite(out) & (out != 0)
    _, e = np.frexp(out[finite])
    quantum = np.ldexp(1.0, np.maximum(e - 8, -133))
    out[finite] = np.round(out[finite] / quantum) * quantum      # numpy: ties to even
    big = np.abs(out) > BF16_MAX
    out[big] = np.copysign(np.inf, out[big])
    return out


def _bf16_edge_doubles():
    with np.errstate(invalid="ignore"):              # the NaN bit patterns
        bf16 = np.arange(1 << 16, dtype=np.uint16).view("bfloat16").astype(np.float64)
    finite = np.sort(bf16[np.isfinite(bf16)])
    mids = (finite[:-1] + finite[1:]) / 2                          # exact ties
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, BF16_MAX, 3.4e38, 2.0 ** -133,
                2.0 ** -134, 2.0 ** -134 * 1.0000001, 2.0 ** -135, 1e-45, 1e300]
    return np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                           specials, -np.array(specials)])


def test_bf16_conversions_every_bf16_and_edge_values(module):
    """bf16 -> float exact on every bf16 (NaN payloads included); float -> bf16 and
    double -> bf16 rounded once to nearest even (a double near a tie is not rounded
    to float first), NaN stays NaN, past the range inf."""
    n = 1 << 16
    bbits = np.arange(n, dtype=np.uint16)
    edges = _bf16_edge_doubles()
    with np.errstate(over="ignore"):                 # 1e300 -> inf
        f = np.concatenate([edges.astype(np.float32), RNG.integers(
            0, 2 ** 32, n, dtype=np.uint32).view(np.float32)])[:n]
    d = np.concatenate([edges, RNG.standard_normal(n) * 1e3])[:n]
    b2f, f2b, d2b = np.zeros(n, np.float32), np.zeros(n, np.uint16), np.zeros(n, np.uint16)
    module.launch("bf16_convert", 64, 256, [bbits, b2f, f, f2b, d, d2b, np.int32(n)])
    np.testing.assert_array_equal(b2f.view(np.uint32), bbits.astype(np.uint32) << 16)
    with np.errstate(over="ignore", invalid="ignore"):
        for got, src in ((f2b, f.astype(np.float64)), (d2b, d)):
            want = bf16_rounded(src)
            nan = np.isnan(want)
            assert (np.isnan(got.view("bfloat16").astype(np.float64)) == nan).all()
            np.testing.assert_array_equal(got.view("bfloat16").astype(np.float64)[~nan],
                                          want[~nan])
    assert np.array_equal(f2b[:len(edges)][np.isfinite(f[:len(edges)])],   # ml_dtypes
                          f[:len(edges)][np.isfinite(f[:len(edges)])].astype("bfloat16")
                          .view(np.uint16))


def test_atomics(module):
    n = 1000
    keys = RNG.integers(0, 7, n).astype(np.int32)
    vals = RNG.standard_normal(n).astype(np.float32)
    hist, fsum = np.zeros(14, np.int32), np.zeros(7, np.float32)
    maxi = np.concatenate([np.full(7, -1, np.int32), np.full(7, n, np.int32)])
    slot, winners = np.full(2, -1, np.int32), np.zeros(1, np.int32)
    module.launch("atomics", 8, 128, [keys, vals, hist, fsum, maxi, slot, winners, np.int32(n)])
    counts = np.bincount(keys, minlength=7)
    np.testing.assert_array_equal(hist, np.concatenate([counts, -2 * counts]))
    np.testing.assert_allclose(fsum, np.bincount(keys, vals, minlength=7), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(maxi[:7], [np.nonzero(keys == k)[0].max() for k in range(7)])
    np.testing.assert_array_equal(maxi[7:], [np.nonzero(keys == k)[0].min() for k in range(7)])
    assert winners[0] == 1 and 0 <= slot[0] < n and slot[1] == 42


def test_vector_and_async_copies(module):
    x = RNG.standard_normal(256).astype(np.float32)
    out = np.zeros(1024, np.float32)
    module.launch("copies", 1, 64, [x, out])
    t, k = np.arange(256) // 4, np.arange(256) % 4
    np.testing.assert_array_equal(out[:256], np.where(t % 5 != 0, x, 0))
    np.testing.assert_array_equal(out[256:512], np.where((k < 2) | (t % 5 != 0), x, 0))
    np.testing.assert_array_equal(out[512:768], np.where(k != t % 4, x, 0))
    np.testing.assert_array_equal(out[768:], x)


# ldmatrix and mma: the PTX ISA fragment layouts ----------------------------------------
def ref_ldmatrix(rows, count, trans):
    """Lane i gives the address of row i%8 of matrix i/8; lane l receives, per matrix m,
    elements (l/4, 2*(l%4)) and (l/4, 2*(l%4)+1) -- or their transposes -- low half first."""
    mats = np.array([[rows[((8 * m + r) * 7 + 3) % 32] for r in range(8)] for m in range(4)])
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        r, c = lane // 4, 2 * (lane % 4)
        for m in range(count):
            mat = mats[m].T if trans else mats[m]
            out[lane, m] = int(mat[r, c]) | int(mat[r, c + 1]) << 16
    return out


def test_ldmatrix_layouts(module):
    src = RNG.integers(0, 1 << 16, (32, 8)).astype(np.uint16)
    out = np.zeros((6, 32, 4), np.uint32)
    module.launch("ldmatrix_layouts", 1, 32, [src, out])
    for v, (count, trans) in enumerate([(1, False), (2, False), (4, False),
                                        (1, True), (2, True), (4, True)]):
        want = ref_ldmatrix(src, count, trans)
        np.testing.assert_array_equal(out[v, :, :count], want[:, :count],
                                      err_msg=f"x{count} trans={trans}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mma_m16n8k16(module, dtype):
    """d = a @ b + c on random fragments of each operand type: the products are exact in
    f32, so the result is the float64 one within the f32 accumulation. bfloat16 operands
    span float32's range (a bf16 read as f16 would be far off)."""
    scale = 2.0 ** RNG.integers(-20, 21, (16, 1)) if dtype == "bfloat16" else 1.0
    A = (RNG.uniform(-2, 2, (16, 16)) * scale).astype(dtype)
    B = RNG.uniform(-2, 2, (16, 8)).astype(dtype)
    C = (RNG.standard_normal((16, 8)) * scale).astype(np.float32)
    D = np.zeros((16, 8), np.float32)
    module.launch("mma_fragments", 1, 32, [A.view(np.uint16), B.view(np.uint16), C, D,
                                           np.int32(dtype == "bfloat16")])
    want = A.astype(np.float64) @ B.astype(np.float64) + C
    bound = 1e-6 * (np.abs(want) + np.abs(want).max(axis=1, keepdims=True))   # per row's scale
    assert (np.abs(D - want) <= bound).all(), np.abs(D - want).max()
