"""The cpu bf16 GEMM templates (`--precision bf16`): MatMul and one-group Conv/ConvNHWC
marked compute="bfloat16" against the op's reference (the operands rounded to bf16,
summed in f32), on both block helpers (AMX-BF16 tiles, AVX512_BF16 `vdpbf16ps`) where
this host has them (skipped with the reason where not), with weights packed at
compile time and at run time, over every config of the space on awkward shapes, and
with the task shapes of other core counts. Inputs sit between NaN guards and the output
between sentinels (`test_cpu_templates._check`'s scheme), so a read or write out of
bounds shows."""
from __future__ import annotations

import ctypes
import dataclasses

import ml_dtypes
import numpy as np
import pytest
from helpers.tasks import conv_task, matmul_task, nhwc_task

from hidetc import cpu_isa
from hidetc.backends.codegen.c import print_c_module
from hidetc.backends.codegen.c_bf16 import BF16_SOURCE
from hidetc.backends.toolchain.gcc import build_shared_library
from hidetc.compute.task import Task
from hidetc.driver.backend import CpuBackend
from hidetc.graph.ops.registry import get_op
from hidetc.schedules.catalog import template_spaces
from hidetc.schedules.cpu import (
    BF16_TEMPLATES,
    TEMPLATES,
    build_kernel,
    conv_bf16,
    kernel_choice,
    matmul_bf16,
)
from hidetc.schedules.cpu.gemm_bf16 import Bf16Config, bf16_space, block_call, pack_weights
from hidetc.target import CpuTarget
from hidetc.tir.intrinsics import BF16_AMX, BF16_DP
from hidetc.tir.pipeline import lower

HOST = cpu_isa.host_features()
PATHS = [pytest.param(("avx512_bf16", "amx_bf16"), id="amx",
                      marks=pytest.mark.skipif("amx_bf16" not in HOST,
                                               reason="this CPU lacks AMX-BF16")),
         pytest.param(("avx512_bf16",), id="vdpbf16ps",
                      marks=pytest.mark.skipif("avx512_bf16" not in HOST,
                                               reason="this CPU lacks AVX512_BF16"))]
RNG = np.random.default_rng(7)
GUARD = 64


def target(features, cores: int = 2) -> CpuTarget:
    return CpuTarget(isa="avx512", cores=cores, features=features)


def bf16(task: Task) -> Task:
    return dataclasses.replace(task, attrs=tuple(sorted((*task.attrs,
                                                         ("compute", "bfloat16")))))


MODULES = {"MatMul": matmul_bf16, "Conv": conv_bf16, "ConvNHWC": conv_bf16}
MM = [((7,), (7, 13)), ((13, 7), (7,)), ((1, 100), (100, 1)), ((33, 64), (64, 100)),
      ((2, 3, 7, 13), (3, 13, 64)), ((5, 1, 13, 7), (1, 4, 7, 13)), ((70, 300), (300, 47)),
      ((1, 1), (1, 1)), ((129, 40), (40, 33)), ((33, 1100), (1100, 40))]  # K: 2 AMX blocks
CONV = [((1, 3, 11, 13), (5, 3, 3, 3), True, {"pads": [1, 1, 1, 1]}),
        ((2, 4, 17, 10), (6, 4, 3, 2), False,
         {"strides": [2, 3], "dilations": [2, 1], "pads": [2, 0, 1, 2]}),
        ((1, 16, 7, 9), (13, 16, 1, 1), True, {}),
        ((1, 3, 23, 19), (8, 3, 7, 7), True, {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
        ((1, 64, 5, 6), (40, 64, 3, 3), True, {"pads": [1, 1, 1, 1]}),
        ((2, 5, 12, 12), (7, 5, 3, 3), True, {"strides": [2, 2], "pads": [0, 1, 2, 0]}),
        # NHWC gather chunks of 16 and 8 channels (C = 48, 24), a 1x7 and a 7x1 tap row
        ((1, 48, 9, 10), (20, 48, 1, 7), True, {"pads": [0, 3, 0, 3]}),
        ((1, 24, 11, 6), (9, 24, 7, 1), False, {"pads": [3, 0, 3, 0], "strides": [2, 1]})]


def reference(task: Task, inputs: list[np.ndarray]) -> np.ndarray:
    return get_op(task.op).reference(inputs, dict(task.attrs))[0]


def run(tmp_path, cases, features, prepacked: bool) -> None:
    """Build every (task, config, target) into one library, run each against the
    reference (inputs between NaN guards, output between sentinels)."""
    fns = [(task, cfg, MODULES[task.op].TEMPLATE.build(task, cfg, f"k{i}", tgt,
                                                       prepacked=prepacked))
           for i, (task, cfg, tgt) in enumerate(cases)]
    sources = {fn.name: print_c_module([lower(fn)]) for _, _, fn in fns}
    lib = ctypes.CDLL(str(build_shared_library(sources, tmp_path / "lib.so")))
    for task, cfg, fn in fns:
        inputs = [RNG.standard_normal(t.shape).astype(np.float32) for t in task.inputs]
        passed = list(inputs)
        if prepacked:
            passed[1] = MODULES[task.op].prepack_weights(task, cfg, inputs[1]).view(np.uint16)
        guarded = [np.pad(x.ravel(), GUARD, constant_values=np.nan if x.dtype == np.float32
                          else 0x7fc0) for x in passed]
        size = task.outputs[0].size
        out = np.full(size + 2 * GUARD, 7.0, np.float32)
        out[GUARD:GUARD + size] = np.nan
        getattr(lib, fn.name)(*[g[GUARD:].ctypes.data_as(ctypes.c_void_p) for g in guarded],
                              out[GUARD:].ctypes.data_as(ctypes.c_void_p))
        what = f"{task.signature()} {dict(task.attrs)} {cfg} {features}"
        assert (out[:GUARD] == 7.0).all() and (out[GUARD + size:] == 7.0).all(), what
        ref = reference(task, inputs).reshape(-1)
        scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1.0)
        np.testing.assert_allclose(out[GUARD:GUARD + size], ref, rtol=1e-5,
                                   atol=1e-5 * scale, err_msg=what)


@pytest.mark.parametrize("features", PATHS)
@pytest.mark.parametrize("prepacked", [False, True])
def test_matmul_bf16_on_awkward_shapes(tmp_path, features, prepacked):
    tasks = [bf16(matmul_task(a, b)) for a, b in MM]
    if prepacked:
        tasks = [t for t in tasks if matmul_bf16.can_prepack(t, Bf16Config())]
    tgt = target(features)
    cases = [(t, matmul_bf16.TEMPLATE.default(t, tgt), tgt) for t in tasks]
    run(tmp_path, cases, features, prepacked)


@pytest.mark.parametrize("features", PATHS)
def test_every_bf16_config_and_other_core_counts(tmp_path, features):
    """Every config of the space on one ragged shape (M, N, K none a multiple of the
    tiles), and the defaults shaped for 1 to 128 cores."""
    task = bf16(matmul_task((2, 45, 70), (70, 83)))
    cases = [(task, cfg, target(features)) for cfg in bf16_space()]
    for cores in (1, 3, 16, 64, 128):
        tgt = target(features, cores)
        cases.append((task, matmul_bf16.TEMPLATE.default(task, tgt), tgt))
    run(tmp_path, cases, features, prepacked=True)


@pytest.mark.parametrize("features", PATHS)
@pytest.mark.parametrize("prepacked", [False, True])
def test_conv_bf16_nchw_and_nhwc(tmp_path, features, prepacked):
    tgt = target(features)
    cases = []
    for x, w, bias, attrs in CONV:
        for make in (conv_task, nhwc_task):
            task = bf16(make(x, w, bias, **attrs))
            cases.append((task, conv_bf16.TEMPLATE.default(task, tgt), tgt))
    # OC = 40 in tiles of 32 columns: the gather runs once before the tasks, not per task
    wide = [t for t, _, _ in cases if t.outputs[0].shape[1 if t.op == "Conv" else 3] == 40]
    assert len(wide) == 2
    cases += [(t, Bf16Config(32, 32), tgt) for t in wide]
    run(tmp_path, cases, features, prepacked)


def test_the_reference_rounds_the_operands_only_when_marked():
    a = np.float32([[1 + 2 ** -10]])       # not a bf16: rounds to 1.0
    task = matmul_task((1, 1), (1, 1))
    assert reference(task, [a, np.float32([[1.0]])])[0, 0] == a[0, 0]
    assert reference(bf16(task), [a, np.float32([[1.0]])])[0, 0] == 1.0


def test_weights_pack_as_bf16_pairs_in_panels():
    """`pack_weights`: [N/16][Kp/2][16][2] bf16, pairs of consecutive k per column, zero
    past K and N -- half the bytes of the f32 matrix (plus the padding)."""
    b = RNG.standard_normal((70, 20)).astype(np.float32)
    packed = pack_weights(b)
    assert packed.dtype == ml_dtypes.bfloat16 and packed.shape == (2, 48, 16, 2)
    back = packed.astype(np.float32).transpose(1, 3, 0, 2).reshape(96, 32)
    np.testing.assert_array_equal(back[:70, :20], b.astype(ml_dtypes.bfloat16)
                                  .astype(np.float32))
    assert not back[70:].any() and not back[:, 20:].any()


def test_selection_the_block_helper_and_what_a_module_carries():
    """A marked anchor takes its bf16 template; the target's features pick the helper;
    only a module that calls a helper carries their C."""
    task = matmul_task((8, 16), (16, 32))
    tgt = target(("avx512_bf16", "amx_bf16"))
    assert kernel_choice(bf16(task), tgt)[0] is BF16_TEMPLATES["MatMul"]
    assert kernel_choice(task, tgt)[0] is TEMPLATES["MatMul"]
    assert block_call(tgt) == BF16_AMX and block_call(target(("avx512_bf16",))) == BF16_DP
    with pytest.raises(Exception, match="needs AVX512_BF16"):
        block_call(target(()))
    f32 = print_c_module([lower(build_kernel(task, "f", tgt))])
    b16 = print_c_module([lower(build_kernel(bf16(task), "b", tgt))])
    assert BF16_SOURCE not in f32 and BF16_SOURCE in b16 and BF16_AMX + "(" in b16


def test_the_catalog_lists_the_bf16_templates_without_a_depthwise_row():
    rows = template_spaces([CpuBackend().space_set()])
    bf16 = {(r.template, r.variant): r.configs for r in rows if r.precision == "bf16"}
    assert bf16 == {("cpu.matmul.bf16", ""): 20, ("cpu.conv.bf16", "gemm"): 20,
                    ("cpu.conv.bf16", ""): 20}
