"""CUDA printer: the printed text of each construct, the errors it raises, and a kernel
using every math function (float32 and float16), casts, min/max and atomics that nvcc
must compile for sm_80 and sm_90 and the emulator must run to match numpy."""
import math
import shutil

import numpy as np
import pytest
from helpers.kernel_device import kernel_module

from hidetc.backends.codegen.cuda import (
    CUDA_INCLUDE_DIR,
    F16_MATH,
    declared_dynamic_shared,
    dynamic_shared_bytes,
    print_cuda_function,
    print_cuda_module,
)
from hidetc.backends.toolchain.nvcc import compile_cubins
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Call,
    Const,
    Evaluate,
    block_dim,
    block_idx,
    cast,
    grid_dim,
    maximum,
    minimum,
    syncthreads,
    thread_idx,
)
from hidetc.tir.pipeline import lower

F32, F16, I32 = "float32", "float16", "int32"
NVCC = shutil.which("nvcc")
LAUNCH = dict(grid=(1, 1, 1), block=(64, 1, 1))
UNARY = {"exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
         "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v),
         "erf": np.vectorize(math.erf), "tanh": np.tanh, "sinh": np.sinh, "cosh": np.cosh,
         "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
         "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc,
         "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
         "atan": np.arctan, "sigmoid": lambda v: 1 / (1 + np.exp(-v))}
BINARY = {"pow": np.power, "atan2": np.arctan2, "fmod": np.fmod}
SHIFT = {"acosh": 1.0}  # inputs are in (0, 1): move them into the function's domain


def text(build, **attrs):
    kb = KernelBuilder("k", target="cuda")
    build(kb)
    return print_cuda_function(lower(kb.finish(**{**LAUNCH, **attrs})))


def test_signature_const_restrict_and_launch_bounds():
    def build(kb):
        n = kb.scalar("n")
        a, out, hist = kb.buffer("a", F32, (n,)), kb.buffer("out", F32, (n,)), kb.buffer(
            "hist", I32, (4,))
        kb.store(out, (thread_idx(),), a[thread_idx()])
        kb.evaluate(Call("atomicAdd", (hist[thread_idx() % 4], Const(1, I32)), I32))
    src = text(build, block=(32, 4, 2))
    assert src.startswith('extern "C" __global__ void __launch_bounds__(256)\nk(int32_t n, '
                          'const float *__restrict__ a, float *__restrict__ out, '
                          'int32_t *__restrict__ hist) {')
    assert "(void)(atomicAdd(&hist[(int32_t)threadIdx.x % 4], 1));" in src


def test_builtins_barrier_and_shared_memory():
    def build(kb):
        out = kb.buffer("out", I32, (64,))
        tile = kb.alloc("tile", F32, (32, 33), scope="shared")
        regs = kb.alloc("regs", F16, (8,))
        kb.store(tile, (0, thread_idx("y")), 1.0)
        kb.store(regs, (0,), Const(0.5, F16))
        kb.emit(syncthreads())
        kb.store(out, (thread_idx(),), block_idx("z") + block_dim("y") * grid_dim("x"))
    src = text(build)
    for line in ("__shared__ __align__(16) float tile[1056];", "__align__(16) half regs[8];",
                 "HIDETC_SST(tile, (int32_t)threadIdx.y, 1.0f);",   # shared: through the macro
                 "regs[0] = __float2half_rn(0.5f);",
                 "  __syncthreads();\n",
                 "(int32_t)blockIdx.z + (int32_t)blockDim.y * (int32_t)gridDim.x;"):
        assert line in src, line


def test_warp_intrinsics_get_the_full_mask_unless_given():
    def build(kb):
        out, v = kb.buffer("out", F32, (64,)), Const(2.0, F32)
        kb.store(out, (0,), Call("__shfl_down_sync", (v, Const(16, I32)), F32))
        kb.store(out, (1,), Call("__shfl_xor_sync", (Const(0xFF, "uint32"), v, Const(1, I32),
                                                     Const(8, I32)), F32))
        kb.emit(Evaluate(Call("__syncwarp", (), "void")))
    src = text(build)
    assert "__shfl_down_sync(0xffffffffu, 2.0f, 16)" in src
    assert "__shfl_xor_sync(255u, 2.0f, 1, 8)" in src
    assert "  __syncwarp(0xffffffffu);" in src
    with pytest.raises(ValueError, match="__ballot_sync takes 1 operands"):
        text(lambda kb: kb.evaluate(Call("__ballot_sync", (), "uint32")))


def test_float16_arithmetic_and_conversions():
    def build(kb):
        h, f = kb.buffer("h", F16, (4,)), kb.buffer("f", F32, (4,))
        kb.store(h, (0,), h[1] * h[2] + h[3] / h[0])
        kb.store(f, (0,), h[0] + f[1])
        kb.store(h, (1,), maximum(-h[0], Const(float("inf"), F16)))
        kb.store(f, (2,), cast(h[0] < h[1], F32) + cast(h[2], F32))
        kb.store(h, (2,), cast(f[0], F16) + cast(cast(f[0], "float64"), F16))
    src = text(build)
    for piece in ("__hadd_rn(__hmul_rn(h[1], h[2]), hidetc_hdiv(h[3], h[0]))",
                  "__half2float(h[0]) + f[1]",
                  "hidetc_max_float16(__hneg(h[0]), __float2half_rn(INFINITY))",
                  "(float)__hlt(h[0], h[1]) + __half2float(h[2])",
                  "__hadd_rn(__float2half_rn(f[0]), __double2half((double)f[0]))"):
        assert piece in src, piece


def test_unroll_pragma_and_module_layout():
    def build(kb):
        out = kb.buffer("out", F32, (4,))
        with kb.for_range(4, kind="unroll") as i:
            kb.store(out, (i,), 0.0)
    assert "#pragma unroll\n" in text(build)
    kb = KernelBuilder("vz", target="cuda")
    kb.store(kb.buffer("half", F32, (1,)), (0,), 0.0)  # a CUDA name as a parameter
    module = print_cuda_module([lower(kb.finish(**LAUNCH))], prelude="#define MY_PRELUDE 1")
    assert module.index('#include "hidetc_cuda.h"') < module.index("MY_PRELUDE") < module.index(
        "vz(float *__restrict__ half_)")
    assert module.rstrip().endswith('#ifdef HIDETC_EMULATE\nextern "C" void vz_emu_entry(void '
                                    '**args) {\n  vz((float *)args[0]);\n}\n#endif')


def test_shared_arrays_past_48k_are_dynamic_shared_memory():
    """Static arrays while a kernel's shared memory fits 48 KiB; past that every shared
    array is a 16-byte-aligned slice of one dynamic array, whose size the launch passes."""
    def small(kb):
        s = kb.alloc("s", F32, (64, 64), scope="shared")
        kb.store(s, (0, 0), 1.0)
    assert "__shared__ __align__(16) float s[4096];" in text(small)

    def big(kb):
        a = kb.alloc("a", F16, (3,), scope="shared")
        b = kb.alloc("b", F32, (64, 256), scope="shared")
        out = kb.buffer("out", F32, (1,))
        kb.store(a, (0,), Const(1.0, F16))
        kb.store(b, (0, 0), 2.0)
        kb.store(out, (0,), b[0, 0] + cast(a[0], F32))
    src = text(big)
    assert "HIDETC_DYNAMIC_SHARED(hidetc_smem, 65552);" in src
    assert "HIDETC_SHARED_SLICE(half, a, 3, hidetc_smem, 0);" in src
    assert "HIDETC_SHARED_SLICE(float, b, 16384, hidetc_smem, 16);" in src
    assert "__shared__" not in src
    kb = KernelBuilder("dyn", target="cuda")
    big(kb)
    fn = lower(kb.finish(**LAUNCH))
    assert dynamic_shared_bytes(fn) == 65552
    assert declared_dynamic_shared(print_cuda_module([fn])) == {"dyn": 65552}


@pytest.mark.parametrize("build,attrs,error,match", [
    (lambda kb: kb.buffer("a", F32, (1,)), {"target": "cpu"}, ValueError, "target cuda"),
    (lambda kb: kb.buffer("a", F32, (1,)), {"block": None}, ValueError, "attr 'block'"),
    (lambda kb: kb.buffer("a", F32, (1,)), {"block": (64, 32, 1)}, ValueError, "1024"),
    (lambda kb: kb.alloc("s", F32, (256, 256), scope="shared"), {}, ValueError, "no GPU"),
    (lambda kb: kb.alloc("s", F32, (kb.scalar("n"),)), {}, NotImplementedError, "constant"),
    (lambda kb: kb.buffer("a", "float8_e4m3fn", (1,)), {}, NotImplementedError, "float8"),
    (lambda kb: kb.evaluate(Call("hidetc_copy16", (Const(0, I32), Const(0, I32)), "void")),
     {}, ValueError, "by address"),
    (lambda kb: kb.evaluate(Call("frobnicate", (Const(1.0, F32),), F32)), {},
     NotImplementedError, "frobnicate"),
])
def test_errors(build, attrs, error, match):
    with pytest.raises(error, match=match):
        text(build, **attrs)


def test_parallel_loops_and_unlowered_functions_are_rejected():
    kb = KernelBuilder("p", target="cuda")
    out = kb.buffer("out", F32, (4,))
    with kb.for_range(4, kind="parallel") as i:
        kb.store(out, (i,), 0.0)
    fn = kb.finish(**LAUNCH)
    with pytest.raises(ValueError, match="not lowered"):
        print_cuda_function(fn)
    with pytest.raises(ValueError, match="parallel"):
        print_cuda_function(lower(fn))


# one kernel with every math function, casts, min/max and atomics -----------------------
def math_kernel(n=64):
    kb = KernelBuilder("math_all", target="cuda")
    x, y, xh = kb.buffer("x", F32, (n,)), kb.buffer("y", F32, (n,)), kb.buffer("xh", F16, (n,))
    out = kb.buffer("out", F32, (len(UNARY) + len(BINARY), n))
    outh = kb.buffer("outh", F16, (len(UNARY) + len(BINARY), n))
    ints, hist = kb.buffer("ints", I32, (7, n)), kb.buffer("hist", I32, (4,))
    i = thread_idx()
    for k, name in enumerate(UNARY):
        arg, argh = (x[i] + SHIFT[name], xh[i] + SHIFT[name]) if name in SHIFT else (x[i], xh[i])
        kb.store(out, (k, i), Call(name, (arg,), F32))
        kb.store(outh, (k, i), Call(name, (argh,), F16))
    for k, name in enumerate(BINARY, start=len(UNARY)):
        kb.store(out, (k, i), Call(name, (x[i], y[i]), F32))
        kb.store(outh, (k, i), Call(name, (xh[i], cast(y[i], F16)), F16))
    scaled = cast(x[i] * 100.0, I32)
    for k, value in enumerate((scaled, maximum(scaled, 50), minimum(scaled, 50),
                               Call("abs", (scaled - 50,), I32),
                               cast(cast(scaled, F16) * Const(2.0, F16), I32),
                               cast(Call("isinf", (x[i] / 0.0,), "bool"), I32),
                               cast(Call("isnan", (xh[i] * Const(0.0, F16),), "bool"), I32))):
        kb.store(ints, (k, i), value)
    kb.evaluate(Call("atomicAdd", (hist[scaled % 4], Const(1, I32)), I32))
    return kb.finish(grid=(1, 1, 1), block=(n, 1, 1))


@pytest.fixture(scope="module")
def math_source():
    return print_cuda_module([lower(math_kernel())])


def test_every_float16_math_function_is_in_the_header():
    header = (CUDA_INCLUDE_DIR / "hidetc_cuda.h").read_text()
    for name in F16_MATH:
        assert f"({name}," in header or f"hidetc_{name}_float16" in header, name


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_nvcc_compiles_the_math_kernel(math_source, tmp_path):
    compile_cubins({"math_all": math_source}, ("sm_80", "sm_90"), tmp_path,
                   include_dirs=[CUDA_INCLUDE_DIR], ptx=False)


def test_math_kernel_matches_numpy(math_source):
    module = kernel_module({"math_all": math_source})
    rng = np.random.default_rng(2)
    x = rng.uniform(0.05, 0.95, 64).astype(np.float32)
    y = rng.uniform(0.5, 2.0, 64).astype(np.float32)
    xh = x.astype(np.float16)
    m = len(UNARY) + len(BINARY)
    out, outh = np.zeros((m, 64), np.float32), np.zeros((m, 64), np.float16)
    ints, hist = np.zeros((7, 64), np.int32), np.zeros(4, np.int32)
    module.launch("math_all", 1, 64, [x, y, xh, out, outh, ints, hist])
    funcs = list(UNARY.values()) + list(BINARY.values())
    for k, (name, fn) in enumerate(zip(list(UNARY) + list(BINARY), funcs)):
        shift = SHIFT.get(name, 0.0)
        args = (x, y) if name in BINARY else (x + np.float32(shift),)
        want = fn(*(a.astype(np.float64) for a in args))
        np.testing.assert_allclose(out[k], want, rtol=2e-6, atol=1e-7, err_msg=name)
        hargs = (xh, y.astype(np.float16)) if name in BINARY else (xh + np.float16(shift),)
        wanth = fn(*(a.astype(np.float32) for a in hargs)).astype(np.float16)
        np.testing.assert_allclose(outh[k].astype(np.float32), wanth.astype(np.float32),
                                   rtol=1e-3, atol=1e-4, err_msg=f"{name} float16")
    scaled = (x * np.float32(100)).astype(np.int32)
    want_ints = [scaled, np.maximum(scaled, 50), np.minimum(scaled, 50), np.abs(scaled - 50),
                 (scaled.astype(np.float16) * np.float16(2)).astype(np.int32),
                 np.ones(64), np.zeros(64)]
    np.testing.assert_array_equal(ints, want_ints)
    np.testing.assert_array_equal(hist, np.bincount(scaled % 4, minlength=4))
