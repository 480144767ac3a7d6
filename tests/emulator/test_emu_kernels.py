"""CUDA kernels written with the KernelBuilder (target "cuda"), lowered and printed as
ONE .cu unit: nvcc must compile it for sm_80 and sm_90, and the emulator must run every
kernel and match numpy. Covers predication, shared memory + barriers, warp shuffles,
task-mapped tiles, a partial last warp, grid-stride loops, float16, cp.async and an
ldmatrix + mma.m16n8k16 tile."""
import shutil

import numpy as np
import pytest
from helpers.kernel_device import kernel_module

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.toolchain.nvcc import compile_cubins
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Call,
    Const,
    as_expr,
    block_dim,
    block_idx,
    cast,
    eq,
    grid_dim,
    logical_and,
    maximum,
    select,
    syncthreads,
    thread_idx,
)
from hidetc.tir.mapping import repeat, spatial
from hidetc.tir.pipeline import lower

F32, F16, I32, U32 = "float32", "float16", "int32", "uint32"
NVCC = shutil.which("nvcc")
ARCHS = ("sm_80", "sm_90")
RNG = np.random.default_rng(0)


def shfl(name, *args, dtype=F32):
    return Call(name, tuple(Const(a, I32) if isinstance(a, int) else a for a in args), dtype)


def helper(name, *args):
    return Call(name, tuple(as_expr(a) for a in args), "void")


# kernels ---------------------------------------------------------------------------
def vadd():
    kb = KernelBuilder("vadd", target="cuda")
    n = kb.scalar("n")
    a, b, c = (kb.buffer(x, F32, (n,)) for x in "abc")
    i = kb.declare("i", I32, block_idx() * 128 + thread_idx())
    with kb.if_then(i < n):
        kb.store(c, (i,), a[i] + b[i])
    return kb.finish(grid=(8, 1, 1), block=(128, 1, 1))


def warp_sum(kb, value):
    for off in (16, 8, 4, 2, 1):
        kb.assign(value, value + shfl("__shfl_down_sync", value, off))


def row_sum(rows=5):
    """One block per row: strided partial sums, warp shuffles, shared memory, warp 0."""
    kb = KernelBuilder("row_sum", target="cuda")
    n = kb.scalar("n")
    a, out = kb.buffer("a", F32, (rows, n)), kb.buffer("out", F32, (rows,))
    t, row = thread_idx(), block_idx()
    acc = kb.declare("acc", F32, 0.0)
    with kb.for_range((n + 127) // 128, name="k") as k:
        with kb.if_then(k * 128 + t < n):
            kb.assign(acc, acc + a[row, k * 128 + t])
    warp_sum(kb, acc)
    partial = kb.alloc("partial", F32, (4,), scope="shared")
    with kb.if_then(eq(t % 32, 0)):
        kb.store(partial, (t // 32,), acc)
    kb.emit(syncthreads())
    with kb.if_then(t < 32):
        v = kb.declare("v", F32, 0.0)
        with kb.if_then(t < 4):
            kb.assign(v, partial[t])
        warp_sum(kb, v)
        with kb.if_then(eq(t, 0)):
            kb.store(out, (row,), v)
    return kb.finish(grid=(rows, 1, 1), block=(128, 1, 1))


def transpose(h=67, w=45):
    kb = KernelBuilder("transpose", target="cuda")
    a, out = kb.buffer("a", F32, (h, w)), kb.buffer("out", F32, (w, h))
    tile = kb.alloc("tile", F32, (32, 33), scope="shared")
    m = repeat(4, 1) * spatial(8, 32)
    with kb.for_mapping(m, thread_idx(), names=("i", "j")) as (i, j):
        r, c = block_idx("y") * 32 + i, block_idx("x") * 32 + j
        with kb.if_then(logical_and(r < h, c < w)):
            kb.store(tile, (i, j), a[r, c])
    kb.emit(syncthreads())
    with kb.for_mapping(m, thread_idx(), names=("i", "j")) as (i, j):
        r, c = block_idx("x") * 32 + i, block_idx("y") * 32 + j
        with kb.if_then(logical_and(r < w, c < h)):
            kb.store(out, (r, c), tile[j, i])
    return kb.finish(grid=((w + 31) // 32, (h + 31) // 32, 1), block=(256, 1, 1))


def partial_warp(threads=40):
    """Warp 1 has 8 lanes; every collective names exactly the lanes that exist."""
    kb = KernelBuilder("partial_warp", target="cuda")
    a = kb.buffer("a", F32, (threads,))
    outs = {k: kb.buffer(k, d, (threads,)) for k, d in (
        ("ballot", U32), ("bcast", F32), ("up", F32), ("down8", F32), ("any_", I32),
        ("all_", I32), ("active", U32))}
    t = thread_idx()
    mask = kb.declare("mask", U32, select(t < 32, Const(0xFFFFFFFF, U32), Const(0xFF, U32)))
    x = kb.declare("x", F32, a[t])
    kb.store(outs["ballot"], (t,), shfl("__ballot_sync", mask, x > 0.0, dtype=U32))
    kb.store(outs["bcast"], (t,), shfl("__shfl_sync", mask, x, 3))
    kb.store(outs["up"], (t,), shfl("__shfl_up_sync", mask, x, 1))
    kb.store(outs["down8"], (t,), shfl("__shfl_down_sync", mask, x, 1, 8))
    kb.store(outs["any_"], (t,), shfl("__any_sync", mask, x > 1.0, dtype=I32))
    kb.store(outs["all_"], (t,), shfl("__all_sync", mask, x > -1.5, dtype=I32))
    kb.store(outs["active"], (t,), Call("__activemask", (), U32))
    return kb.finish(grid=(1, 1, 1), block=(threads, 1, 1))


def grid_stride():
    kb = KernelBuilder("grid_stride", target="cuda")
    n, scale = kb.scalar("n"), kb.scalar("scale", F32)
    a, out = kb.buffer("a", F32, (n,)), kb.buffer("out", F32, (n,))
    stride = kb.declare("stride", I32, block_dim() * grid_dim())
    start = kb.declare("start", I32, block_idx() * block_dim() + thread_idx())
    with kb.for_range((n + stride - 1) // stride, name="k") as k:
        i = k * stride + start
        with kb.if_then(i < n):
            kb.store(out, (i,), a[i] * scale + 1.0)
    return kb.finish(grid=(3, 1, 1), block=(64, 1, 1))


def half_ops(n=512):
    kb = KernelBuilder("half_ops", target="cuda")
    x, y = kb.buffer("x", F16, (n,)), kb.buffer("y", F32, (n,))
    o = [kb.buffer(f"o{k}", d, (n,)) for k, d in enumerate((F16, F16, F16, F16, F32, F16))]
    with kb.for_mapping(repeat(n // 128) * spatial(128), thread_idx()) as (i,):
        xi = x[i]
        kb.store(o[0], (i,), cast(cast(xi, F32) * y[i], F16))
        kb.store(o[1], (i,), xi * xi + xi)
        kb.store(o[2], (i,), maximum(xi, 0.0))
        kb.store(o[3], (i,), Call("exp", (xi,), F16))
        kb.store(o[4], (i,), select(xi > y[i], xi, y[i]))
        kb.store(o[5], (i,), -xi / (xi + 1.0))
    return kb.finish(grid=(1, 1, 1), block=(128, 1, 1))


def cp_async_copy(chunks=64):
    kb = KernelBuilder("cp_async_copy", target="cuda")
    n = kb.scalar("n")
    a = kb.buffer("a", F32, (n,))
    out, out4, outv = (kb.buffer(k, F32, (4 * chunks,)) for k in ("out", "out4", "outv"))
    s16, s4 = (kb.alloc(k, F32, (4 * chunks,), scope="shared") for k in ("s16", "s4"))
    t = thread_idx()
    kb.evaluate(helper("hidetc_cp_async16", s16[t * 4], a[t * 4], t * 4 < n))
    with kb.for_range(4, kind="unroll", name="e") as e:
        kb.evaluate(helper("hidetc_cp_async4", s4[t * 4 + e], a[t * 4 + e], t * 4 + e < n))
    kb.evaluate(helper("hidetc_cp_async_commit"))
    kb.evaluate(helper("hidetc_cp_async_wait_group", Const(0, I32)))
    kb.emit(syncthreads())
    with kb.for_range(4, kind="unroll", name="e") as e:
        kb.store(out, (t * 4 + e,), s16[t * 4 + e])
        kb.store(out4, (t * 4 + e,), s4[t * 4 + e])
    with kb.if_then(t * 4 < n):
        kb.evaluate(helper("hidetc_ld_f4", outv[t * 4], a[t * 4]))
    return kb.finish(grid=(1, 1, 1), block=(chunks, 1, 1))


def mma_tile():
    """D = A @ B + C (16x8x16): A row-major through ldmatrix.x4; B once [k][n] through
    ldmatrix.x2.trans (D) and once [n][k] through ldmatrix.x2 (D2); cp.async staging."""
    kb = KernelBuilder("mma_tile", target="cuda")
    A, B, Bt = kb.buffer("A", F16, (16, 16)), kb.buffer("B", F16, (16, 8)), kb.buffer(
        "Bt", F16, (8, 16))
    C, D, D2 = kb.buffer("C", F32, (16, 8)), kb.buffer("D", F32, (16, 8)), kb.buffer(
        "D2", F32, (16, 8))
    sA, sB = kb.alloc("sA", F16, (16, 16), "shared"), kb.alloc("sB", F16, (16, 8), "shared")
    sBt = kb.alloc("sBt", F16, (8, 16), "shared")
    t = thread_idx()
    kb.evaluate(helper("hidetc_cp_async16", sA[t // 2, t % 2 * 8], A[t // 2, t % 2 * 8], True))
    with kb.if_then(t < 16):
        kb.evaluate(helper("hidetc_cp_async16", sB[t, 0], B[t, 0], True))
        kb.evaluate(helper("hidetc_cp_async16", sBt[t // 2, t % 2 * 8],
                           Bt[t // 2, t % 2 * 8], True))
    kb.evaluate(helper("hidetc_cp_async_commit"))
    kb.evaluate(helper("hidetc_cp_async_wait_all"))
    kb.emit(syncthreads())
    fa, fb, fbt = (kb.alloc(k, U32, (n,)) for k, n in (("fa", 4), ("fb", 2), ("fbt", 2)))
    fc, fd, fd2 = (kb.alloc(k, F32, (4,)) for k in ("fc", "fd", "fd2"))
    kb.evaluate(helper("hidetc_ldmatrix_x4", fa[0], sA[t % 16, t // 16 * 8]))
    kb.evaluate(helper("hidetc_ldmatrix_x2_trans", fb[0], sB[t % 16, 0]))
    kb.evaluate(helper("hidetc_ldmatrix_x2", fbt[0], sBt[t % 8, t // 8 % 2 * 8]))
    c_map = repeat(2, 1) * spatial(8, 4) * repeat(1, 2)  # the C/D fragment layout
    with kb.for_mapping(c_map, t, names=("i", "j")) as (i, j):
        kb.store(fc, (i // 8 * 2 + j % 2,), C[i, j])
    kb.evaluate(helper("hidetc_mma_m16n8k16_f16f32", fd[0], fa[0], fb[0], fc[0]))
    kb.evaluate(helper("hidetc_mma_m16n8k16_f16f32", fd2[0], fa[0], fbt[0], fc[0]))
    with kb.for_mapping(c_map, t, names=("i", "j")) as (i, j):
        kb.store(D, (i, j), fd[i // 8 * 2 + j % 2])
        kb.store(D2, (i, j), fd2[i // 8 * 2 + j % 2])
    return kb.finish(grid=(1, 1, 1), block=(32, 1, 1))


KERNELS = (vadd, row_sum, transpose, partial_warp, grid_stride, half_ops, cp_async_copy,
           mma_tile)


@pytest.fixture(scope="module")
def source():
    return print_cuda_module([lower(k()) for k in KERNELS])


@pytest.fixture(scope="module")
def module(source):
    return kernel_module({"emu_kernels": source})


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_nvcc_compiles_every_kernel(source, tmp_path):
    """nvcc + ptxas for sm_80 and sm_90 (cached by content); any error fails."""
    cubins = compile_cubins({"emu_kernels": source}, ARCHS, tmp_path,
                            include_dirs=[CUDA_INCLUDE_DIR], ptx=False)
    assert all(cubins[arch]["emu_kernels"].stat().st_size > 0 for arch in ARCHS)


def test_vadd_predicated(module):
    n = 1000
    a, b = RNG.random(n, np.float32), RNG.random(n, np.float32)
    c = np.full(n + 24, -1.0, np.float32)  # beyond n: must stay untouched
    module.launch("vadd", 8, 128, [np.int32(n), a, b, c])
    np.testing.assert_array_equal(c[:n], a + b)
    assert (c[n:] == -1.0).all()


def test_row_sum_shared_memory_and_shuffles(module):
    a = RNG.standard_normal((5, 300)).astype(np.float32)
    out = np.zeros(5, np.float32)
    module.launch("row_sum", 5, 128, [np.int32(300), a, out])
    np.testing.assert_allclose(out, a.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_tiled_transpose(module):
    a = RNG.standard_normal((67, 45)).astype(np.float32)
    out = np.zeros((45, 67), np.float32)
    module.launch("transpose", (2, 3), 256, [a, out])
    np.testing.assert_array_equal(out, a.T)


def test_partial_last_warp(module):
    x = RNG.uniform(-2, 2, 40).astype(np.float32)
    outs = {k: np.zeros(40, d) for k, d in (("ballot", np.uint32), ("bcast", np.float32),
            ("up", np.float32), ("down8", np.float32), ("any_", np.int32),
            ("all_", np.int32), ("active", np.uint32))}
    module.launch("partial_warp", 1, 40, [x, *outs.values()])
    for lo, hi in ((0, 32), (32, 40)):
        w, lanes = x[lo:hi], np.arange(hi - lo)
        assert (outs["ballot"][lo:hi] == sum(1 << int(k) for k in lanes[w > 0])).all()
        assert (outs["bcast"][lo:hi] == w[3]).all()
        np.testing.assert_array_equal(outs["up"][lo:hi], np.where(lanes >= 1, np.roll(w, 1), w))
        nxt = np.where(lanes % 8 < 7, np.roll(w, -1), w)
        np.testing.assert_array_equal(outs["down8"][lo:hi], nxt)
        assert (outs["any_"][lo:hi] == int((w > 1).any())).all()
        assert (outs["all_"][lo:hi] == int((w > -1.5).all())).all()
        assert (outs["active"][lo:hi] == (1 << (hi - lo)) - 1).all()


def test_grid_stride_loop(module):
    a = RNG.standard_normal(1000).astype(np.float32)
    out = np.zeros(1000, np.float32)
    module.launch("grid_stride", 3, 64, [np.int32(1000), np.float32(0.5), a, out])
    np.testing.assert_array_equal(out, a * np.float32(0.5) + np.float32(1))


def test_float16_load_convert_store(module):
    x = RNG.standard_normal(512).astype(np.float16) * np.float16(4)
    x[:8] = [0.0, -0.0, 6e-8, 65504, -65504, 300, np.inf, np.nan]
    y = RNG.standard_normal(512).astype(np.float32)
    outs = [np.zeros(512, d) for d in (np.float16,) * 4 + (np.float32, np.float16)]
    module.launch("half_ops", 1, 128, [x, y, *outs])
    with np.errstate(all="ignore"):
        xf = x.astype(np.float32)
        want = [(xf * y).astype(np.float16), x * x + x, np.maximum(x, np.float16(0)),
                np.exp(xf).astype(np.float16), np.where(xf > y, xf, y),
                -x / (x + np.float16(1))]
    for k, (got, ref) in enumerate(zip(outs, want)):
        if k == 3:  # expf: libm vs CUDA may differ by an ulp before rounding to half
            np.testing.assert_allclose(got, ref, rtol=1e-3, err_msg="exp")
        else:
            np.testing.assert_array_equal(got, ref, err_msg=f"o{k}")


def test_cp_async_with_zero_fill(module):
    n = 148  # 37 whole chunks in range, 27 zero-filled
    a = RNG.standard_normal(n).astype(np.float32)
    out, out4 = np.full(256, 7.0, np.float32), np.full(256, 7.0, np.float32)
    outv = np.full(256, 7.0, np.float32)
    module.launch("cp_async_copy", 1, 64, [np.int32(n), a, out, out4, outv])
    want = np.concatenate([a, np.zeros(256 - n, np.float32)])
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(out4, want)
    np.testing.assert_array_equal(outv[:n], a)
    assert (outv[n:] == 7.0).all()


def test_ldmatrix_mma_tile(module):
    A = RNG.uniform(-1, 1, (16, 16)).astype(np.float16)
    B = RNG.uniform(-1, 1, (16, 8)).astype(np.float16)
    C = RNG.standard_normal((16, 8)).astype(np.float32)
    D, D2 = np.zeros((16, 8), np.float32), np.zeros((16, 8), np.float32)
    module.launch("mma_tile", 1, 32, [A, B, np.ascontiguousarray(B.T), C, D, D2])
    want = A.astype(np.float64) @ B.astype(np.float64) + C
    np.testing.assert_allclose(D, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(D2, want, rtol=1e-5, atol=1e-5)
