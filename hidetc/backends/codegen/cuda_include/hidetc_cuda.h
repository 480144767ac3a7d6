/* hidetc_cuda.h -- the device header every generated .cu file includes.
 *
 * Two builds of the same source: nvcc (the real thing: inline PTX for cp.async,
 * ldmatrix and mma, each in ONE wrapper here), and g++ -DHIDETC_EMULATE (the emulator:
 * hidetc_emu.h supplies the CUDA built-ins, and every wrapper below has an emulated
 * twin with the same semantics, the warp-collective ones computed per the PTX ISA
 * fragment layouts by the emulator's scheduler).
 *
 * Helpers (names the CUDA printer emits, see hidetc/backends/codegen/cuda.py):
 *   HIDETC_DYNAMIC_SHARED(name, bytes)    a kernel's dynamic shared array
 *   HIDETC_SHARED_SLICE(T, name, n, base, offset)  one shared array inside it
 *   HIDETC_LOCAL_POISON(name)            a local array's undefined first contents
 *   HIDETC_SLD(a, i), HIDETC_SST(a, i, v) shared loads and stores (checked emulated)
 *   hidetc_{min,max}_<dtype>(a, b)       NaN-propagating for floats (numpy semantics)
 *   hidetc_{sigmoid,rsqrt}_<float dtype>  exact: 1/(1+exp(-x)), 1/sqrt(x)
 *   hidetc_<fn>_float16(...)             float16 math: computed in float, rounded once
 *   hidetc_hdiv(a, b)                    float16 division, correctly rounded
 *   (bfloat16 is __nv_bfloat16 of cuda_bf16.h: the printer computes it in float through
 *   __bfloat162float and rounds once with __float2bfloat16_rn; no helpers here)
 *   hidetc_{f2u,u2f,d2u,u2d,h2u,u2h}(x)  a float's bits as the unsigned integer of its
 *                                        width and back (BitCast)
 *   hidetc_copy{4,8,16}(dst, src)        one aligned vector load + store (4/8/16 bytes)
 *   hidetc_ld_f4(dst, src)               4 floats, 16-byte aligned
 *   hidetc_cp_async{4,8,16}(smem, gmem, pred)   async copy; !pred zero-fills smem
 *   hidetc_cp_async_commit(), hidetc_cp_async_wait_group(n) (n: 0..7), _wait_all()
 *   hidetc_ldmatrix_x{1,2,4}[_trans](dst_regs, smem_row)    ldmatrix .m8n8 .b16
 *   hidetc_mma_m16n8k16_f16f32(d, a, b, c)  d = a*b + c, fragments per the PTX ISA
 *   hidetc_mma_m16n8k16_bf16f32(d, a, b, c) the same on bfloat16 operands (same layouts)
 *   hidetc_mma_m16n8k32_<a><b>s32(d, a, b, c)  d = a*b + c on 8-bit integers, a, b in
 *                                        {u8, s8}; int32 sums wrapping modulo 2^32
 *   hidetc_byte_perm(x, y, s)            bytes of {y, x} picked by s's nibbles (prmt)
 *   hidetc_bytesum_{u8,s8}(x, acc)       acc + x's four bytes as uint8 / int8 (dp4a)
 * Alignment: vector copies, cp.async and ldmatrix rows need their size in alignment
 * (the emulator checks and fails the launch otherwise). */
#pragma once
#ifdef HIDETC_EMULATE
#include "hidetc_emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#endif

/* ---- a kernel's dynamic shared memory (its shared arrays past static memory's 48 KiB
 * are slices of it; the launch passes BYTES): extern on the GPU, a static array of
 * BYTES in the emulator (whose __shared__ is a static: one per kernel) ------------- */
#ifdef HIDETC_EMULATE
#define HIDETC_DYNAMIC_SHARED(NAME, BYTES) __shared__ __align__(16) unsigned char NAME[BYTES]
#else
#define HIDETC_DYNAMIC_SHARED(NAME, BYTES) extern __shared__ __align__(16) unsigned char NAME[]
#endif

/* ---- one shared array as a slice of the dynamic one: a restrict pointer on the GPU;
 * in the emulator a reference to an array of N, so its indexing is bounds-checked like
 * a static array's ------------------------------------------------------------------ */
#ifdef HIDETC_EMULATE
#define HIDETC_SHARED_SLICE(T, NAME, N, BASE, OFFSET) \
  T(&NAME)[N] = *reinterpret_cast<T(*)[N]>((BASE) + (OFFSET))
#else
#define HIDETC_SHARED_SLICE(T, NAME, N, BASE, OFFSET) \
  T *__restrict__ NAME = (T *)((BASE) + (OFFSET))
#endif

/* ---- a per-thread local array's first contents: undefined on the GPU; poison (all
 * bits set: NaN in floats) in the emulator, so a read before a store (an accumulator
 * never zeroed) shows in the results instead of passing on a stale stack ---------- */
#ifdef HIDETC_EMULATE
#define HIDETC_LOCAL_POISON(NAME) std::memset(NAME, 0xff, sizeof(NAME))
#else
#define HIDETC_LOCAL_POISON(NAME) ((void)0)
#endif

/* ---- shared-memory loads and stores (the printer's): plain accesses on the GPU; the
 * emulator records each one (thread, barrier interval) for its race check ----------- */
#ifdef HIDETC_EMULATE
template <class T>
static inline T *hidetc_emu_shared(T *p, int write, const char *array, int line) {
  hidetc_emu_shared_access(p, (int)sizeof(T), write, array, line);
  return p;
}
/* a shared array (static, or a slice of the dynamic one: HIDETC_SHARED_SLICE gives it
 * its array type) is bounds-checked in every launch; a plain pointer is not */
template <class A>
static inline auto *hidetc_emu_shared_at(A &a, long i, int write, const char *array, int line) {
  if constexpr (std::is_array<A>::value) {
    constexpr long n = (long)std::extent<A>::value;
    if (i < 0 || i >= n)
      hidetc_emu_fail("shared array %s[%ld] indexed at %ld (line %d)", array, n, i, line);
  }
  return hidetc_emu_shared(&a[i], write, array, line);
}
#define HIDETC_SLD(A, I) (*hidetc_emu_shared_at(A, (long)(I), 0, #A, __LINE__))
#define HIDETC_SST(A, I, V) (*hidetc_emu_shared_at(A, (long)(I), 1, #A, __LINE__) = (V))
#else
#define HIDETC_SLD(A, I) ((A)[I])
#define HIDETC_SST(A, I, V) ((A)[I] = (V))
#endif

/* ---- bits of a float and back (BitCast; the C printer's helper names) ------------ */
__device__ __forceinline__ uint32_t hidetc_f2u(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float hidetc_u2f(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint64_t hidetc_d2u(double x) { return (uint64_t)__double_as_longlong(x); }
__device__ __forceinline__ double hidetc_u2d(uint64_t u) { return __longlong_as_double((long long)u); }
__device__ __forceinline__ uint16_t hidetc_h2u(half x) { return __half_as_ushort(x); }
__device__ __forceinline__ half hidetc_u2h(uint16_t u) { return __ushort_as_half(u); }

/* ---- min / max / sigmoid / rsqrt (the C printer's helper names) ----------------- */
#define HIDETC_MINMAX_FLOAT(D, T)                                                      \
  __device__ __forceinline__ T hidetc_max_##D(T a, T b) { return (a != a || a > b) ? a : b; } \
  __device__ __forceinline__ T hidetc_min_##D(T a, T b) { return (a != a || a < b) ? a : b; }
#define HIDETC_MINMAX_INT(D, T)                                                        \
  __device__ __forceinline__ T hidetc_max_##D(T a, T b) { return a > b ? a : b; }      \
  __device__ __forceinline__ T hidetc_min_##D(T a, T b) { return a < b ? a : b; }
HIDETC_MINMAX_FLOAT(float32, float)
HIDETC_MINMAX_FLOAT(float64, double)
HIDETC_MINMAX_INT(int8, int8_t) HIDETC_MINMAX_INT(int16, int16_t)
HIDETC_MINMAX_INT(int32, int32_t) HIDETC_MINMAX_INT(int64, int64_t)
HIDETC_MINMAX_INT(uint8, uint8_t) HIDETC_MINMAX_INT(uint16, uint16_t)
HIDETC_MINMAX_INT(uint32, uint32_t) HIDETC_MINMAX_INT(uint64, uint64_t)
HIDETC_MINMAX_INT(bool, bool)
__device__ __forceinline__ float hidetc_sigmoid_float32(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double hidetc_sigmoid_float64(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ __forceinline__ float hidetc_rsqrt_float32(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double hidetc_rsqrt_float64(double x) { return 1.0 / sqrt(x); }

/* ---- float16: math through float, one rounding at the end ------------------------ */
__device__ __forceinline__ half hidetc_f16(float x) { return __float2half_rn(x); }
__device__ __forceinline__ float hidetc_f32(half x) { return __half2float(x); }
__device__ __forceinline__ half hidetc_hdiv(half a, half b) { return hidetc_f16(hidetc_f32(a) / hidetc_f32(b)); }
__device__ __forceinline__ half hidetc_max_float16(half a, half b) {
  float x = hidetc_f32(a), y = hidetc_f32(b);
  return (x != x || x > y) ? a : b;
}
__device__ __forceinline__ half hidetc_min_float16(half a, half b) {
  float x = hidetc_f32(a), y = hidetc_f32(b);
  return (x != x || x < y) ? a : b;
}
#define HIDETC_F16_UNARY(NAME, F) \
  __device__ __forceinline__ half hidetc_##NAME##_float16(half x) { return hidetc_f16(F(hidetc_f32(x))); }
#define HIDETC_F16_BINARY(NAME, F)                                     \
  __device__ __forceinline__ half hidetc_##NAME##_float16(half x, half y) { \
    return hidetc_f16(F(hidetc_f32(x), hidetc_f32(y)));                \
  }
HIDETC_F16_UNARY(exp, expf) HIDETC_F16_UNARY(exp2, exp2f) HIDETC_F16_UNARY(expm1, expm1f)
HIDETC_F16_UNARY(log, logf) HIDETC_F16_UNARY(log2, log2f) HIDETC_F16_UNARY(log10, log10f)
HIDETC_F16_UNARY(log1p, log1pf) HIDETC_F16_UNARY(sqrt, sqrtf) HIDETC_F16_UNARY(erf, erff)
HIDETC_F16_UNARY(tanh, tanhf) HIDETC_F16_UNARY(sinh, sinhf) HIDETC_F16_UNARY(cosh, coshf)
HIDETC_F16_UNARY(asinh, asinhf) HIDETC_F16_UNARY(acosh, acoshf) HIDETC_F16_UNARY(atanh, atanhf)
HIDETC_F16_UNARY(floor, floorf) HIDETC_F16_UNARY(ceil, ceilf) HIDETC_F16_UNARY(trunc, truncf)
HIDETC_F16_UNARY(sin, sinf) HIDETC_F16_UNARY(cos, cosf) HIDETC_F16_UNARY(tan, tanf)
HIDETC_F16_UNARY(asin, asinf) HIDETC_F16_UNARY(acos, acosf) HIDETC_F16_UNARY(atan, atanf)
HIDETC_F16_UNARY(abs, fabsf) HIDETC_F16_UNARY(round, rintf)
HIDETC_F16_UNARY(sigmoid, hidetc_sigmoid_float32) HIDETC_F16_UNARY(rsqrt, hidetc_rsqrt_float32)
HIDETC_F16_BINARY(pow, powf) HIDETC_F16_BINARY(atan2, atan2f) HIDETC_F16_BINARY(fmod, fmodf)
__device__ __forceinline__ half hidetc_fma_float16(half x, half y, half z) {
  return hidetc_f16(fmaf(hidetc_f32(x), hidetc_f32(y), hidetc_f32(z)));
}
__device__ __forceinline__ bool hidetc_isnan_float16(half x) { return isnan(hidetc_f32(x)); }
__device__ __forceinline__ bool hidetc_isinf_float16(half x) { return isinf(hidetc_f32(x)); }

#ifndef HIDETC_EMULATE
/* ======================= nvcc: vector copies and inline PTX ======================== */
__device__ __forceinline__ void hidetc_copy16(void *dst, const void *src) { *(uint4 *)dst = *(const uint4 *)src; }
__device__ __forceinline__ void hidetc_copy8(void *dst, const void *src) { *(uint2 *)dst = *(const uint2 *)src; }
__device__ __forceinline__ void hidetc_copy4(void *dst, const void *src) { *(uint32_t *)dst = *(const uint32_t *)src; }
__device__ __forceinline__ void hidetc_ld_f4(float *dst, const float *src) { *(float4 *)dst = *(const float4 *)src; }

__device__ __forceinline__ uint32_t hidetc_smem_addr(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

#define HIDETC_CP_ASYNC(BYTES, CACHE)                                                      \
  __device__ __forceinline__ void hidetc_cp_async##BYTES(void *smem, const void *gmem, bool pred) { \
    asm volatile("cp.async." CACHE ".shared.global [%0], [%1], " #BYTES ", %2;\n"         \
                 ::"r"(hidetc_smem_addr(smem)), "l"(gmem), "r"(pred ? BYTES : 0) : "memory"); \
  }
HIDETC_CP_ASYNC(16, "cg")
HIDETC_CP_ASYNC(8, "ca")
HIDETC_CP_ASYNC(4, "ca")

__device__ __forceinline__ void hidetc_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void hidetc_cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void hidetc_cp_async_wait_n() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* n must be known after inlining; n > 7 waits for at most 7 pending groups (stricter). */
__device__ __forceinline__ void hidetc_cp_async_wait_group(int n) {
  switch (n) {
    case 0: hidetc_cp_async_wait_n<0>(); break;
    case 1: hidetc_cp_async_wait_n<1>(); break;
    case 2: hidetc_cp_async_wait_n<2>(); break;
    case 3: hidetc_cp_async_wait_n<3>(); break;
    case 4: hidetc_cp_async_wait_n<4>(); break;
    case 5: hidetc_cp_async_wait_n<5>(); break;
    case 6: hidetc_cp_async_wait_n<6>(); break;
    default: hidetc_cp_async_wait_n<7>(); break;
  }
}

#define HIDETC_LDMATRIX(SUFFIX, QUAL)                                                        \
  __device__ __forceinline__ void hidetc_ldmatrix_x1##SUFFIX(void *dst, const void *row) {  \
    uint32_t *r = (uint32_t *)dst;                                                          \
    asm volatile("ldmatrix.sync.aligned.m8n8.x1" QUAL ".shared.b16 {%0}, [%1];\n"          \
                 : "=r"(r[0]) : "r"(hidetc_smem_addr(row)) : "memory");                     \
  }                                                                                         \
  __device__ __forceinline__ void hidetc_ldmatrix_x2##SUFFIX(void *dst, const void *row) {  \
    uint32_t *r = (uint32_t *)dst;                                                          \
    asm volatile("ldmatrix.sync.aligned.m8n8.x2" QUAL ".shared.b16 {%0, %1}, [%2];\n"      \
                 : "=r"(r[0]), "=r"(r[1]) : "r"(hidetc_smem_addr(row)) : "memory");         \
  }                                                                                         \
  __device__ __forceinline__ void hidetc_ldmatrix_x4##SUFFIX(void *dst, const void *row) {  \
    uint32_t *r = (uint32_t *)dst;                                                          \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4" QUAL ".shared.b16 {%0, %1, %2, %3}, [%4];\n" \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                           \
                 : "r"(hidetc_smem_addr(row)) : "memory");                                  \
  }
HIDETC_LDMATRIX(, "")
HIDETC_LDMATRIX(_trans, ".trans")

/* d = a * b + c: mma.m16n8k16 with f32 accumulation on f16 or bf16 operands (the
 * fragment layouts are the same: each 32-bit register holds two 16-bit elements) */
#define HIDETC_MMA_M16N8K16(NAME, TYPE)                                                    \
  __device__ __forceinline__ void NAME(float *d, const void *a, const void *b, const float *c) { \
    const uint32_t *A = (const uint32_t *)a, *B = (const uint32_t *)b;                      \
    asm volatile(                                                                           \
        "mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 "                      \
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"              \
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                                    \
        : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[0]), "r"(B[1]),                 \
          "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));                                      \
  }
HIDETC_MMA_M16N8K16(hidetc_mma_m16n8k16_f16f32, "f16")
HIDETC_MMA_M16N8K16(hidetc_mma_m16n8k16_bf16f32, "bf16")

/* d = a * b + c: mma.m16n8k32 on 8-bit integers (A and B each .u8 or .s8; a: 4, b: 2
 * 32-bit registers of four elements each, c and d: 4 int32), the int32 sums wrapping
 * modulo 2^32 (no .satfinite) */
#define HIDETC_MMA_M16N8K32(NAME, ATYPE, BTYPE)                                            \
  __device__ __forceinline__ void NAME(int *d, const void *a, const void *b, const int *c) { \
    const uint32_t *A = (const uint32_t *)a, *B = (const uint32_t *)b;                      \
    asm volatile(                                                                           \
        "mma.sync.aligned.m16n8k32.row.col.s32." ATYPE "." BTYPE ".s32 "                    \
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"              \
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])                                    \
        : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[0]), "r"(B[1]),                 \
          "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));                                      \
  }
HIDETC_MMA_M16N8K32(hidetc_mma_m16n8k32_s8s8s32, "s8", "s8")
HIDETC_MMA_M16N8K32(hidetc_mma_m16n8k32_u8s8s32, "u8", "s8")
HIDETC_MMA_M16N8K32(hidetc_mma_m16n8k32_s8u8s32, "s8", "u8")
HIDETC_MMA_M16N8K32(hidetc_mma_m16n8k32_u8u8s32, "u8", "u8")

/* byte n of the result = byte ((s >> 4n) & 7) of the 8 bytes {y, x} (x the low four) */
__device__ __forceinline__ unsigned hidetc_byte_perm(unsigned x, unsigned y, unsigned s) {
  return __byte_perm(x, y, s);
}
/* acc + the sum of x's four bytes read as uint8 / int8 (dp4a with ones), wrapping */
__device__ __forceinline__ int hidetc_bytesum_u8(unsigned x, int acc) {
  return (int)__dp4a(x, 0x01010101u, (unsigned)acc);
}
__device__ __forceinline__ int hidetc_bytesum_s8(unsigned x, int acc) {
  return __dp4a((int)x, 0x01010101, acc);
}

#else
/* =================== emulator: the twins, same names and semantics ================== */
static inline void hidetc_emu_check_align(const void *p, int bytes, const char *what) {
  if (reinterpret_cast<uintptr_t>(p) % (uintptr_t)bytes)
    hidetc_emu_fail("%s: address %p is not %d-byte aligned", what, p, bytes);
}
#define HIDETC_EMU_COPY(BYTES)                                                      \
  static inline void hidetc_copy##BYTES(void *dst, const void *src) {               \
    hidetc_emu_check_align(dst, BYTES, "hidetc_copy" #BYTES " destination");        \
    hidetc_emu_check_align(src, BYTES, "hidetc_copy" #BYTES " source");             \
    hidetc_emu_shared_access(src, BYTES, 0, "hidetc_copy" #BYTES " source", __LINE__); \
    hidetc_emu_shared_access(dst, BYTES, 1, "hidetc_copy" #BYTES " destination", __LINE__); \
    std::memcpy(dst, src, BYTES);                                                   \
  }                                                                                 \
  static inline void hidetc_cp_async##BYTES(void *smem, const void *gmem, bool pred) { \
    hidetc_emu_check_align(smem, BYTES, "cp.async destination");                    \
    if (pred) hidetc_emu_check_align(gmem, BYTES, "cp.async source");               \
    hidetc_emu_cp_async(smem, gmem, BYTES, pred);                                   \
  }
HIDETC_EMU_COPY(16)
HIDETC_EMU_COPY(8)
HIDETC_EMU_COPY(4)
static inline void hidetc_ld_f4(float *dst, const float *src) { hidetc_copy16(dst, src); }
/* cp.async is queued per thread (hidetc_emu_cp_async): a copy lands when its thread
 * waits for its group; until then its destination holds poison (NaN) */
static inline void hidetc_cp_async_commit() { hidetc_emu_cp_commit(); }
static inline void hidetc_cp_async_wait_all() { hidetc_emu_cp_commit(); hidetc_emu_cp_wait(0); }
static inline void hidetc_cp_async_wait_group(int n) { hidetc_emu_cp_wait(n); }

#define HIDETC_EMU_LDMATRIX(N, SUFFIX, KIND)                                      \
  static inline void hidetc_ldmatrix_x##N##SUFFIX(void *dst, const void *row) {   \
    if ((int)(threadIdx.x % 32) < 8 * N)      /* the lanes whose rows are read */  \
      hidetc_emu_shared_access(row, 16, 0, "ldmatrix", __LINE__);                 \
    hidetc_emu_collective(KIND, 0xffffffffu, &row, sizeof row, dst, 4 * N);       \
  }
HIDETC_EMU_LDMATRIX(1, , HIDETC_EMU_LDMATRIX_X1)
HIDETC_EMU_LDMATRIX(2, , HIDETC_EMU_LDMATRIX_X2)
HIDETC_EMU_LDMATRIX(4, , HIDETC_EMU_LDMATRIX_X4)
HIDETC_EMU_LDMATRIX(1, _trans, HIDETC_EMU_LDMATRIX_X1_TRANS)
HIDETC_EMU_LDMATRIX(2, _trans, HIDETC_EMU_LDMATRIX_X2_TRANS)
HIDETC_EMU_LDMATRIX(4, _trans, HIDETC_EMU_LDMATRIX_X4_TRANS)

#define HIDETC_EMU_MMA_M16N8K16(NAME, KIND)                                              \
  static inline void NAME(float *d, const void *a, const void *b, const float *c) {      \
    unsigned char in[40];                                                                 \
    std::memcpy(in, a, 16);                                                               \
    std::memcpy(in + 16, b, 8);                                                           \
    std::memcpy(in + 24, c, 16);                                                          \
    hidetc_emu_collective(KIND, 0xffffffffu, in, sizeof in, d, 16);                       \
  }
HIDETC_EMU_MMA_M16N8K16(hidetc_mma_m16n8k16_f16f32, HIDETC_EMU_MMA_M16N8K16_F16F32)
HIDETC_EMU_MMA_M16N8K16(hidetc_mma_m16n8k16_bf16f32, HIDETC_EMU_MMA_M16N8K16_BF16F32)

/* the same operands (40 bytes), then the 8-bit types: bit 0 set for an int8 A, bit 1 for
 * an int8 B (hidetc_emu_resolve.cpp: resolve_mma_int8) */
#define HIDETC_EMU_MMA_M16N8K32(NAME, SIGNS)                                              \
  static inline void NAME(int *d, const void *a, const void *b, const int *c) {          \
    unsigned char in[44];                                                                 \
    const int signs = SIGNS;                                                              \
    std::memcpy(in, a, 16);                                                               \
    std::memcpy(in + 16, b, 8);                                                           \
    std::memcpy(in + 24, c, 16);                                                          \
    std::memcpy(in + 40, &signs, 4);                                                      \
    hidetc_emu_collective(HIDETC_EMU_MMA_M16N8K32_S32, 0xffffffffu, in, sizeof in, d, 16); \
  }
HIDETC_EMU_MMA_M16N8K32(hidetc_mma_m16n8k32_s8s8s32, 3)
HIDETC_EMU_MMA_M16N8K32(hidetc_mma_m16n8k32_u8s8s32, 2)
HIDETC_EMU_MMA_M16N8K32(hidetc_mma_m16n8k32_s8u8s32, 1)
HIDETC_EMU_MMA_M16N8K32(hidetc_mma_m16n8k32_u8u8s32, 0)

static inline unsigned hidetc_byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t bytes = (uint64_t)y << 32 | x;
  unsigned r = 0;
  for (int n = 0; n < 4; n++)
    r |= (unsigned)(bytes >> (8 * ((s >> (4 * n)) & 7)) & 0xffu) << (8 * n);
  return r;
}
static inline int hidetc_bytesum_u8(unsigned x, int acc) {
  unsigned sum = (unsigned)acc;
  for (int n = 0; n < 4; n++) sum += (x >> (8 * n)) & 0xffu;
  return (int)sum;
}
static inline int hidetc_bytesum_s8(unsigned x, int acc) {
  unsigned sum = (unsigned)acc;
  for (int n = 0; n < 4; n++) sum += (unsigned)(int)(int8_t)(uint8_t)(x >> (8 * n));
  return (int)sum;
}
#endif
