"""The fused attention kernel (hidetc/schedules/cuda/attention.py) on awkward shapes:
query rows past one 64-row block and not a multiple of 16, keys past one 64-key tile
and not a multiple of 8, head sizes below, between and at the powers of two (8, 24, 40,
64, 128), broadcast batch dims and score operands (an additive mask, a boolean causal
mask, scale by Div and Mul), 2-D operands; built, lowered, compiled by nvcc for sm_80
and sm_90 (no spills beyond a few bytes) and run in the emulator against the
FusedAttention reference (the unfused ops' numerics, float16).

Tolerance: the kernel rounds the scores and score steps as the reference does, but its
softmax is the online one (rescaled partial sums) and P is rounded to f16 before P V,
so elements may differ by a few f16 ulps of the output: every element within 4e-3 of
the reference scaled by max(1, the output's RMS), and the norm-wise error within the
documented f16 tolerance 1e-2. The emulator also runs each kernel with its blocks and
threads in reverse order, and with its shared-memory accesses tracked per barrier
interval (the double-buffered K/V tiles): the same bits, no race."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from helpers import targets
from helpers.kernel_device import kernel_module

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.runtime.emulator import EmulatedModule
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources
from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType
from hidetc.graph.ops import get_op
from hidetc.schedules.cuda import build_kernel, supports
from hidetc.schedules.cuda.attention import build_attention
from hidetc.tir.pipeline import lower

F16 = "float16"
CAUSAL = ("where", 0, -65504.0)


def attention_task(q, kt, v, extras=(), score=()) -> Task:
    types = [TensorType(F16, q), TensorType(F16, kt), TensorType(F16, v)]
    types += [TensorType(dtype, shape) for dtype, shape in extras]
    (out,) = get_op("FusedAttention").infer(types, {"score": score}, [None] * len(types))
    return Task("FusedAttention", tuple(types), (out,), (("score", score),),
                (None,) * len(types))


CASES = [
    attention_task((1, 2, 16, 16), (1, 2, 16, 16), (1, 2, 16, 16), [(F16, (1, 1, 1, 16))],
                   (("div", 4.0), ("add", 0))),
    attention_task((2, 3, 70, 24), (2, 3, 24, 130), (2, 3, 130, 40), [("bool", (1, 1, 70, 130))],
                   (("div", 5.0), CAUSAL)),
    attention_task((5, 13), (13, 9), (9, 7)),
    attention_task((1, 1, 129, 64), (1, 1, 64, 100), (1, 1, 100, 64), [(F16, (1, 1, 129, 1))],
                   (("mul", 0.125), ("add", 0))),
    attention_task((2, 1, 33, 128), (1, 4, 128, 65), (2, 4, 65, 128), [], (("div", 11.3),)),
    attention_task((1, 2, 8, 8), (1, 2, 8, 3), (1, 2, 3, 8), [("bool", (3,)), (F16, (1, 2, 8, 3))],
                   (("where", 0, -30000.0), ("add", 1))),
    attention_task((1, 0, 16, 16), (1, 0, 16, 16), (1, 0, 16, 16)),
]


def _inputs(task: Task, rng) -> list[np.ndarray]:
    out = []
    for t in task.inputs:
        if t.dtype == "bool":
            mask = rng.random(t.shape) < 0.7
            if mask.ndim:
                mask[..., 0] = True          # every row keeps a key
            out.append(mask)
        else:
            out.append(rng.uniform(-2, 2, t.shape).astype(np.float16))
    return out


@pytest.fixture(scope="module")
def built():
    return [(task, lower(build_attention(task, f"att{i}"))) for i, task in enumerate(CASES)]


def test_kernels_match_the_reference_in_the_emulator(built):
    module = kernel_module({"attention": print_cuda_module([fn for _, fn in built])})
    rng = np.random.default_rng(0)
    for task, fn in built:
        ins = _inputs(task, rng)
        ref = get_op("FusedAttention").reference(ins, dict(task.attrs))[0].astype(np.float32)
        out = np.full(task.outputs[0].shape, np.nan, np.float16)
        module.launch(fn.name, fn.attr("grid"), fn.attr("block"), ins + [out])
        got = out.astype(np.float32)
        what = f"{fn.name}: {task.signature()} {dict(task.attrs)}"
        if ref.size == 0:
            continue
        scale = max(1.0, float(np.sqrt(np.mean(ref * ref))))
        assert np.abs(got - ref).max() <= 4e-3 * scale, (what, np.abs(got - ref).max())
        assert np.linalg.norm(got - ref) <= 1e-2 * np.linalg.norm(ref), what
        if isinstance(module, EmulatedModule):
            again = np.full_like(out, np.nan)
            module.launch(fn.name, fn.attr("grid"), fn.attr("block"), ins + [again],
                          reverse=True)
            assert np.array_equal(out, again), what
            # the double-buffered K/V pipeline: no shared-memory race between barriers
            # (a copy into a stage still being read), nothing read before it landed
            raced = np.full_like(out, np.nan)
            module.launch(fn.name, fn.attr("grid"), fn.attr("block"), ins + [raced],
                          races=True)
            assert np.array_equal(out, raced), what


def test_kv_tiles_are_double_buffered_where_two_stages_fit(built):
    """Heads up to 64: the next K/V tile's copies are in flight while this one
    computes (wait_group(1)); a 128 head (two stages would pass 48 KiB) waits for each."""
    for task, fn in built:
        if task.outputs[0].size == 0:           # (an empty kernel)
            continue
        source = print_cuda_module([fn])
        pipelined = "hidetc_cp_async_wait_group(1)" in source
        head = max(task.inputs[0].shape[-1], task.inputs[2].shape[-1])
        assert pipelined == (head <= 64), (fn.name, task.signature())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_for_sm80_and_sm90(built, tmp_path):
    cubins = compile_cubins({"attention": print_cuda_module([fn for _, fn in built])},
                            ("sm_80", "sm_90"), tmp_path, include_dirs=[CUDA_INCLUDE_DIR],
                            ptx=False, keep_logs=True)
    for arch, units in cubins.items():
        report = {}
        for path in units.values():
            report.update(ptxas_resources(path))
        assert set(report) == {fn.name for _, fn in built}
        for name, res in report.items():
            assert res["registers"] <= 255 and res["spills"] <= 16, (arch, name, res)
            assert res["shared_bytes"] <= 48 * 1024, (arch, name, res)


def test_the_rule_is_registered_and_refuses_f32():
    assert supports("FusedAttention")
    assert build_kernel(CASES[0], "k", targets.CUDA).attr("block") == (128, 1, 1)
    f32 = Task("FusedAttention", tuple(TensorType("float32", t.shape) for t in CASES[2].inputs),
               (TensorType("float32", CASES[2].outputs[0].shape),), (("score", ()),),
               (None,) * 3)
    with pytest.raises(ValueError, match="float16"):
        build_attention(f32, "k")
