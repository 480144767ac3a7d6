/* hidetc_emu.h -- the CUDA C built-ins on the CPU, for the hidetc emulator.
 *
 * Included (through hidetc_cuda.h, under -DHIDETC_EMULATE) by the SAME .cu source that
 * nvcc compiles, which g++ then builds as C++17 into a shared library together with
 * hidetc_emu.cpp (the scheduler). Execution model (see hidetc_emu.cpp for details):
 * the blocks of a launch run one after another; the threads of a block are fibers on
 * one OS thread, switched only inside __syncthreads() and the warp-collective
 * intrinsics, so everything else runs as plain sequential C++.
 *
 * Provides: __global__/__device__/__host__/__forceinline__/__noinline__ (empty or
 * inline), __shared__ (= static: one array per kernel, shared by the fibers of the
 * running block; never re-initialized between blocks, like CUDA), __launch_bounds__,
 * __align__, uint3/dim3/vector types, threadIdx/blockIdx/blockDim/gridDim of the
 * CURRENT fiber, warpSize, __syncthreads, __syncwarp, the *_sync shuffles and votes,
 * __activemask, atomics, __half/half (a 16-bit struct; conversions by bit
 * manipulation with round-to-nearest-even, matching __float2half_rn; arithmetic
 * through float, which is exact for + - * / after rounding back), __nv_bfloat16 (the
 * same for bfloat16: float's top 16 bits, conversions only, as the printer does its
 * arithmetic in float), and the math names CUDA has but glibc lacks (rsqrtf, __expf,
 * ...). */
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
/* every __shared__ array is a static in one section, which each block starts poisoned */
#define __shared__ static __attribute__((section("hidetc_shared")))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define HIDETC_EMU_HIDDEN __attribute__((visibility("hidden")))
#define HIDETC_EMU_EXPORT __attribute__((visibility("default")))

using std::isinf;
using std::isnan;

/* ---- index registers ----------------------------------------------------------- */
struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };

struct HidetcEmuFiber;  /* defined in hidetc_emu.cpp; thread_idx is its first member */
struct HidetcEmuIndex { uint3 thread_idx; };
extern HIDETC_EMU_HIDDEN HidetcEmuIndex *hidetc_emu_current;
extern HIDETC_EMU_HIDDEN uint3 hidetc_emu_block_idx;
extern HIDETC_EMU_HIDDEN dim3 hidetc_emu_block_dim, hidetc_emu_grid_dim;

#define threadIdx (hidetc_emu_current->thread_idx)
#define blockIdx (hidetc_emu_block_idx)
#define blockDim (hidetc_emu_block_dim)
#define gridDim (hidetc_emu_grid_dim)
#define warpSize 32

/* ---- scheduler entry points (hidetc_emu.cpp) ----------------------------------- */
enum HidetcEmuKind {
  HIDETC_EMU_SYNCWARP, HIDETC_EMU_SHFL_IDX, HIDETC_EMU_SHFL_UP, HIDETC_EMU_SHFL_DOWN,
  HIDETC_EMU_SHFL_XOR, HIDETC_EMU_BALLOT, HIDETC_EMU_ANY, HIDETC_EMU_ALL,
  HIDETC_EMU_LDMATRIX_X1, HIDETC_EMU_LDMATRIX_X2, HIDETC_EMU_LDMATRIX_X4,
  HIDETC_EMU_LDMATRIX_X1_TRANS, HIDETC_EMU_LDMATRIX_X2_TRANS, HIDETC_EMU_LDMATRIX_X4_TRANS,
  HIDETC_EMU_MMA_M16N8K16_F16F32, HIDETC_EMU_ACTIVEMASK, HIDETC_EMU_MMA_M16N8K16_BF16F32,
  HIDETC_EMU_MMA_M16N8K32_S32,
  HIDETC_EMU_NUM_KINDS
};
#define HIDETC_EMU_SLOT_IN 48
#define HIDETC_EMU_SLOT_OUT 16

HIDETC_EMU_HIDDEN void hidetc_emu_syncthreads(int line);
/* Deposit `in` (<= SLOT_IN bytes) for a warp-collective `kind` over `mask`, wait for
 * the other participants, receive `out` (<= SLOT_OUT bytes). */
HIDETC_EMU_HIDDEN void hidetc_emu_collective(int kind, unsigned mask, const void *in,
                                             int in_size, void *out, int out_size);
[[noreturn]] HIDETC_EMU_HIDDEN void hidetc_emu_fail(const char *fmt, ...);
/* cp.async as on the GPU: queued per thread, in commit groups; the destination reads as
 * poison (all bits set: NaN in floats) until a wait completes its group. */
HIDETC_EMU_HIDDEN void hidetc_emu_cp_async(void *dst, const void *src, int bytes, bool pred);
HIDETC_EMU_HIDDEN void hidetc_emu_cp_commit();
HIDETC_EMU_HIDDEN void hidetc_emu_cp_wait(int pending);
/* A shared-memory access of this thread (with race checks on: a load or store of
 * bytes another warp stored, or a store of bytes another warp loaded, in the same
 * barrier interval fails the launch, naming both threads and lines). The flag is
 * tested inline: unchecked launches pay one branch per access, not a call. */
extern HIDETC_EMU_HIDDEN bool hidetc_emu_checks;
HIDETC_EMU_HIDDEN void hidetc_emu_shared_record(const void *p, int bytes, int write,
                                                const char *array, int line);
static inline void hidetc_emu_shared_access(const void *p, int bytes, int write,
                                            const char *array, int line) {
  if (hidetc_emu_checks) hidetc_emu_shared_record(p, bytes, write, array, line);
}
/* With race checks on, also: a load of shared bytes no thread of the block stored, or
 * of a cp.async destination still in flight (marked here at issue), fails the launch. */
HIDETC_EMU_HIDDEN void hidetc_emu_shared_pending(const void *p, int bytes);

#define __syncthreads() hidetc_emu_syncthreads(__LINE__)
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  hidetc_emu_collective(HIDETC_EMU_SYNCWARP, mask, nullptr, 0, nullptr, 0);
}
/* The lanes that reach __activemask together: it returns once every live lane of the
 * warp waits somewhere (or has exited), naming those waiting at __activemask. */
static inline unsigned __activemask(void) {
  unsigned out;
  hidetc_emu_collective(HIDETC_EMU_ACTIVEMASK, 0u, nullptr, 0, &out, sizeof out);
  return out;
}
static inline void __threadfence(void) {}
/* one memory, no caches: a load through L2 only is a load */
template <class T> static inline T __ldcg(const T *p) { return *p; }
static inline void __threadfence_block(void) {}
[[noreturn]] static inline void __trap(void) { hidetc_emu_fail("__trap() called"); }

/* ---- shuffles and votes -------------------------------------------------------- */
struct HidetcEmuShflIn { uint64_t value; int b, c; };

template <class T>
static inline T hidetc_emu_shfl(int kind, unsigned mask, T var, int b, int c) {
  static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
  HidetcEmuShflIn in = {0, b, c};
  std::memcpy(&in.value, &var, sizeof(T));
  uint64_t out;
  hidetc_emu_collective(kind, mask, &in, sizeof in, &out, sizeof out);
  T r;
  std::memcpy(&r, &out, sizeof(T));
  return r;
}
/* c operands as CUDA's own wrappers pass them to PTX shfl.sync (clamp | segment mask) */
template <class T> static inline T __shfl_sync(unsigned m, T v, int src, int w = 32) {
  return hidetc_emu_shfl(HIDETC_EMU_SHFL_IDX, m, v, src, ((32 - w) << 8) | 0x1f);
}
template <class T> static inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) {
  return hidetc_emu_shfl(HIDETC_EMU_SHFL_UP, m, v, (int)d, (32 - w) << 8);
}
template <class T> static inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) {
  return hidetc_emu_shfl(HIDETC_EMU_SHFL_DOWN, m, v, (int)d, ((32 - w) << 8) | 0x1f);
}
template <class T> static inline T __shfl_xor_sync(unsigned m, T v, int lm, int w = 32) {
  return hidetc_emu_shfl(HIDETC_EMU_SHFL_XOR, m, v, lm, ((32 - w) << 8) | 0x1f);
}
static inline unsigned hidetc_emu_vote(int kind, unsigned mask, int pred) {
  int in = pred != 0;
  unsigned out;
  hidetc_emu_collective(kind, mask, &in, sizeof in, &out, sizeof out);
  return out;
}
static inline unsigned __ballot_sync(unsigned m, int p) { return hidetc_emu_vote(HIDETC_EMU_BALLOT, m, p); }
static inline int __any_sync(unsigned m, int p) { return (int)hidetc_emu_vote(HIDETC_EMU_ANY, m, p); }
static inline int __all_sync(unsigned m, int p) { return (int)hidetc_emu_vote(HIDETC_EMU_ALL, m, p); }

/* ---- atomics: fibers never interleave inside one, so plain read-modify-write ---- */
template <class T> static inline T atomicAdd(T *p, T v) { T old = *p; *p = old + v; return old; }
template <class T> static inline T atomicSub(T *p, T v) { T old = *p; *p = old - v; return old; }
template <class T> static inline T atomicExch(T *p, T v) { T old = *p; *p = v; return old; }
template <class T> static inline T atomicMax(T *p, T v) { T old = *p; if (v > old) *p = v; return old; }
template <class T> static inline T atomicMin(T *p, T v) { T old = *p; if (v < old) *p = v; return old; }
template <class T> static inline T atomicCAS(T *p, T cmp, T v) {
  T old = *p;
  if (old == cmp) *p = v;
  return old;
}

/* ---- half precision ------------------------------------------------------------ */
static inline uint16_t hidetc_emu_f32_to_f16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a >= 0x7f800000u)                        /* inf; nan keeps its payload, quieted */
    return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* >= 65520 rounds to inf */
  if (a >= 0x38800000u)                        /* normal: round the 13 dropped bits */
    return (uint16_t)(sign | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
  if (a < 0x33000000u) return (uint16_t)sign;  /* <= 2^-25 (a tie) rounds to zero */
  uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23);   /* 14..24 */
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return (uint16_t)(sign | q);                 /* q == 0x400 is the smallest normal */
}

static inline float hidetc_emu_f16_bits_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0x1f) x = sign | 0x7f800000u | (m << 13);
  else if (e) x = sign | ((e + 112u) << 23) | (m << 13);
  else if (!m) x = sign;
  else {                                       /* subnormal: normalize */
    e = 113;
    while (!(m & 0x400u)) { m <<= 1; e--; }
    x = sign | (e << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

/* double -> float rounded to odd (the sticky bit survives), for one rounding of a
 * double to a type of at most 22 significant bits: a float keeps >= 2 extra bits. A
 * finite double past float's range becomes float's largest, which both half types
 * round to inf as they would the double. */
static inline float hidetc_emu_f64_to_f32_odd(double d) {
  float f = (float)d;
  if (std::isfinite(f) && (double)f != d) {
    if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.0f);
    uint32_t x;
    std::memcpy(&x, &f, 4);
    x |= 1u;
    std::memcpy(&f, &x, 4);
  } else if (std::isinf(f) && std::isfinite(d)) {
    f = std::copysign(3.4028234663852886e38f, f);
  }
  return f;
}

/* double -> half with one rounding (through float rounded to odd) */
static inline uint16_t hidetc_emu_f64_to_f16_bits(double d) {
  return hidetc_emu_f32_to_f16_bits(hidetc_emu_f64_to_f32_odd(d));
}

struct __half {
  uint16_t __x;
  __half() = default;
  __half(float f) : __x(hidetc_emu_f32_to_f16_bits(f)) {}
  __half(double d) : __x(hidetc_emu_f64_to_f16_bits(d)) {}
  __half(int i) : __x(hidetc_emu_f32_to_f16_bits((float)i)) {}
  operator float() const { return hidetc_emu_f16_bits_to_f32(__x); }
};
struct __half2 { __half x, y; };
typedef __half half;
typedef __half2 half2;

static inline __half __ushort_as_half(unsigned short b) { __half h; h.__x = b; return h; }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline float __half2float(__half h) { return hidetc_emu_f16_bits_to_f32(h.__x); }
static inline __half __float2half_rn(float f) { return __ushort_as_half(hidetc_emu_f32_to_f16_bits(f)); }
static inline __half __float2half(float f) { return __float2half_rn(f); }
static inline __half __double2half(double d) { return __ushort_as_half(hidetc_emu_f64_to_f16_bits(d)); }
static inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }

#define HIDETC_EMU_H_BINARY(NAME, OP) \
  static inline __half NAME(__half a, __half b) { return __float2half_rn(__half2float(a) OP __half2float(b)); }
HIDETC_EMU_H_BINARY(__hadd, +) HIDETC_EMU_H_BINARY(__hsub, -) HIDETC_EMU_H_BINARY(__hmul, *)
HIDETC_EMU_H_BINARY(__hadd_rn, +) HIDETC_EMU_H_BINARY(__hsub_rn, -) HIDETC_EMU_H_BINARY(__hmul_rn, *)
HIDETC_EMU_H_BINARY(__hdiv, /)
#define HIDETC_EMU_H_CMP(NAME, OP) \
  static inline bool NAME(__half a, __half b) { return __half2float(a) OP __half2float(b); }
HIDETC_EMU_H_CMP(__heq, ==) HIDETC_EMU_H_CMP(__hlt, <) HIDETC_EMU_H_CMP(__hle, <=)
HIDETC_EMU_H_CMP(__hgt, >) HIDETC_EMU_H_CMP(__hge, >=)
static inline bool __hne(__half a, __half b) { float x = __half2float(a), y = __half2float(b); return x < y || x > y; }
static inline bool __hneu(__half a, __half b) { return !__heq(a, b); }
static inline __half __hneg(__half a) { return __ushort_as_half((unsigned short)(a.__x ^ 0x8000u)); }
static inline __half __habs(__half a) { return __ushort_as_half((unsigned short)(a.__x & 0x7fffu)); }
static inline __half __hfma(__half a, __half b, __half c) {
  return __double2half((double)__half2float(a) * __half2float(b) + __half2float(c));
}
static inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
static inline int __hisinf(__half a) { return (a.__x & 0x7fffu) == 0x7c00u ? ((a.__x & 0x8000u) ? -1 : 1) : 0; }
/* CUDA's device operators on __half */
static inline __half operator+(__half a, __half b) { return __hadd(a, b); }
static inline __half operator-(__half a, __half b) { return __hsub(a, b); }
static inline __half operator*(__half a, __half b) { return __hmul(a, b); }
static inline __half operator/(__half a, __half b) { return __hdiv(a, b); }
static inline __half operator-(__half a) { return __hneg(a); }
static inline bool operator==(__half a, __half b) { return __heq(a, b); }
static inline bool operator!=(__half a, __half b) { return __hneu(a, b); }
static inline bool operator<(__half a, __half b) { return __hlt(a, b); }
static inline bool operator<=(__half a, __half b) { return __hle(a, b); }
static inline bool operator>(__half a, __half b) { return __hgt(a, b); }
static inline bool operator>=(__half a, __half b) { return __hge(a, b); }

/* ---- bfloat16: float's top 16 bits ---------------------------------------------- */
/* float -> bfloat16, round to nearest even; a NaN stays a NaN (quieted, its payload's
 * top bits kept, as ml_dtypes does); past the largest bfloat16 rounds to inf */
static inline uint16_t hidetc_emu_f32_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static inline float hidetc_emu_bf16_bits_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

struct __nv_bfloat16 {
  uint16_t __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(hidetc_emu_f32_to_bf16_bits(f)) {}
  __nv_bfloat16(double d) : __x(hidetc_emu_f32_to_bf16_bits(hidetc_emu_f64_to_f32_odd(d))) {}
  __nv_bfloat16(int i) : __x(hidetc_emu_f32_to_bf16_bits((float)i)) {}
  operator float() const { return hidetc_emu_bf16_bits_to_f32(__x); }
};
typedef __nv_bfloat16 nv_bfloat16;

static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { __nv_bfloat16 h; h.__x = b; return h; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
static inline float __bfloat162float(__nv_bfloat16 h) { return hidetc_emu_bf16_bits_to_f32(h.__x); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __ushort_as_bfloat16(hidetc_emu_f32_to_bf16_bits(f)); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline __nv_bfloat16 __double2bfloat16(double d) {
  return __ushort_as_bfloat16(hidetc_emu_f32_to_bf16_bits(hidetc_emu_f64_to_f32_odd(d)));
}

/* ---- vector types and bit casts --------------------------------------------------- */
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) uint2 { unsigned int x, y; };
struct __align__(16) uint4 { unsigned int x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct __align__(16) int4 { int x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
static inline dim3 hidetc_emu_dim3(unsigned x, unsigned y, unsigned z) { return dim3{x, y, z}; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
static inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
static inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }
static inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T> static inline T __ldg(const T *p) { return *p; }

/* ---- math names CUDA has and glibc lacks (exact versions of the fast intrinsics;
 * glibc itself declares __expf and __logf) ---- */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x != x ? 0.0f : fminf(fmaxf(x, 0.0f), 1.0f); }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }
