"""The cpu int8 templates (quantized models): MatMulInteger and ConvInteger /
ConvIntegerNHWC against the ops' exact integer references, on every block helper this
host runs (AMX-INT8, AVX512_VNNI, AVX-VNNI, the exact AVX2 `vpmaddwd` path; skipped with the
reason where the CPU lacks one), uint8 and int8 operands, with and without zero points
(per tensor and per column / channel), weights packed at compile time and at run time,
every config of the space on a ragged shape, the extremes of both types (the AVX2 path
must not saturate where `vpmaddubsw` would), and grouped / depthwise convolutions.
Inputs sit between guards and the output between sentinels, so a read or write out of
bounds shows."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from hidetc import cpu_isa
from hidetc.backends.codegen.c import print_c_module
from hidetc.backends.codegen.c_int8 import INT8_SOURCE
from hidetc.backends.toolchain.gcc import build_shared_library
from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType, freeze_attr
from hidetc.graph.ops.registry import get_op
from hidetc.schedules.cpu import build_kernel, conv_int8, kernel_choice, matmul_int8
from hidetc.schedules.cpu.gemm_int8 import Int8Config, block_call, int8_space, pack_weights
from hidetc.target import CpuTarget
from hidetc.tir.intrinsics import INT8_AMX, INT8_AVX2, INT8_AVXVNNI, INT8_VNNI
from hidetc.tir.pipeline import lower

FLAGS = cpu_isa.host_flags()
PATHS = [pytest.param(("amx_int8", "avx512_vnni"), id="amx",
                      marks=pytest.mark.skipif("amx_int8" not in FLAGS,
                                               reason="this CPU lacks AMX-INT8")),
         pytest.param(("avx512_vnni",), id="vnni",
                      marks=pytest.mark.skipif("avx512_vnni" not in FLAGS,
                                               reason="this CPU lacks AVX512_VNNI")),
         pytest.param(("avx_vnni",), id="avxvnni",
                      marks=pytest.mark.skipif("avx_vnni" not in FLAGS,
                                               reason="this CPU lacks AVX-VNNI")),
         pytest.param((), id="avx2")]
# the run-time-packed and every-config cases on this host's own block only (the suite's
# time); the prepacked ones on every block the host runs
HOST = [pytest.param(tuple(f for f in ("amx_int8", "avx512_vnni", "avx_vnni") if f in FLAGS),
                     id="host")]
RNG = np.random.default_rng(11)
GUARD = 64
SENTINEL = -7


def target(features, cores: int = 2) -> CpuTarget:
    return CpuTarget(isa="avx512" if "avx512f" in FLAGS else "avx2", cores=cores,
                     features=features)


def matmul_task(a_shape, b_shape, a_dt="uint8", b_dt="int8", az=False, bz=None) -> Task:
    types = [TensorType(a_dt, a_shape), TensorType(b_dt, b_shape)]
    if az or bz is not None:
        types.append(TensorType(a_dt, ()) if az else None)
    if bz is not None:
        types.append(TensorType(b_dt, bz))
    out = get_op("MatMulInteger").infer(types, {}, [None] * len(types))[0]
    return Task("MatMulInteger", tuple(types), (out,), (), (None,) * len(types))


def conv_task(op, x_shape, w_shape, x_dt="uint8", w_dt="int8", xz=False, wz=None,
              **attrs) -> Task:
    types = [TensorType(x_dt, x_shape), TensorType(w_dt, w_shape)]
    if xz or wz is not None:
        types.append(TensorType(x_dt, ()) if xz else None)
    if wz is not None:
        types.append(TensorType(w_dt, wz))
    out = get_op(op).infer(types, attrs, [None] * len(types))[0]
    frozen = tuple(sorted((k, freeze_attr(v)) for k, v in attrs.items()))
    return Task(op, tuple(types), (out,), frozen, (None,) * len(types))


def values(t: TensorType, extreme: bool) -> np.ndarray:
    info = np.iinfo(t.dtype)
    if extreme:       # the corners: every product at its largest magnitude
        return RNG.choice([info.min, info.max], t.shape).astype(t.dtype)
    return RNG.integers(info.min, info.max, t.shape, endpoint=True).astype(t.dtype)


def run(tmp_path, cases, prepacked: bool, extreme: bool = False) -> None:
    """Build every (task, config, target) into one library, run each against the
    reference (inputs between guards, output between sentinels)."""
    module = {"MatMulInteger": matmul_int8, "ConvInteger": conv_int8,
              "ConvIntegerNHWC": conv_int8}
    fns = [(task, cfg, module[task.op].TEMPLATE.build(task, cfg, f"k{i}", tgt,
                                                      prepacked=prepacked))
           for i, (task, cfg, tgt) in enumerate(cases)]
    sources = {fn.name: print_c_module([lower(fn)]) for _, _, fn in fns}
    lib = ctypes.CDLL(str(build_shared_library(sources, tmp_path / "lib.so")))
    for task, cfg, fn in fns:
        inputs = [None if t is None else values(t, extreme) for t in task.inputs]
        passed = [x for x in inputs if x is not None]
        if prepacked and module[task.op].can_prepack(task, cfg):
            passed[1] = module[task.op].prepack_weights(task, cfg, inputs[1])
        guarded = [np.pad(x.ravel(), GUARD) for x in passed]
        size = task.outputs[0].size
        out = np.full(size + 2 * GUARD, SENTINEL, np.int32)
        getattr(lib, fn.name)(*[g[GUARD:].ctypes.data_as(ctypes.c_void_p) for g in guarded],
                              out[GUARD:].ctypes.data_as(ctypes.c_void_p))
        what = f"{task.signature()} {dict(task.attrs)} {cfg} {tgt_features(cases, task)}"
        assert (out[:GUARD] == SENTINEL).all() and (out[GUARD + size:] == SENTINEL).all(), what
        ref = get_op(task.op).reference(inputs, dict(task.attrs))[0].reshape(-1)
        np.testing.assert_array_equal(out[GUARD:GUARD + size], ref, err_msg=what)


def tgt_features(cases, task) -> tuple:
    return next(tgt.features for t, _, tgt in cases if t is task)


MM = [dict(a_shape=(7,), b_shape=(7, 13)), dict(a_shape=(13, 7), b_shape=(7,)),
      dict(a_shape=(1, 100), b_shape=(100, 1), az=True),
      dict(a_shape=(33, 64), b_shape=(64, 100), az=True, bz=(100,)),
      dict(a_shape=(2, 3, 7, 13), b_shape=(3, 13, 64), a_dt="int8"),
      dict(a_shape=(5, 1, 13, 7), b_shape=(1, 4, 7, 13), b_dt="uint8", az=True, bz=()),
      dict(a_shape=(70, 300), b_shape=(300, 47), a_dt="int8", b_dt="uint8", bz=(47,)),
      dict(a_shape=(1, 1), b_shape=(1, 1)), dict(a_shape=(129, 40), b_shape=(40, 33), az=True)]
CONV = [dict(x_shape=(1, 3, 11, 13), w_shape=(5, 3, 3, 3), pads=[1, 1, 1, 1], xz=True),
        dict(x_shape=(2, 4, 17, 10), w_shape=(6, 4, 3, 2), strides=[2, 3], dilations=[2, 1],
             pads=[2, 0, 1, 2], x_dt="int8", xz=True, wz=(6,)),
        dict(x_shape=(1, 16, 7, 9), w_shape=(13, 16, 1, 1), w_dt="uint8", xz=True, wz=()),
        dict(x_shape=(1, 64, 5, 6), w_shape=(40, 64, 3, 3), pads=[1, 1, 1, 1], xz=True),
        dict(x_shape=(1, 8, 9, 9), w_shape=(8, 1, 3, 3), group=8, pads=[1, 1, 1, 1],
             xz=True, wz=(8,)),
        dict(x_shape=(1, 12, 7, 7), w_shape=(6, 4, 3, 3), group=3, strides=[2, 2],
             x_dt="int8", xz=True)]


def nhwc(case: dict) -> Task:
    """The ConvIntegerNHWC twin of a case (pads resolved as the layout pass writes them)."""
    nchw = conv_task("ConvInteger", **case)
    n, c, h, w = case["x_shape"]
    o, i, kh, kw = case["w_shape"]
    attrs = {k: case[k] for k in ("strides", "dilations", "group") if k in case}
    attrs["pads"] = case.get("pads", [0, 0, 0, 0])
    rest = {k: v for k, v in case.items() if k not in ("x_shape", "w_shape", "pads",
                                                       "strides", "dilations", "group")}
    task = conv_task("ConvIntegerNHWC", (n, h, w, c), (o, kh, kw, i), **rest, **attrs)
    assert task.outputs[0].shape == tuple(nchw.outputs[0].shape[i] for i in (0, 2, 3, 1))
    return task


@pytest.mark.parametrize("features, prepacked", [(f, True) for f in PATHS] +
                         [(f, False) for f in HOST])
def test_matmul_integer_on_awkward_shapes(tmp_path, features, prepacked):
    tasks = [matmul_task(**case) for case in MM]
    if prepacked:
        tasks = [t for t in tasks if matmul_int8.can_prepack(t, Int8Config())]
    tgt = target(features)
    run(tmp_path, [(t, matmul_int8.TEMPLATE.default(t, tgt), tgt) for t in tasks], prepacked)


@pytest.mark.parametrize("features", PATHS)
def test_extremes_are_exact(tmp_path, features):
    """Operands at their types' extremes (255 x -128 everywhere: vpmaddubsw's int16
    pair sums would saturate) over a long K."""
    tgt = target(features)
    tasks = [matmul_task((9, 1000), (1000, 20), az=True, bz=(20,)),
             matmul_task((9, 700), (700, 20), a_dt="int8", b_dt="uint8", az=True, bz=())]
    run(tmp_path, [(t, matmul_int8.TEMPLATE.default(t, tgt), tgt) for t in tasks],
        prepacked=True, extreme=True)


@pytest.mark.parametrize("features", HOST)
def test_every_int8_config_and_other_core_counts(tmp_path, features):
    task = matmul_task((2, 45, 70), (70, 83), az=True)
    cases = [(task, cfg, target(features)) for cfg in int8_space()]
    for cores in (1, 3, 16, 64, 128):
        tgt = target(features, cores)
        cases.append((task, matmul_int8.TEMPLATE.default(task, tgt), tgt))
    run(tmp_path, cases, prepacked=True)


@pytest.mark.parametrize("features, prepacked", [(f, True) for f in PATHS] +
                         [(f, False) for f in HOST])
def test_conv_integer_nchw_and_nhwc(tmp_path, features, prepacked):
    tgt = target(features)
    cases = []
    for case in CONV:
        for task in (conv_task("ConvInteger", **case), nhwc(case)):
            cases.append((task, conv_int8.TEMPLATE.default(task, tgt), tgt))
    # OC = 40 in tiles of 32 columns: the gather runs once before the tasks, not per task
    wide = [t for t, _, _ in cases if t.outputs[0].shape[1 if t.op == "ConvInteger" else 3]
            == 40]
    cases += [(t, Int8Config(32, 32), tgt) for t in wide]
    run(tmp_path, cases, prepacked)


def test_weights_pack_as_int8_quads_with_column_sums():
    """`pack_weights`: int32 [N/16][Kp/4 + 1][16], byte t of a word = B'[4i + t][j]
    (B' = B - 128 for uint8), zero past K and N, the column sums of B' last."""
    b = RNG.integers(0, 255, (70, 20), endpoint=True).astype(np.uint8)
    packed = pack_weights(b, "uint8")
    assert packed.dtype == np.int32 and packed.shape == (2, 64 // 4 * 2 + 1, 16)
    quads = packed[:, :-1].view(np.int8).reshape(2, 32, 16, 4)
    back = quads.transpose(1, 3, 0, 2).reshape(128, 32)
    np.testing.assert_array_equal(back[:70, :20], b.astype(np.int32) - 128)
    assert not back[70:].any() and not back[:, 20:].any()
    np.testing.assert_array_equal(packed[:, -1].reshape(-1)[:20],
                                  (b.astype(np.int32) - 128).sum(axis=0))


def test_selection_the_block_helper_and_what_a_module_carries():
    """The integer anchors take the int8 templates; the target's features pick the
    helper; only a module that calls a helper carries their C."""
    task = matmul_task((8, 16), (16, 32))
    tgt = target(("avx512_vnni",))
    assert kernel_choice(task, tgt)[0] is matmul_int8.TEMPLATE
    assert block_call(tgt) == INT8_VNNI and block_call(target(("avx_vnni",))) == INT8_AVXVNNI
    assert block_call(target(())) == INT8_AVX2
    assert block_call(target(("amx_int8", "avx512_vnni"))) == INT8_AMX
    text = print_c_module([lower(build_kernel(task, "q", tgt))])
    assert INT8_SOURCE in text and INT8_VNNI + "(" in text
    f32 = Task("Relu", (TensorType("float32", (4,)),), (TensorType("float32", (4,)),), (),
               (None,))
    assert INT8_SOURCE not in print_c_module([lower(build_kernel(f32, "r", tgt))])
