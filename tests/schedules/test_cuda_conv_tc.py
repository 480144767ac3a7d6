"""The f16 tensor-core implicit-GEMM convolution (hidetc/schedules/cuda/conv_tc.py).

Layout facts in Python (the plain-ldmatrix B^T address mapping yields the mma "col" B
fragment), then kernels: a seeded sample of configs on awkward NHWC shapes (batch 1-2,
C/G in {8, 16, 24, 40}, OC in {8, 24, 72}, spatial 1..13, kernels 1x1/3x3/7x7, stride
2, asymmetric pads, dilation 2, groups 2, bias, plus C/G = 12, 2, 1 for the 8-byte,
4-byte and scalar copy paths) is built, lowered and printed into two translation units,
compiled by nvcc for sm_80 (ptxas errors fail; registers <= 255, no spills on the
16-byte path) and run in the emulator on float16 inputs against a float64 numpy
reference from the same inputs; the split-K cases run again with the blocks and threads in
reverse order and must give the same bits and leave their arrival counters zero.

Tolerance: the kernel multiplies exact f16 products, accumulates in f32 and rounds to
f16 once. The f16 rounding is at most 2^-11 relative (|ref| * 4.9e-4); the f32
accumulation error of K terms of size <= 1 is ~ sqrt(K) * 2^-24 * |terms| for random
signs, bounded generously by 1e-5 * sqrt(K) absolute. So every element must lie within
1e-3 |ref| + 1e-5 sqrt(K), and the norm-wise relative error within the documented f16
tolerance 1e-2. Unwritten outputs (NaN sentinel) and writes past the output fail.
Every config of the space runs under `-m slow`.
"""
from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from helpers import targets
from helpers.kernel_device import kernel_module, launch_checked

from hidetc.backends.codegen.cuda import (
    CUDA_INCLUDE_DIR,
    dynamic_shared_bytes,
    print_cuda_module,
)
from hidetc.backends.toolchain.nvcc import compile_cubins, find_nvcc, ptxas_resources
from hidetc.compute.task import Task
from hidetc.errors import ToolchainError, UnsupportedOpError
from hidetc.graph.ir import TensorType
from hidetc.graph.ops import get_op
from hidetc.schedules.cuda import TEMPLATES, build_kernel, supports
from hidetc.schedules.cuda.conv_tc import TEMPLATE, conv_geometry
from hidetc.schedules.cuda.matmul_tc import DEFAULTS
from hidetc.schedules.cuda.tc_common import B_NK_X4, TcConfig, copy_width
from hidetc.schedules.template import MAX_SPACE
from hidetc.tir.pipeline import lower

ARCHS = ("sm_80",)
TARGET = targets.CUDA
SPACE = TEMPLATE.space(None, TARGET)
SAMPLE = random.Random(0).sample(SPACE, 32)
# (NHWC input shape, OC, KH x KW, strides, pads (t, l, b, r), dilations, group, bias)
SHAPES = (
    ((1, 5, 5, 8), 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, False),
    ((2, 7, 7, 16), 24, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, True),
    ((1, 13, 13, 24), 72, (3, 3), (2, 2), (1, 0, 1, 2), (1, 1), 1, False),
    ((1, 7, 7, 40), 8, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1, True),
    ((2, 5, 5, 32), 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2, True),
    ((1, 13, 13, 8), 24, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1, False),
    ((1, 1, 1, 16), 72, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, True),
    ((2, 5, 5, 48), 72, (1, 1), (1, 1), (0, 1, 1, 0), (1, 1), 2, False),
    ((1, 5, 7, 8), 72, (3, 1), (2, 1), (0, 0, 2, 0), (2, 1), 1, False),
    ((1, 7, 7, 16), 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
)
SMALL_C = (   # C/G % 8 != 0: cp.async 8 (12), cp.async 4 (2), scalar (3; depthwise)
    ((1, 5, 5, 12), 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    ((1, 5, 5, 4), 24, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 2, False),
    ((1, 6, 6, 3), 8, (3, 3), (2, 2), (0, 0, 1, 1), (1, 1), 1, False),
    ((1, 5, 5, 8), 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 8, True),
)

try:
    NVCC = find_nvcc()
except ToolchainError:
    NVCC = None
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def conv_task(shape, oc, kernel, strides, pads, dilations, group, bias) -> Task:
    f16 = "float16"
    x = TensorType(f16, shape)
    w = TensorType(f16, (oc,) + tuple(kernel) + (shape[3] // group,))
    b = TensorType(f16, (oc,)) if bias else None
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": group}
    (out,) = get_op("ConvNHWC").infer([x, w, b], attrs, [None] * 3)
    return Task("ConvNHWC", (x, w, b), (out,), tuple(sorted(attrs.items())), (None,) * 3)


# ---------------------------------------------------------------- space and layouts

def test_space_and_registration():
    assert 30 < len(SPACE) <= MAX_SPACE and len(set(SPACE)) == len(SPACE)
    per_task = TEMPLATE.space(conv_task(*SHAPES[0]), TARGET)   # the tiles at their splits
    assert len(per_task) == len(SPACE) and {replace(c, splits=1) for c in per_task} == set(SPACE)
    assert TEMPLATE.name == "cuda.conv_tc" and TEMPLATE.precisions == ("f16", "bf16")
    assert TEMPLATES["ConvNHWC"] is TEMPLATE and supports("ConvNHWC")
    big = conv_task((8, 56, 56, 64), 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, False)
    cfg = TEMPLATE.default(big, TARGET)        # many tiles: a big one, unsplit, N = 64 wide
    assert cfg in DEFAULTS and cfg.splits == 1 and cfg.bm == 128 and cfg.bn == 64
    # ResNet-50's layer4 3x3 (K = 4608, 7x7 map): few tiles, so K is split over blocks
    deep = conv_task((1, 7, 7, 512), 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, False)
    cfg = TEMPLATE.default(deep, TARGET)
    assert cfg.splits > 1 and replace(cfg, splits=1) in DEFAULTS
    small = TEMPLATE.default(conv_task(*SHAPES[0]), TARGET)
    fn = build_kernel(conv_task(*SHAPES[0]), "rule", TARGET)
    assert fn.attr("block") == (small.threads, 1, 1)


def test_b_nk_ldmatrix_gives_the_mma_b_fragment():
    """Simulate plain ldmatrix.x4 over a 16 n x 16 k tile stored [n][k]: lane 8q + i
    gives the address of row i of matrix q (`B_NK_X4`: lane -> (n half, k chunk,
    row)); register q of lane l receives elements 2 (l % 4) + {0, 1} of row l // 4 of
    matrix q. The kernel uses registers (0, 1) as (b0, b1) of n tile 0 and (2, 3) of n
    tile 1; PTX: b0 of lane l = B[k = 2 (l % 4) + {0, 1}][n = l // 4], b1 the same at
    k + 8 (B[k][n] = tile[n][k])."""
    rows = [B_NK_X4.tasks_of(lane)[0] for lane in range(32)]
    for lane in range(32):
        for reg in range(4):
            nhalf, kchunk, row = rows[8 * reg + lane // 4]
            got = [(nhalf * 8 + row, kchunk * 8 + 2 * (lane % 4) + e) for e in range(2)]
            tile, b = divmod(reg, 2)
            want = [(tile * 8 + lane // 4, b * 8 + 2 * (lane % 4) + e) for e in range(2)]
            assert got == want, (lane, reg)


def test_rejects_other_tasks():
    task = conv_task(*SHAPES[0])
    bad = Task("ConvNHWC", tuple(TensorType("float32", t.shape) if t else None
                                 for t in task.inputs), task.outputs, task.attrs, task.params)
    with pytest.raises(ValueError, match="float16"):
        TEMPLATE.build(bad, DEFAULTS[0], "bad", targets.CUDA)
    with pytest.raises(UnsupportedOpError, match="ConvNHWC"):
        build_kernel(bad, "bad", TARGET)


# ---------------------------------------------------------------- kernels

def build_cases(configs) -> list[tuple[str, Task, TcConfig, object]]:
    """Each config on one shape (cycling), the default config on every shape."""
    shapes = SHAPES + SMALL_C
    cases = [(shapes[i % len(shapes)], cfg) for i, cfg in enumerate(configs)]
    cases += [(shape, DEFAULTS[-1]) for shape in shapes]
    # split-K: K = 360 in 3 and 12 k tiles, K = 392 over 5 splits, K = 72 (3 k tiles of
    # 32) over 4 splits (one empty), groups and bias
    cases += [(SHAPES[3], replace(DEFAULTS[-1], splits=3)),
              (SHAPES[3], TcConfig(32, 32, 32, 1, 1, 3, splits=2)),
              (SHAPES[5], TcConfig(64, 32, 16, 2, 1, 2, splits=5)),
              (SHAPES[0], TcConfig(32, 32, 32, 1, 1, 2, splits=4)),
              (SHAPES[4], TcConfig(32, 32, 32, 1, 1, 3, splits=2))]
    out = []
    for i, (shape, cfg) in enumerate(cases):
        task = conv_task(*shape)
        fn = lower(TEMPLATE.build(task, cfg, f"conv{i}", targets.CUDA))
        out.append((f"conv{i}", task, cfg, fn))
    return out


def sources(cases, units: int = 2) -> dict[str, str]:
    return {f"conv_unit{u}": print_cuda_module([fn for _, _, _, fn in cases[u::units]])
            for u in range(units)}


def run_case(module, task: Task, fn, rng) -> None:
    arrays = [rng.uniform(-1, 1, t.shape).astype(np.float16) if t is not None else None
              for t in task.inputs]
    wide = [a.astype(np.float64) if a is not None else None for a in arrays]
    (ref,) = get_op("ConvNHWC").reference(wide, dict(task.attrs))
    size = ref.size
    storage = np.full(size + 64, np.float16(7.0))
    storage[:size] = np.nan                       # anything unwritten fails
    out = storage[:size].reshape(ref.shape)
    args = [a for a in arrays if a is not None] + [out]
    launch_checked(module, fn, args)     # split-K: again, in reverse order
    got = out.astype(np.float64)
    what = f"{fn.name}: {task.signature()} {dict(task.attrs)}"
    assert (storage[size:] == np.float16(7.0)).all(), f"{what}: wrote past the output"
    error = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    assert error <= 1e-2, f"{what}: norm-wise relative error {error}"
    bound = 1e-3 * np.abs(ref) + 1e-5 * np.sqrt(conv_geometry(task).k)
    assert (np.abs(got - ref) <= bound).all(), f"{what}: max error {np.abs(got - ref).max()}"


def run_all(cases) -> None:
    module = kernel_module(sources(cases))
    rng = np.random.default_rng(0)
    for _, task, _, fn in cases:
        run_case(module, task, fn, rng)


@pytest.fixture(scope="module")
def cases():
    return build_cases(SAMPLE)


def test_sample_in_emulator(cases):
    run_all(cases)


def check_ptxas(cases, cubins) -> None:
    """Every kernel compiled with its shared memory, registers <= 255 (and the block's
    share of the register file), no spills on the 16-byte copy path."""
    for arch in ARCHS:
        report = {}
        for path in cubins[arch].values():
            report.update(ptxas_resources(path))
        assert set(report) == {name for name, _, _, _ in cases}
        for name, task, cfg, fn in cases:
            res = report[name]
            static = cfg.shared_bytes if cfg.shared_bytes <= 48 * 1024 else 0
            assert res["shared_bytes"] == static, name     # ptxas: static only
            assert dynamic_shared_bytes(fn) == cfg.shared_bytes - static, name
            assert res["registers"] <= min(255, 65536 // cfg.threads), (arch, name, res)
            limit = 0 if copy_width(conv_geometry(task).cg) == 8 else 64
            assert res["stack_bytes"] <= limit and res["spills"] <= limit, (arch, name, res)


@needs_nvcc
def test_nvcc_compiles_without_spills(cases, tmp_path):
    cubins = compile_cubins(sources(cases), ARCHS, tmp_path, include_dirs=[CUDA_INCLUDE_DIR],
                            ptx=False, keep_logs=True)
    check_ptxas(cases, cubins)


@pytest.mark.slow
def test_every_config_in_emulator_and_nvcc(tmp_path):
    cases = build_cases(SPACE)
    run_all(cases)
    if NVCC is not None:
        cubins = compile_cubins(sources(cases, units=4), ("sm_80", "sm_90"), tmp_path,
                                ptx=False, include_dirs=[CUDA_INCLUDE_DIR], keep_logs=True)
        check_ptxas(cases, cubins)
