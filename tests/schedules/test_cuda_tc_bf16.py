"""The tensor-core templates on bfloat16 operands (`--precision bf16` on cuda): the
MatMul (`matmul_tc`, split-K included), the few-row GEMV (`matmul_gemv`), the NHWC
implicit-GEMM convolution (`conv_tc`) and the fused attention kernel, each on a few
awkward shapes (tile tails, K not a multiple of 8: the 8-byte, 4-byte and scalar copy
paths, batch broadcast, groups, bias, stride, padding, masks), built, lowered, compiled
by nvcc for sm_80 and sm_90 (`mma...bf16` must assemble; no spills on the 16-byte path)
and run in the emulator -- or on the GPU with HIDETC_KERNEL_DEVICE=gpu (the GPU check's
template_tests step) -- on bfloat16 inputs.

References, from the same bfloat16 inputs: the GEMMs in float64 (the kernels multiply
exact bf16 products, accumulate in f32 and round once to bf16, whose unit roundoff is
2^-8 = 3.9e-3: every element within 8e-3 |ref| plus the f32 accumulation's 1e-4 x the
output's RMS, norm-wise within 2^-8); the attention against the FusedAttention
reference (the unfused ops' numerics in bfloat16: scores and P rounded to bf16; the
kernel's online softmax rounds P before the division, so elements may differ by a bf16
ulp or two of the output, whose values lie in [-1, 1]: within 8e-3 x max(1, RMS), and
norm-wise within 1e-2, half the bf16 tolerance). Unwritten
outputs (NaN) and writes past the output fail; split-K kernels run again with blocks and
threads in reverse order (the same bits, counters left zero), the emulator also with its
shared-memory race checks on.
"""
from __future__ import annotations

import re
import shutil

import ml_dtypes  # noqa: F401  (the "bfloat16" dtype name)
import numpy as np
import pytest
from helpers import targets, tasks
from helpers.kernel_device import kernel_module, launch_checked

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.runtime.emulator import EmulatedModule
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources
from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType
from hidetc.graph.ops import get_op
from hidetc.schedules import cuda
from hidetc.schedules.cuda import conv_tc, matmul_gemv, matmul_tc
from hidetc.schedules.cuda.attention import build_attention
from hidetc.schedules.cuda.tc_common import TcConfig
from hidetc.tir import scratch
from hidetc.tir.pipeline import lower

BF16 = "bfloat16"
TARGET = targets.CUDA
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

# (A shape, B shape, config): tails in M, N, K; K % 8 in {4, 2, odd}; batch broadcast;
# split-K with a prime K, with an empty split, and over a batch
MATMULS = [
    ((100, 64), (64, 129), matmul_tc.DEFAULTS[0]),
    ((13, 44), (44, 24), TcConfig(32, 32, 16, 1, 1, 3)),
    ((16, 22), (22, 40), TcConfig(64, 32, 32, 2, 1, 4)),
    ((33, 13), (13, 8), TcConfig(32, 32, 16, 1, 1, 2)),
    ((2, 3, 16, 50), (3, 50, 64), TcConfig(32, 64, 16, 1, 2, 2)),
    ((13, 211), (211, 24), TcConfig(32, 32, 16, 1, 1, 3, splits=3)),
    ((5, 8), (8, 7), TcConfig(32, 32, 16, 1, 1, 2, splits=4)),
    ((2, 16, 96), (96, 40), TcConfig(32, 32, 32, 1, 1, 3, splits=2)),
]
GEMVS = [((1, 200), (200, 72)), ((3, 2, 40), (40, 13))]
# (NHWC input, OC, kernel, strides, pads (t, l, b, r), dilations, group, bias, config)
CONVS = [
    ((1, 5, 5, 8), 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, False, matmul_tc.DEFAULTS[-1]),
    ((2, 7, 7, 16), 24, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, True, matmul_tc.DEFAULTS[-1]),
    ((1, 9, 9, 24), 40, (3, 3), (2, 2), (1, 0, 1, 2), (1, 1), 1, True,
     TcConfig(32, 32, 32, 1, 1, 3)),
    ((2, 5, 5, 32), 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2, True,
     TcConfig(32, 32, 32, 1, 1, 3, splits=2)),
    ((1, 5, 5, 12), 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True,
     TcConfig(32, 32, 16, 1, 1, 2)),
    ((1, 7, 7, 40), 8, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1, False,
     TcConfig(64, 32, 16, 2, 1, 2, splits=5)),
]


def attention_task(q, kt, v, extras=(), score=()) -> Task:
    types = [TensorType(BF16, q), TensorType(BF16, kt), TensorType(BF16, v)]
    types += [TensorType(dtype, shape) for dtype, shape in extras]
    (out,) = get_op("FusedAttention").infer(types, {"score": score}, [None] * len(types))
    return Task("FusedAttention", tuple(types), (out,), (("score", score),),
                (None,) * len(types))


ATTENTIONS = [
    attention_task((2, 3, 70, 24), (2, 3, 24, 130), (2, 3, 130, 40),
                   [("bool", (1, 1, 70, 130))], (("div", 5.0), ("where", 0, -3.0e38))),
    attention_task((1, 1, 129, 64), (1, 1, 64, 100), (1, 1, 100, 64),
                   [(BF16, (1, 1, 129, 1))], (("mul", 0.125), ("add", 0))),
    attention_task((5, 13), (13, 9), (9, 7)),
]


def conv_task(shape, oc, kernel, strides, pads, dilations, group, bias) -> Task:
    x = TensorType(BF16, shape)
    w = TensorType(BF16, (oc,) + tuple(kernel) + (shape[3] // group,))
    b = TensorType(BF16, (oc,)) if bias else None
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": group}
    (out,) = get_op("ConvNHWC").infer([x, w, b], attrs, [None] * 3)
    return Task("ConvNHWC", (x, w, b), (out,), tuple(sorted(attrs.items())), (None,) * 3)


def _build() -> list[tuple[str, Task, object]]:
    """(kind, task, lowered kernel) of every case."""
    out = []
    for i, (a, b, cfg) in enumerate(MATMULS):
        task = tasks.matmul_task(a, b, BF16)
        out.append(("gemm", task, lower(matmul_tc.TEMPLATE.build(task, cfg, f"mm{i}", TARGET))))
    for i, (a, b) in enumerate(GEMVS):
        task = tasks.matmul_task(a, b, BF16)
        cfg = matmul_gemv.TEMPLATE.default(task, TARGET)
        out.append(("gemm", task, lower(matmul_gemv.TEMPLATE.build(task, cfg, f"gemv{i}",
                                                                   TARGET))))
    for i, case in enumerate(CONVS):
        task = conv_task(*case[:-1])
        out.append(("gemm", task, lower(conv_tc.TEMPLATE.build(task, case[-1], f"conv{i}",
                                                               TARGET))))
    for i, task in enumerate(ATTENTIONS):
        out.append(("attention", task, lower(build_attention(task, f"att{i}"))))
    return out


@pytest.fixture(scope="module")
def built():
    return _build()


def _sources(built) -> dict[str, str]:
    return {f"bf16_unit{u}": print_cuda_module([fn for _, _, fn in built[u::2]])
            for u in range(2)}


def _inputs(task: Task, rng) -> list:
    out = []
    for t in task.inputs:
        if t is None:
            out.append(None)
        elif t.dtype == "bool":
            mask = rng.random(t.shape) < 0.7
            mask[..., 0] = True                      # every row keeps a key
            out.append(mask)
        else:
            out.append(rng.uniform(-1, 1, t.shape).astype(BF16))
    return out


def _reference(kind: str, task: Task, arrays: list) -> np.ndarray:
    if kind == "attention":
        return get_op("FusedAttention").reference(arrays, dict(task.attrs))[0].astype(np.float64)
    wide = [a.astype(np.float64) if a is not None else None for a in arrays]
    return np.asarray(get_op(task.op).reference(wide, dict(task.attrs))[0], np.float64)


def _check(kind: str, task: Task, got: np.ndarray, ref: np.ndarray, what: str) -> None:
    scale = float(np.sqrt(np.mean(ref * ref))) if ref.size else 0.0
    error = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    if kind == "attention":
        assert np.abs(got - ref).max(initial=0) <= 8e-3 * max(1.0, scale), what
        assert error <= 1e-2, (what, error)
        return
    bound = 8e-3 * np.abs(ref) + 1e-4 * scale
    assert (np.abs(got - ref) <= bound).all(), (what, np.abs(got - ref).max())
    assert error <= 2.0 ** -8, (what, error)


def test_every_kernel_in_bfloat16_against_its_reference(built):
    module = kernel_module(_sources(built))
    rng = np.random.default_rng(0)
    for kind, task, fn in built:
        what = f"{fn.name}: {task.signature()} {dict(task.attrs)}"
        arrays = _inputs(task, rng)
        ref = _reference(kind, task, arrays)
        storage = np.full(ref.size + 64, 7.0, BF16)
        storage[:ref.size] = np.nan                   # anything unwritten fails
        out = storage[:ref.size].reshape(ref.shape)
        args = [a for a in arrays if a is not None] + [out]
        launch_checked(module, fn, args)             # split-K: again, in reverse order
        assert (storage[ref.size:] == 7.0).all(), f"{what}: wrote past the output"
        _check(kind, task, out.astype(np.float64), ref, what)
        if isinstance(module, EmulatedModule):        # with the race checks: same bits
            again = np.full_like(out, np.nan)
            module.launch(fn.name, fn.attr("grid"), fn.attr("block"),
                          args[:-1] + [again] + scratch.zero_arrays(fn), races=True)
            assert np.array_equal(out.view(np.uint16), again.view(np.uint16)), what


def test_the_mma_and_buffers_are_bfloat16(built):
    source = "".join(_sources(built).values())
    assert "hidetc_mma_m16n8k16_bf16f32" in source and "_f16f32" not in source
    assert not re.search(r"\bhalf\b", source)
    for kind, task, fn in built:
        floats = {p.dtype for p in fn.params if p.dtype.startswith(("float", "bfloat"))}
        assert floats <= {BF16, "float32"} and BF16 in floats, fn.name   # f32: split-K's


def test_dispatch_takes_the_tensor_cores_for_bfloat16():
    mm = tasks.matmul_task((64, 48), (48, 32), BF16)
    assert cuda.template_for(mm) is matmul_tc.TEMPLATE
    assert matmul_tc.check_task(mm) == BF16
    assert matmul_gemv.applies(tasks.matmul_task((1, 48), (48, 32), BF16))
    assert conv_tc.check_task(conv_task(*CONVS[0][:-1])) == BF16
    mixed = Task("MatMul", (TensorType(BF16, (4, 8)), TensorType("float16", (8, 4))),
                 (TensorType(BF16, (4, 4)),), (), (None, None))
    with pytest.raises(ValueError, match="float16, bfloat16"):
        matmul_tc.check_task(mixed)
    assert {"f16", "bf16"} <= set(matmul_tc.TEMPLATE.precisions) & \
        set(conv_tc.TEMPLATE.precisions) & set(matmul_gemv.TEMPLATE.precisions)


@needs_nvcc
def test_nvcc_compiles_the_bf16_kernels(built, tmp_path):
    """sm_80 and sm_90: ptxas accepts the bf16 mma; no spills but on the scalar and
    narrow copy paths (a few bytes there, as for f16)."""
    cubins = compile_cubins(_sources(built), ("sm_80", "sm_90"), tmp_path,
                            include_dirs=[CUDA_INCLUDE_DIR], ptx=False, keep_logs=True)
    for arch, units in cubins.items():
        report = {}
        for path in units.values():
            report.update(ptxas_resources(path))
        assert set(report) == {fn.name for _, _, fn in built}
        for name, res in report.items():
            assert res["registers"] <= 255 and res["spills"] <= 64, (arch, name, res)
