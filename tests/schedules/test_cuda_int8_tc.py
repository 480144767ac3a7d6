"""The int8 tensor-core MatMulInteger template (hidetc/schedules/cuda/matmul_int8_tc.py)
and the intrinsics it stands on.

- the intrinsics: `hidetc_mma_m16n8k32_<a><b>s32` on fragments gathered by a hand-written
  kernel per the PTX ISA layouts written out here (independently of the emulator), all
  four operand-type pairs, against numpy's exact products, including int32 wraparound;
  `hidetc_byte_perm` and `hidetc_bytesum_{u8,s8}` against numpy; nvcc compiles the
  kernel for sm_80 and sm_90. With HIDETC_KERNEL_DEVICE=gpu the same checks judge the
  hardware.
- the layout facts in Python: `b_row` permutes each 16 rows, and ldmatrix.x4.trans over
  the permuted B tile followed by the byte_perm selectors gives the PTX B fragments of
  the even and odd columns (ldmatrix modelled per the PTX ISA); the space is
  hardware-centric and within budget; the dispatch takes the template.
- kernels: every config of the space on awkward shapes (M, N, K not multiples of the
  tiles and of 16 / 8 / 4 bytes: the 8-byte, 4-byte and single-byte copy paths; 1-D and
  batched, broadcast operands; uint8 / int8 both operands; with and without zero points,
  per-tensor and per-column b_zero; the extremes 255 x -128 over K = 1000; K = 0, M = 0;
  a uint8 x uint8 K whose sums wrap int32), built, lowered, run in the emulator with its
  shared-memory race checks (async copies land only when waited for, every shared index
  bounds-checked, locals poisoned) and compared EXACTLY with the MatMulInteger
  reference; the output sits between guards (a write outside it fails), and an element
  left unwritten keeps a sentinel the reference never takes. The same kernels compiled by
  nvcc for sm_80 and sm_90 (ptxas errors fail; registers within the limits, no spills on
  the 16-byte copy path). A seeded sample runs by default, every config under `-m slow`.
"""
from __future__ import annotations

import random
import shutil
from dataclasses import replace

import numpy as np
import pytest
from helpers import targets
from helpers.kernel_device import kernel_module
from helpers.tasks import matmul_integer_task as matmul_task

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.runtime.emulator import EmulatedModule
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources
from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType
from hidetc.graph.ops import get_op
from hidetc.schedules import cuda
from hidetc.schedules.cuda import matmul_int8_tc as int8_tc
from hidetc.schedules.cuda.matmul_int8_tc import (
    DEFAULTS,
    EVEN,
    ODD,
    TEMPLATE,
    Int8TcConfig,
    b_row,
    byte_width,
    fits,
)
from hidetc.schedules.template import MAX_SPACE
from hidetc.tir import cuda as tc
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.pipeline import lower

ARCHS = ("sm_80", "sm_90")
TARGET = targets.CUDA
SPACE = TEMPLATE.space(None, TARGET)
SAMPLE = random.Random(0).sample(SPACE, 20)
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
GUARD = 64                      # int32 on each side of the output
SENTINEL = -123456789           # what an unwritten output element keeps


# (task, how its values are drawn): "random" over each type's range, "extreme" its ends
SHAPES = [
    (matmul_task((37, 70), (70, 45), az=True, bz=(45,)), "random"),
    (matmul_task((1, 200), (200, 72), "int8", "int8"), "random"),
    (matmul_task((3, 2, 40, 33), (33, 96), "uint8", "uint8", az=True, bz=()), "random"),
    (matmul_task((2, 1, 17, 64), (3, 64, 20), "int8", "uint8", bz=()), "random"),
    (matmul_task((129,), (129, 50), az=True), "random"),
    (matmul_task((50, 48), (48,), "int8", "int8", az=True, bz=()), "random"),
    (matmul_task((64, 1000), (1000, 64), az=True, bz=(64,)), "extreme"),
    (matmul_task((100, 1000), (1000, 36), "uint8", "int8"), "extreme"),
    (matmul_task((70, 96), (96, 130), "int8", "uint8", az=True, bz=(130,)), "random"),
    (matmul_task((5, 0), (0, 7), az=True, bz=(7,)), "random"),
    (matmul_task((0, 16), (16, 8)), "random"),
    (matmul_task((2, 40000), (40000, 8), "uint8", "uint8"), "extreme"),   # sums wrap
]


# ---------------------------------------------------------------- the intrinsics

INTRINSICS = r"""
#include "hidetc_cuda.h"

/* fragments gathered from global memory per the PTX ISA, mma.m16n8k32 .u8/.s8 (g = lane/4,
 * t = lane%4): a[i] = A row g + 8 (i % 2), k 16 (i / 2) + 4t .. +3; b[i] = B column g,
 * k 16 i + 4t .. +3 (low byte first); c[i] = C (g + 8 (i / 2), 2t + i % 2) */
extern "C" __global__ void mma_int8(const unsigned char *A, const unsigned char *B,
                                    const int *C, int *D, int types) {
  int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  unsigned a[4], b[2];
  int c[4], d[4];
  for (int i = 0; i < 4; i++) {
    a[i] = 0;
    for (int q = 0; q < 4; q++)
      a[i] |= (unsigned)A[(g + 8 * (i % 2)) * 32 + 16 * (i / 2) + 4 * t + q] << (8 * q);
    c[i] = C[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  }
  for (int i = 0; i < 2; i++) {
    b[i] = 0;
    for (int q = 0; q < 4; q++) b[i] |= (unsigned)B[(16 * i + 4 * t + q) * 8 + g] << (8 * q);
  }
  if (types == 0) hidetc_mma_m16n8k32_u8u8s32(d, a, b, c);
  else if (types == 1) hidetc_mma_m16n8k32_s8u8s32(d, a, b, c);
  else if (types == 2) hidetc_mma_m16n8k32_u8s8s32(d, a, b, c);
  else hidetc_mma_m16n8k32_s8s8s32(d, a, b, c);
  for (int i = 0; i < 4; i++) D[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}

extern "C" __global__ void byte_helpers(const unsigned *x, const unsigned *y,
                                        const unsigned *sel, const int *acc, unsigned *perm,
                                        int *sum_u8, int *sum_s8) {
  int i = threadIdx.x;
  perm[i] = hidetc_byte_perm(x[i], y[i], sel[i]);
  sum_u8[i] = hidetc_bytesum_u8(x[i], acc[i]);
  sum_s8[i] = hidetc_bytesum_s8(x[i], acc[i]);
}

#ifdef HIDETC_EMULATE
extern "C" void mma_int8_emu_entry(void **a) {
  mma_int8((const unsigned char *)a[0], (const unsigned char *)a[1], (const int *)a[2],
           (int *)a[3], *(int *)a[4]);
}
extern "C" void byte_helpers_emu_entry(void **a) {
  byte_helpers((const unsigned *)a[0], (const unsigned *)a[1], (const unsigned *)a[2],
               (const int *)a[3], (unsigned *)a[4], (int *)a[5], (int *)a[6]);
}
#endif
"""
TYPE_PAIRS = [("uint8", "uint8"), ("int8", "uint8"), ("uint8", "int8"), ("int8", "int8")]


@pytest.fixture(scope="module")
def intrinsics():
    return kernel_module({"int8_intrinsics": INTRINSICS})


def wrap32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.int64).astype(np.int32)      # modulo 2^32


@pytest.mark.parametrize("types", range(4))
@pytest.mark.parametrize("values", ["random", "extreme"])
def test_mma_m16n8k32_on_ptx_fragments(intrinsics, types, values):
    """d = a @ b + c exactly, for every operand-type pair; C near the int32 ends so the
    sums wrap (no .satfinite)."""
    rng = np.random.default_rng(types)
    a_dt, b_dt = TYPE_PAIRS[types]
    draw = (lambda dt, shape: rng.choice([np.iinfo(dt).min, np.iinfo(dt).max], shape)) \
        if values == "extreme" else \
        (lambda dt, shape: rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, shape, endpoint=True))
    A, B = draw(a_dt, (16, 32)).astype(a_dt), draw(b_dt, (32, 8)).astype(b_dt)
    C = rng.integers(-2 ** 31, 2 ** 31, (16, 8), dtype=np.int64)
    C[::3] = np.where(C[::3] > 0, 2 ** 31 - 1 - C[::3] % 1000, -2 ** 31 + C[::3] % 1000)
    C = C.astype(np.int32)
    D = np.zeros((16, 8), np.int32)
    intrinsics.launch("mma_int8", 1, 32, [A.view(np.uint8), B.view(np.uint8), C, D,
                                          np.int32(types)])
    want = wrap32(A.astype(np.int64) @ B.astype(np.int64) + C)
    np.testing.assert_array_equal(D, want)


def test_byte_perm_and_bytesum(intrinsics):
    rng = np.random.default_rng(5)
    n = 64
    x = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    y = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    sel = rng.integers(0, 2 ** 16, n).astype(np.uint32)
    sel[:2] = (EVEN, ODD)
    acc = rng.integers(-2 ** 31, 2 ** 31, n, dtype=np.int64).astype(np.int32)
    acc[:4] = (2 ** 31 - 1, -2 ** 31, 2 ** 31 - 200, 0)          # sums that wrap
    perm, sum_u8, sum_s8 = np.zeros(n, np.uint32), np.zeros(n, np.int32), np.zeros(n, np.int32)
    intrinsics.launch("byte_helpers", 1, n, [x, y, sel, acc, perm, sum_u8, sum_s8])
    bytes8 = np.concatenate([x[:, None].view(np.uint8), y[:, None].view(np.uint8)], axis=1)
    picks = [(sel >> (4 * i)) & 7 for i in range(4)]
    want = sum(bytes8[np.arange(n), p].astype(np.uint32) << (8 * i) for i, p in enumerate(picks))
    np.testing.assert_array_equal(perm, want)
    as_u8 = x[:, None].view(np.uint8).astype(np.int64).sum(axis=1)
    as_s8 = x[:, None].view(np.int8).astype(np.int64).sum(axis=1)
    np.testing.assert_array_equal(sum_u8, wrap32(acc.astype(np.int64) + as_u8))
    np.testing.assert_array_equal(sum_s8, wrap32(acc.astype(np.int64) + as_s8))


def test_the_typed_constructors_refuse_wrong_operands():
    kb = KernelBuilder("k", target="cuda")
    ints, words = kb.alloc("d", "int32", (4,)), kb.alloc("r", "uint32", (4,))
    floats = kb.alloc("f", "float32", (4,))
    stmt = tc.mma_m16n8k32(ints[0], words[0], words[2], a_dtype="uint8", b_dtype="int8")
    assert stmt.expr.func == "hidetc_mma_m16n8k32_u8s8s32"
    with pytest.raises(ValueError, match="uint8 or int8"):
        tc.mma_m16n8k32(ints[0], words[0], words[2], a_dtype="float16")
    with pytest.raises(ValueError, match="accumulator d"):
        tc.mma_m16n8k32(floats[0], words[0], words[2])
    with pytest.raises(ValueError, match="16-bit constant"):
        tc.byte_perm(words[0], words[1], 1 << 16)
    with pytest.raises(ValueError, match="32-bit integer"):
        tc.byte_perm(floats[0], words[1], EVEN)
    with pytest.raises(ValueError, match="int32"):
        tc.bytesum(words[0], floats[0], "int8")
    assert tc.bytesum(words[0], ints[0], "uint8").func == "hidetc_bytesum_u8"


@needs_nvcc
def test_nvcc_compiles_the_intrinsics(tmp_path):
    compile_cubins({"int8_intrinsics": INTRINSICS}, ARCHS, tmp_path,
                   include_dirs=[CUDA_INCLUDE_DIR], ptx=False)


# ---------------------------------------------------------------- layouts, space, dispatch

def test_b_rows_are_permuted_per_16():
    for s0 in range(0, 64, 16):
        assert sorted(b_row(s) for s in range(s0, s0 + 16)) == list(range(s0, s0 + 16))
    assert [b_row(s) for s in range(8)] == [0, 1, 4, 5, 8, 9, 12, 13]


def test_ldmatrix_trans_and_byte_perm_give_the_ptx_b_fragments():
    """Model ldmatrix.x4.trans per the PTX ISA (lane i gives the row address of row i % 8
    of matrix i // 8 -- here smem row i of the B tile; register m of lane l holds the
    16-bit elements (2 (l % 4), l // 4) and (2 (l % 4) + 1, l // 4) of matrix m, each the
    byte pair of columns 2 (l // 4), + 1), then the byte_perm selectors: the registers
    must be the mma.m16n8k32 B fragments (column g, k 4t + q and 16 + 4t + q) of the
    even columns 2g and the odd columns 2g + 1."""
    smem = [[(b_row(s), n) for n in range(16)] for s in range(32)]     # (k, n) per byte

    def perm(x, y, sel):
        both = x + y
        return [both[(sel >> (4 * i)) & 7] for i in range(4)]

    for lane in range(32):
        g, t = divmod(lane, 4)
        regs = []
        for m in range(4):
            lo, hi = smem[8 * m + 2 * t], smem[8 * m + 2 * t + 1]
            regs.append([lo[2 * g], lo[2 * g + 1], hi[2 * g], hi[2 * g + 1]])
        for parity, sel in ((0, EVEN), (1, ODD)):
            for r in range(2):
                got = perm(regs[2 * r], regs[2 * r + 1], sel)
                assert got == [(16 * r + 4 * t + q, 2 * g + parity) for q in range(4)]


def test_space_is_hardware_centric():
    assert 30 < len(SPACE) <= MAX_SPACE and len(set(SPACE)) == len(SPACE)
    for cfg in SPACE:
        assert fits(cfg, TARGET) and cfg.splits == 1 and cfg.bk % 32 == 0
        assert cfg.nt % 2 == 0 and cfg.bn % 16 == 0 and cfg.registers_on(TARGET.arch) <= 255
        assert 64 <= (cfg.stages - 1) * cfg.bk <= 384
    assert any(c.shared_bytes > 48 * 1024 for c in SPACE)
    assert all(d in SPACE for d in DEFAULTS)
    task = matmul_task((128, 768), (768, 3072), az=True)
    ordered = TEMPLATE.space(task, TARGET)
    assert set(ordered) == set(SPACE) and TEMPLATE.default(task, TARGET) in DEFAULTS
    gemm = int8_tc.cost_gemm(task)
    times = [int8_tc.estimate_us(gemm, c, TARGET) for c in ordered]
    assert times == sorted(times)


def test_dispatch_takes_the_int8_tensor_cores():
    task = SHAPES[0][0]
    assert cuda.supports("MatMulInteger") and cuda.template_for(task) is TEMPLATE
    template, config = cuda.kernel_choice(task, TARGET)
    assert template is TEMPLATE and config in DEFAULTS
    assert cuda.build_kernel(task, "k", TARGET).attr("block") == (config.threads, 1, 1)
    with pytest.raises(ValueError, match="MatMulInteger of uint8"):
        int8_tc.check_task(Task("MatMul", (TensorType("float32", (4, 4)),) * 2,
                                (TensorType("float32", (4, 4)),), (), (None, None)))
    with pytest.raises(ValueError, match="no split-K"):
        TEMPLATE.build(task, replace(DEFAULTS[0], splits=2), "k", TARGET)


# ---------------------------------------------------------------- kernels

def build_cases(configs) -> list[tuple[Task, str, Int8TcConfig, object]]:
    """Each config on one shape (cycling), and the defaults on every shape."""
    cases = [(SHAPES[i % len(SHAPES)], cfg) for i, cfg in enumerate(configs)]
    cases += [(shape, DEFAULTS[i % len(DEFAULTS)]) for i, shape in enumerate(SHAPES)]
    return [(task, values, cfg, lower(TEMPLATE.build(task, cfg, f"i8tc{i}", TARGET)))
            for i, ((task, values), cfg) in enumerate(cases)]


def sources(cases, units: int) -> dict[str, str]:
    return {f"i8tc_unit{u}": print_cuda_module([fn for *_, fn in cases[u::units]])
            for u in range(units)}


def draw(t: TensorType, values: str, rng) -> np.ndarray:
    info = np.iinfo(t.dtype)
    if values == "extreme":       # the ends of each type: 255 / 0 x -128 / 127
        return rng.choice([info.min, info.max], t.shape).astype(t.dtype)
    return rng.integers(info.min, info.max, t.shape, endpoint=True).astype(t.dtype)


def run_case(module, task: Task, values: str, fn, rng) -> None:
    inputs = [None if t is None else draw(t, values, rng) for t in task.inputs]
    ref = get_op("MatMulInteger").reference(inputs, {})[0]
    assert not (ref == SENTINEL).any()
    storage = np.full(ref.size + 2 * GUARD, SENTINEL, np.int32)
    out = storage[GUARD:GUARD + ref.size].reshape(ref.shape)
    args = [x.reshape(-1) for x in inputs if x is not None] + [out]
    grid, block = fn.attr("grid"), fn.attr("block")
    if isinstance(module, EmulatedModule):      # sanitized: races, async waits, bounds
        module.launch(fn.name, grid, block, args, races=True)
    else:
        module.launch(fn.name, grid, block, args)
    what = f"{fn.name}: {task.signature()} {values}"
    assert (storage[:GUARD] == SENTINEL).all() and (storage[GUARD + ref.size:] == SENTINEL).all(), \
        f"{what}: wrote outside the output"
    np.testing.assert_array_equal(out, ref, err_msg=what)


def run_all(cases, units: int) -> None:
    module = kernel_module(sources(cases, units))
    rng = np.random.default_rng(0)
    for task, values, _, fn in cases:
        run_case(module, task, values, fn, rng)


def check_ptxas(cases, cubins) -> None:
    """Every kernel for every arch within the register limits; no spills where both row
    lengths take 16-byte copies."""
    for arch in ARCHS:
        report = {}
        for path in cubins[arch].values():
            report.update(ptxas_resources(path))
        assert set(report) == {fn.name for *_, fn in cases}
        for task, _, cfg, fn in cases:
            res = report[fn.name]
            assert res["registers"] <= min(255, 65536 // cfg.threads), (arch, fn.name, res)
            k, n = task.inputs[0].shape[-1], int8_tc.geometry(task).n
            if byte_width(k) == byte_width(n) == 16:
                assert res["spills"] == 0 and res["stack_bytes"] == 0, (arch, fn.name, res)


@pytest.fixture(scope="module")
def cases():
    return build_cases(SAMPLE)


def test_sample_in_emulator(cases):
    run_all(cases, units=2)


@needs_nvcc
@pytest.mark.slow      # (the suite's time; test_nvcc_compiles_the_intrinsics stays)
def test_nvcc_compiles_the_sample(cases, tmp_path):
    check_ptxas(cases, compile_cubins(sources(cases, 2), ARCHS, tmp_path, ptx=False,
                                      include_dirs=[CUDA_INCLUDE_DIR], keep_logs=True))


@pytest.mark.slow
def test_every_config_in_emulator_and_nvcc(tmp_path):
    every = build_cases(SPACE)
    run_all(every, units=4)
    if shutil.which("nvcc") is not None:
        check_ptxas(every, compile_cubins(sources(every, 4), ARCHS, tmp_path, ptx=False,
                                          include_dirs=[CUDA_INCLUDE_DIR], keep_logs=True))

