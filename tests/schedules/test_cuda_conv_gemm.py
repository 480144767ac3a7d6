"""The CUDA implicit-GEMM Conv template (hidetc/schedules/cuda/conv_gemm.py) on awkward
shapes (batch 1 and 2; channels 1, 3, 7, 13; spatial 1, 5, 7, 13; kernels 1x1, 3x3,
7x7, 1x7, 7x1; stride 2, asymmetric pads, auto_pad, dilation 2, groups 2 and 3,
depthwise; with and without bias; OH*OW and K multiples of no tile), for a seeded
sample of the space (every config with `-m slow`): build -> lower -> print many kernels
into two .cu units -> nvcc for sm_80 (a ptxas error fails; registers <= 255 and no
spills beyond the tolerated cap, as in test_cuda_matmul_simt) and the emulator (g++)
-> run each kernel in the emulator on NaN-guarded inputs and a sentinel-guarded
output -> compare with the numpy reference (float64).

Each config runs on one of the shapes in the default run, on two with `-m slow`
(rotating, so every shape meets several configs): nvcc dominates the cold run time.
Also: the rule's dispatch (depthwise -> the direct kernel), the vector rules, strict
ptxas checks of the default kernels of ResNet-50-like layers, and float16 storage with
float32 accumulation for Conv and MatMul. Builds are cached by content hash."""
from __future__ import annotations

import random
import shutil
from dataclasses import replace

import numpy as np
import pytest
from helpers import targets
from helpers.kernel_device import kernel_module, launch_checked

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources
from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType, freeze_attr
from hidetc.graph.ops.registry import get_op
from hidetc.schedules.cuda import RULES, TEMPLATES, build_kernel, conv, conv_gemm, matmul_simt
from hidetc.schedules.cuda.conv_gemm import TEMPLATE
from hidetc.schedules.cuda.gemm_simt import SimtConfig, config_space, default_config
from hidetc.schedules.template import MAX_SPACE
from hidetc.tir.pipeline import lower

NVCC = shutil.which("nvcc")
CUDA = targets.CUDA
SAMPLE = 30
GUARD = 64  # elements of NaN around each input, of sentinels around the output
# Tolerated ptxas spills, as in test_cuda_matmul_simt (a launch-bounds occupancy choice).
CHOSEN_REGISTER_CAP, CHOSEN_SPILL_BYTES = 128, 32
# (x shape, w shape, bias, attributes)
SHAPES = [
    ((1, 3, 13, 13), (7, 3, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    ((2, 7, 7, 7), (13, 7, 1, 1), False, {}),                               # pointwise
    ((1, 13, 5, 5), (3, 13, 7, 7), True, {"pads": [3, 3, 3, 3]}),            # K = 637
    ((2, 1, 13, 13), (3, 1, 7, 1), False, {"pads": [3, 0, 3, 0]}),           # 7x1, C = 1
    ((1, 7, 13, 13), (7, 7, 1, 7), True, {"pads": [0, 3, 0, 3]}),            # 1x7
    ((2, 3, 13, 13), (13, 3, 3, 3), False, {"strides": [2, 2], "pads": [0, 1, 2, 1]}),
    ((1, 13, 13, 13), (7, 13, 3, 3), True, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 6, 7, 7), (14, 3, 3, 3), True, {"group": 2, "pads": [1, 1, 1, 1]}),
    ((2, 21, 5, 5), (9, 7, 3, 3), False, {"group": 3, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 7, 13, 13), (7, 1, 3, 3), True, {"group": 7, "pads": [1, 1, 1, 1]}),   # depthwise
    ((1, 3, 7, 7), (6, 1, 3, 3), False, {"group": 3, "strides": [2, 2],
                                         "auto_pad": "SAME_UPPER"}),     # depthwise x 2
    ((1, 13, 1, 1), (7, 13, 1, 1), True, {}),                                # 1 x 1 image
    ((2, 3, 1, 1), (7, 3, 3, 3), False, {"pads": [1, 1, 1, 1]}),             # centre tap only
    ((2, 12, 5, 4), (13, 12, 1, 1), True, {}),                               # all float4
    ((1, 4, 7, 5), (13, 4, 3, 3), False, {"pads": [1, 0, 0, 2], "dilations": [2, 1]}),
    ((1, 3, 13, 7), (7, 3, 7, 7), True, {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
]


def conv_task(x_shape, w_shape, bias: bool, attrs: dict, dtype: str = "float32") -> Task:
    types = [TensorType(dtype, x_shape), TensorType(dtype, w_shape)]
    if bias:
        types.append(TensorType(dtype, (w_shape[0],)))
    out = get_op("Conv").infer(types, attrs, [None] * len(types))[0]
    frozen = tuple(sorted((k, freeze_attr(v)) for k, v in attrs.items()))
    return Task("Conv", tuple(types), (out,), frozen, (None,) * len(types))


def matmul_task(a_shape, b_shape, dtype: str) -> Task:
    out = np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape
    return Task("MatMul", (TensorType(dtype, a_shape), TensorType(dtype, b_shape)),
                (TensorType(dtype, out),), (), (None, None))


def reference(task: Task, ins: list[np.ndarray]) -> np.ndarray:
    ins = [x.astype(np.float64) for x in ins]
    if task.op == "MatMul":
        return np.matmul(*ins)
    return get_op("Conv").reference(ins, dict(task.attrs))[0]


def guarded(shape, dtype, rng, fill) -> tuple[np.ndarray, np.ndarray]:
    """(buffer with guards, C-contiguous view of `shape` inside it, 256-byte aligned)."""
    size = int(np.prod(shape))
    buf = np.full(size + 2 * GUARD, fill, dtype)
    view = buf[GUARD:GUARD + size].reshape(shape)
    if fill != fill:  # NaN guards: an input
        view[...] = rng.standard_normal(shape)
    return buf, view


def gemm_k(task: Task) -> int:
    """The reduction length (the float16 error bound grows with it)."""
    w = task.inputs[1].shape
    return int(np.prod(w[1:])) if task.op == "Conv" else task.inputs[0].shape[-1]


def run_case(module, task: Task, fn, rng) -> None:
    dtype = np.dtype(task.outputs[0].dtype)
    ins = [guarded(t.shape, dtype, rng, np.nan)[1] for t in task.inputs]
    out_buf, out = guarded(task.outputs[0].shape, dtype, rng, 7.0)
    launch_checked(module, fn, ins + [out])     # split-K: again, in reverse order
    ref, msg = reference(task, ins), f"{fn.name}: {task.signature()}"
    if dtype == np.float32:
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=msg)
    else:
        # float16 storage: the inputs are exactly the halves the reference sees, a
        # product of two halves is exact in float32, and the K (+ bias) float32 additions
        # err by at most gamma = (K + 1) * 2^-24 (to first order) times the sum of the
        # magnitudes, |x| (*) |w| (+ |bias|); the one final rounding to half adds at most
        # 2^-11 * |ref| (2^-25 absolute below half's normal range). This bound is tight
        # enough that half accumulation (an error ~ 2^-11 per partial sum) fails it.
        mags = reference(task, [np.abs(x) for x in ins])
        bound = (gemm_k(task) + 1) * 2.0 ** -24 * mags + 2.0 ** -11 * np.abs(ref) + 2.0 ** -25
        err = np.abs(out.astype(np.float64) - ref)
        assert (err <= bound).all(), (msg, float((err - bound).max()))
    assert (out_buf[:GUARD] == 7).all() and (out_buf[GUARD + out.size:] == 7).all()


def check_built(tmp_path, built: list, unit: str) -> None:
    """Two units; nvcc + the ptxas limits (when nvcc exists); emulate + compare."""
    units = {f"{unit}{u}": print_cuda_module([fn for _, fn in built[u::2]]) for u in range(2)}
    if NVCC:
        cubins = compile_cubins(units, "sm_80", tmp_path / "cubin", ptx=False,
                                include_dirs=[CUDA_INCLUDE_DIR], keep_logs=True)
        report = {}
        for path in cubins["sm_80"].values():
            report.update(ptxas_resources(path))
        assert set(report) == {fn.name for _, fn in built}
        for name, res in report.items():
            assert res["registers"] <= 255, (name, res)
            assert res["spills"] == 0 or (res["registers"] <= CHOSEN_REGISTER_CAP and
                                          res["spills"] <= CHOSEN_SPILL_BYTES), (name, res)
    module = kernel_module(units)
    rng = np.random.default_rng(0)
    for task, fn in built:
        run_case(module, task, fn, rng)


def check_configs(tmp_path, configs: list[SimtConfig], per_config: int) -> None:
    """Config i on shapes i * per_config ... (i + 1) * per_config - 1 (mod the list)."""
    tasks = [conv_task(*s) for s in SHAPES]
    cases = [(tasks[(i * per_config + j) % len(tasks)], cfg)
             for i, cfg in enumerate(configs) for j in range(per_config)]
    built = [(task, lower(TEMPLATE.build(task, cfg, f"cg{n}", targets.CUDA)))
             for n, (task, cfg) in enumerate(cases)]
    check_built(tmp_path, built, "convgemm")


def sampled_configs() -> list[SimtConfig]:
    """A seeded sample, the two heaviest configs, and split-K (2, 3 and 5 splits)."""
    space = config_space()
    sample = random.Random(1).sample(space, SAMPLE)
    heaviest = sorted(space, key=lambda c: (-c.registers(), str(c)))[:2]
    split = [replace(c, splits=s) for c, s in zip(sample[:3], (2, 3, 5))]
    return sample + [c for c in heaviest if c not in sample] + split


# tests ---------------------------------------------------------------------------------
def test_space_default_and_registry():
    small, big = conv_task(*SHAPES[0]), conv_task((1, 512, 7, 7), (512, 512, 3, 3), False,
                                                  {"pads": [1, 1, 1, 1]})
    space = TEMPLATE.space(small, CUDA)
    assert 30 <= len(space) <= MAX_SPACE and len(set(space)) == len(space)
    unsplit = [replace(c, splits=1) for c in TEMPLATE.space(big, CUDA)]
    assert [replace(c, splits=1) for c in space] == unsplit == config_space()
    assert all(c.splits > 1 for c in TEMPLATE.space(big, CUDA))   # 7x7, K = 4608: split
    for x, w, bias, attrs in SHAPES:
        task = conv_task(x, w, bias, attrs)
        out = task.outputs[0].shape
        groups = attrs.get("group", 1)
        k = w[1] * w[2] * w[3]
        assert TEMPLATE.default(task, CUDA) == default_config(
            w[0] // groups, out[2] * out[3], k, x[0] * groups, CUDA.sms)
    assert TEMPLATES["Conv"] is TEMPLATE and TEMPLATE.name == "cuda.conv_gemm"


def test_rule_dispatches_depthwise_to_the_direct_kernel():
    for x, w, bias, attrs in SHAPES:
        task = conv_task(x, w, bias, attrs)
        got = build_kernel(task, "k", targets.CUDA)
        if attrs.get("group", 1) > 1 and w[1] == 1:
            assert got == conv.build_direct_conv(task, "k")
        else:
            assert got == TEMPLATE.build(task, TEMPLATE.default(task, CUDA), "k", targets.CUDA)
    assert RULES["Conv"] is conv_gemm.build_conv


@pytest.mark.parametrize("shape,vector,dtype,loads_a,loads_b,stores", [
    (SHAPES[13], True, "float32", True, True, True),      # pointwise, K and H*W % 4 == 0
    (SHAPES[13], False, "float32", False, False, False),  # the config says scalar
    (SHAPES[13], True, "float16", False, False, False),   # vectors are float32 only
    (SHAPES[14], True, "float32", True, False, True),     # im2col B is always a gather
    (SHAPES[1], True, "float32", False, False, False),    # K = 7, OH*OW = 49
])
def test_vector_rules(shape, vector, dtype, loads_a, loads_b, stores):
    task = conv_task(*shape, dtype=dtype)
    cfg = SimtConfig((2, 2), (8, 4), (4, 4), 8, vector, 1)
    text = print_cuda_module([lower(TEMPLATE.build(task, cfg, "v", targets.CUDA))])
    assert ("hidetc_ld_f4(&ra" in text) == loads_a
    assert ("hidetc_ld_f4(&rb" in text) == loads_b
    assert ("hidetc_copy16(&out" in text) == stores


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_default_kernels_of_resnet_layers_do_not_spill(tmp_path):
    """The default configs of ResNet-50-like layers (batch 1): strict ptxas check."""
    layers = [((1, 3, 224, 224), (64, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
              ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
              ((1, 256, 56, 56), (64, 256, 1, 1), {}),
              ((1, 128, 56, 56), (128, 128, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
              ((1, 512, 7, 7), (512, 512, 3, 3), {"pads": [1, 1, 1, 1]}),
              ((1, 1024, 14, 14), (2048, 1024, 1, 1), {"strides": [2, 2]})]
    tasks = [conv_task(x, w, True, attrs) for x, w, attrs in layers]
    fns = [lower(TEMPLATE.build(t, TEMPLATE.default(t, CUDA), f"layer{i}", targets.CUDA))
           for i, t in enumerate(tasks)]
    cubins = compile_cubins({"conv_layers": print_cuda_module(fns)}, "sm_80", tmp_path,
                            ptx=False, include_dirs=[CUDA_INCLUDE_DIR], keep_logs=True)
    report = ptxas_resources(cubins["sm_80"]["conv_layers"])
    for fn in fns:
        assert report[fn.name]["spills"] == 0 and report[fn.name]["registers"] <= 255


def test_float16_storage_accumulates_in_float32(tmp_path):
    """Conv (GEMM, GEMM with bias, and the direct depthwise rule) and MatMul (SIMT) in
    float16 against float64 numpy, within the float32-accumulation bound (run_case)."""
    f16 = "float16"
    cfgs = [SimtConfig((2, 2), (8, 4), (4, 4), 8, True, 1),
            SimtConfig((2, 4), (4, 8), (8, 4), 16, True, 8)]
    convs = [conv_task(*SHAPES[i], dtype=f16) for i in (2, 6, 8, 13)]
    built = [(t, lower(TEMPLATE.build(t, cfgs[i % 2], f"h{i}", targets.CUDA)))
             for i, t in enumerate(convs)]
    depthwise = conv_task(*SHAPES[9], dtype=f16)
    built.append((depthwise, lower(build_kernel(depthwise, "hdw", targets.CUDA))))
    for i, (a, b) in enumerate((((13, 1000), (1000, 7)), ((2, 7, 129), (129, 13)))):
        task = matmul_task(a, b, f16)
        built.append((task, lower(matmul_simt.TEMPLATE.build(task, cfgs[i], f"hmm{i}",
                                                             targets.CUDA))))
    check_built(tmp_path, built, "convgemm_f16")


def test_sampled_configs_on_awkward_shapes(tmp_path):
    check_configs(tmp_path, sampled_configs(), 1)


@pytest.mark.slow
def test_every_config_on_awkward_shapes(tmp_path):
    check_configs(tmp_path, config_space(), 2)
