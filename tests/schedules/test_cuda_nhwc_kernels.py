"""The channels-last CUDA rules `choose_layout` relies on for cuda f16 besides the
tensor-core conv: the depthwise ConvNHWC kernel (hidetc/schedules/cuda/depthwise_nhwc.py)
and MaxPoolNHWC / AveragePoolNHWC (hidetc/schedules/cuda/pool.py).

Each case is built, lowered and printed into one translation unit, compiled by nvcc for
sm_80 (no spills, registers <= 255) and run in the emulator against the ops' float64
numpy reference on the same (rounded) inputs. Shapes cover every vector width (C = 16,
24 -> 8 halves, 12 -> 4, 6 -> 2, 3 -> scalar; float32 4 and 2; float64 2), the
preloaded and the per-use weights (T = 25 taps of 8 halves is over PRELOAD_BYTES),
strides, asymmetric pads, dilation, bias, batch 2, 1x1, and pools with ceil_mode,
count_include_pad and dilation.

Tolerances (every element; an unwritten output is a NaN sentinel and fails, as does a
write past the output, a guard region after it):
- float16: inputs in [-1, 1], products exact in float32, T terms accumulated in float32
  and rounded once: |got - ref| <= 2^-11 |ref| (the rounding) + T^2 2^-24 (the sums);
- float32: |got - ref| <= 2^-23 |ref| + T^2 2^-24 (the products rounded too: fma);
- float64 and MaxPool: equal up to the same bound with 2^-52 (max is exact).
"""
from __future__ import annotations

import numpy as np
import pytest
from helpers import targets
from helpers.kernel_device import kernel_module

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.toolchain.nvcc import compile_cubins, find_nvcc, ptxas_resources
from hidetc.compute.task import Task
from hidetc.errors import ToolchainError
from hidetc.graph.ir import TensorType
from hidetc.graph.ops import get_op
from hidetc.schedules import cuda
from hidetc.schedules.cuda import depthwise_nhwc
from hidetc.tir.pipeline import lower

try:
    NVCC = find_nvcc()
except ToolchainError:
    NVCC = None
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")
F16, F32, F64 = "float16", "float32", "float64"

# (NHWC input, KH x KW, strides, pads (t, l, b, r), dilations, bias, dtype)
DEPTHWISE = (
    ((1, 7, 7, 16), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, F16),
    ((2, 9, 8, 24), (3, 3), (2, 2), (1, 0, 1, 2), (1, 1), False, F16),
    ((1, 6, 6, 12), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, F16),
    ((1, 5, 6, 6), (3, 3), (2, 1), (0, 1, 1, 1), (1, 1), False, F16),
    ((1, 5, 5, 3), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, F16),
    ((1, 11, 11, 8), (5, 5), (2, 2), (2, 2, 2, 2), (1, 1), True, F16),
    ((1, 7, 7, 8), (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), False, F16),
    ((1, 4, 4, 32), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), True, F16),
    ((1, 7, 7, 16), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, F32),
    ((1, 4, 5, 6), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, F32),
    ((1, 5, 5, 4), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, F64),
)
# (op, NHWC input, attrs, dtype)
POOLS = (
    ("MaxPoolNHWC", (1, 9, 9, 16), {"kernel_shape": (3, 3), "strides": (2, 2),
                                    "pads": (1, 1, 1, 1)}, F16),
    ("MaxPoolNHWC", (2, 8, 7, 5), {"kernel_shape": (2, 2), "strides": (2, 2),
                                   "ceil_mode": 1}, F32),
    ("AveragePoolNHWC", (1, 7, 7, 24), {"kernel_shape": (3, 3), "strides": (1, 1),
                                        "pads": (1, 1, 1, 1)}, F16),
    ("AveragePoolNHWC", (1, 6, 6, 8), {"kernel_shape": (3, 3), "strides": (1, 1),
                                       "pads": (1, 1, 1, 1), "count_include_pad": 1}, F16),
    ("AveragePoolNHWC", (1, 9, 9, 4), {"kernel_shape": (2, 2), "strides": (2, 2),
                                       "dilations": (2, 2), "pads": (0, 0, 1, 1)}, F32),
)
EPS = {F16: 2.0 ** -11, F32: 2.0 ** -23, F64: 2.0 ** -52}     # the result's rounding
SUM_EPS = {F16: 2.0 ** -24, F32: 2.0 ** -24, F64: 2.0 ** -52}  # the accumulation's


def depthwise_task(shape, kernel, strides, pads, dilations, bias, dtype) -> Task:
    c = shape[3]
    x, w = TensorType(dtype, shape), TensorType(dtype, (c,) + tuple(kernel) + (1,))
    b = TensorType(dtype, (c,)) if bias else None
    attrs = {"strides": strides, "pads": pads, "dilations": dilations, "group": c}
    (out,) = get_op("ConvNHWC").infer([x, w, b], attrs, [None] * 3)
    return Task("ConvNHWC", (x, w, b), (out,), tuple(sorted(attrs.items())), (None,) * 3)


def pool_task(op, shape, attrs, dtype) -> Task:
    x = TensorType(dtype, shape)
    (out,) = get_op(op).infer([x], attrs, [None])
    return Task(op, (x,), (out,), tuple(sorted(attrs.items())), (None,))


def all_cases() -> list[tuple[Task, object, int]]:
    """(task, lowered kernel, taps) for every case."""
    cases = []
    for i, case in enumerate(DEPTHWISE):
        task = depthwise_task(*case)
        fn = lower(cuda.build_kernel(task, f"dw{i}", targets.CUDA))
        cases.append((task, fn, case[1][0] * case[1][1]))
    for i, (op, shape, attrs, dtype) in enumerate(POOLS):
        task = pool_task(op, shape, attrs, dtype)
        taps = attrs["kernel_shape"][0] * attrs["kernel_shape"][1]
        cases.append((task, lower(cuda.build_kernel(task, f"pool{i}", targets.CUDA)), taps))
    return cases


@pytest.fixture(scope="module")
def cases():
    return all_cases()


def run_case(module, task: Task, fn, taps: int, rng) -> None:
    dtype = task.outputs[0].dtype
    arrays = [rng.uniform(-1, 1, t.shape).astype(dtype) if t is not None else None
              for t in task.inputs]
    wide = [a.astype(np.float64) if a is not None else None for a in arrays]
    (ref,) = get_op(task.op).reference(wide, dict(task.attrs))
    size = ref.size
    storage = np.full(size + 64, 7.0, dtype)
    storage[:size] = np.nan
    out = storage[:size].reshape(ref.shape)
    module.launch(fn.name, fn.attr("grid"), fn.attr("block"),
                  [a for a in arrays if a is not None] + [out])
    what = f"{fn.name}: {task.signature()} {dict(task.attrs)}"
    assert (storage[size:] == 7.0).all(), f"{what}: wrote past the output"
    got = out.astype(np.float64)
    bound = EPS[dtype] * np.abs(ref) + taps * taps * SUM_EPS[dtype]
    assert np.isfinite(got).all(), f"{what}: outputs left unwritten"
    assert (np.abs(got - ref) <= bound).all(), f"{what}: max error {np.abs(got - ref).max()}"


def test_kernels_in_emulator(cases):
    module = kernel_module({"nhwc": print_cuda_module([c[1] for c in cases])})
    rng = np.random.default_rng(0)
    for task, fn, taps in cases:
        run_case(module, task, fn, taps, rng)


@needs_nvcc
def test_nvcc_compiles_without_spills(cases, tmp_path):
    cubins = compile_cubins({"nhwc": print_cuda_module([c[1] for c in cases])}, ("sm_80",),
                            tmp_path, include_dirs=[CUDA_INCLUDE_DIR], ptx=False,
                            keep_logs=True)
    report = {}
    for path in cubins["sm_80"].values():
        report.update(ptxas_resources(path))
    assert set(report) == {fn.name for _, fn, _ in cases}
    for name, res in report.items():
        assert res["registers"] <= 255 and res["spills"] == 0, (name, res)


def test_depthwise_dispatch_and_vectors():
    task = depthwise_task(*DEPTHWISE[0])
    assert depthwise_nhwc.is_depthwise(task)
    assert cuda.kernel_choice(task, targets.CUDA) == (None, None)
    dense = Task("ConvNHWC", (TensorType(F16, (1, 7, 7, 16)), TensorType(F16, (8, 3, 3, 16))),
                 (TensorType(F16, (1, 5, 5, 8)),), (), (None, None))
    assert not depthwise_nhwc.is_depthwise(dense)
    assert cuda.kernel_choice(dense, targets.CUDA)[0] is cuda.TEMPLATES["ConvNHWC"]
    assert [depthwise_nhwc.vector_width(c, F16) for c in (96, 12, 6, 3)] == [8, 4, 2, 1]
    assert [depthwise_nhwc.vector_width(c, F32) for c in (96, 6)] == [4, 2]
    # 16-byte vector copies of 8 channels: weights preloaded for 3x3, per use for 5x5
    src = print_cuda_module([lower(cuda.build_kernel(task, "dw", targets.CUDA))])
    assert src.count("hidetc_copy16") == 9 + 9 + 1      # weights, input taps, output
    five = depthwise_task(*DEPTHWISE[5])
    assert print_cuda_module([lower(cuda.build_kernel(five, "dw5", targets.CUDA))]).count(
        "hidetc_copy16") == 25 + 1
