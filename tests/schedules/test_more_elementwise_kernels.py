"""CPU and CUDA kernels of the catalogue ops added to `hidetc.compute` (trigonometric and
hyperbolic math, the Elu family, Shrink, Softsign, Mish, HardSwish, Round, Mod, BitShift,
OneHot, DepthToSpace, SpaceToDepth), ReduceLogSum, InstanceNormalization and bool
ReduceMax/Min.

Each case is one Task built from the catalogue's shape rule; its CPU kernel (gcc, one
shared library for all cases) and its CUDA kernel (the emulator, one .cu for all
cases; nvcc must compile the same text when installed) run on awkward shapes and must
match ONNX's reference implementation (`onnx.reference.ReferenceEvaluator`) run on the
inputs widened to float64 and rounded: exactly for integers and layout ops, to rtol
1e-5 for float32 (1e-12 for float64) math, per element (no absolute floor, so tiny
results must be accurate too) or, for the normalizations, relative to the output's
largest magnitude."""
from __future__ import annotations

import ctypes
import shutil

import numpy as np
import onnx
import pytest
from helpers import targets
from helpers.kernel_device import kernel_module
from onnx import helper
from onnx.reference import ReferenceEvaluator

from hidetc.backends.codegen.c import print_c_module
from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.toolchain.gcc import build_shared_library
from hidetc.backends.toolchain.nvcc import compile_cubins
from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType, freeze_attr
from hidetc.graph.ops.registry import get_op
from hidetc.schedules import cpu, cuda
from hidetc.tir.pipeline import lower

R = np.random.default_rng(7)


def f32(low, high, *shape):
    return R.uniform(low, high, shape).astype(np.float32)


def ints(dtype, low, high, *shape):
    return R.integers(low, high, shape, dtype=np.int64).astype(dtype)


def _ties():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 2.4, -3.7, 0.0, -0.0, 7.5,
                  1e8 + 1, np.inf, -np.inf], np.float32)
    return np.concatenate([x, f32(-50, 50, 27)]).reshape(3, 2, 7)


def _mod_operands(dtype):
    info = np.iinfo(dtype)
    if info.min == 0:
        a = [7, 0, 5, 6, info.max, info.max, 1, 0]
        b = [3, 4, 2, 3, 7, info.max, info.max, 1]
    else:
        a = [7, -7, 7, -7, 0, 5, -5, 6, -6, 13, info.min, info.max, info.min, info.min]
        b = [3, 3, -3, -3, 4, -2, 2, 3, -3, 5, -1, -7, 7, info.max]
    return np.array(a, dtype), np.array(b, dtype)


def _shift_operands(dtype, signed: bool):
    """Random bit patterns (every bit of the width) and shifts 0 .. width + 2."""
    bits = np.iinfo(dtype).bits
    n = 3 * bits
    a = R.integers(0, 256, n * bits // 8, dtype=np.uint8).view(dtype).copy()
    a[:3] = np.array([1, -1 if signed else 5, 3], dtype)
    b = np.arange(n, dtype=np.int64) % (bits + 3)
    return a, b.astype(dtype)


UNARY = {  # op -> (input, attrs)
    "Tan": (f32(-1.5, 1.5, 5, 13), {}),
    "Asin": (f32(-1, 1, 37), {}),
    "Acos": (f32(-1, 1, 3, 11), {}),
    "Atan": (f32(-30, 30, 2, 17), {}),
    "Sinh": (f32(-10, 10, 41), {}),
    "Cosh": (f32(-10, 10, 1, 41), {}),
    "Asinh": (f32(-100, 100, 29), {}),
    "Acosh": (f32(1, 100, 29), {}),
    "Atanh": (f32(-0.99, 0.99, 31), {}),
    "Softsign": (f32(-20, 20, 4, 9), {}),
    "Round": (_ties(), {}),
    "Mish": (f32(-20, 20, 67), {}),
    "HardSwish": (np.concatenate([f32(-6, 6, 40), np.float32([-3, 3, 0, -4, 4])]), {}),
    "Elu": (np.concatenate([f32(-4, 4, 54), -np.float32([1e-3, 1e-5, 3e-7])]).reshape(3, 19),
            {"alpha": 2.0}),
    "Selu": (np.concatenate([f32(-4, 4, 23), -np.float32([1e-3, 1e-5, 3e-7])]),
             {"alpha": 2.0, "gamma": 3.0}),
    "Celu": (f32(-4, 4, 2, 3, 5), {"alpha": 2.0}),
    "ThresholdedRelu": (np.concatenate([f32(-3, 3, 30), np.float32([0.5, 0.75])]),
                        {"alpha": 0.5}),
    "Shrink": (np.concatenate([f32(-3, 3, 30), np.float32([1.5, -1.5])]),
               {"bias": 1.5, "lambd": 1.5}),
}

CASES: dict[str, tuple[str, list[np.ndarray], dict]] = {
    **{op.lower(): (op, [x], attrs) for op, (x, attrs) in UNARY.items()},
    "elu_default_f64": ("Elu", [R.uniform(-3, 3, 17)], {}),
    "mish_f64": ("Mish", [R.uniform(-30, 30, 17)], {}),
    "asin_f64": ("Asin", [R.uniform(-1, 1, 19)], {}),
    "mod_f32_fmod": ("Mod", [f32(-10, 10, 3, 7), f32(1, 4, 7) * np.float32(
        np.where(np.arange(7) % 2, 1, -1))], {"fmod": 1}),
    "mod_bcast_int64": ("Mod", [ints("int64", -100, 100, 4, 6), ints("int64", 1, 9, 6)
                                * np.where(np.arange(6) % 2, 1, -1)], {}),
    **{f"mod_{dt}_{fm}": ("Mod", list(_mod_operands(dt)), {"fmod": fm})
       for dt in ("int8", "int16", "int32", "int64", "uint8", "uint32") for fm in (0, 1)},
    **{f"bitshift_{dt}_{d.lower()}": ("BitShift", list(_shift_operands(dt, False)),
                                      {"direction": d})
       for dt in ("uint8", "uint16", "uint32", "uint64") for d in ("LEFT", "RIGHT")},
    **{f"bitshift_{dt}_{d.lower()}": ("BitShift", list(_shift_operands(dt, True)),
                                      {"direction": d})
       for dt in ("int8", "int32", "int64") for d in ("LEFT", "RIGHT")},
    "bitshift_bcast": ("BitShift", [ints("uint32", 0, 2**32, 3, 5), np.uint32([1, 31, 32])
                                    .reshape(3, 1)], {"direction": "LEFT"}),
    "reduce_log_sum": ("ReduceLogSum", [f32(0.1, 2, 3, 5, 7), np.int64([1, -1])],
                       {"keepdims": 0}),
    "reduce_log_sum_all": ("ReduceLogSum", [f32(0.1, 2, 2, 9)], {}),
    "reduce_max_bool": ("ReduceMax", [R.random((4, 5)) < 0.2, np.int64([1])], {}),
    "reduce_min_bool": ("ReduceMin", [R.random((4, 5)) < 0.8, np.int64([0])],
                        {"keepdims": 0}),
    "onehot_last": ("OneHot", [ints("int64", -7, 7, 3, 5), np.int64(5),
                               np.float32([-2, 3])], {}),
    "onehot_axis0": ("OneHot", [ints("int32", -4, 4, 7), np.array([4], np.int64),
                                np.int64([0, 9])], {"axis": 0}),
    "onehot_axis1_float": ("OneHot", [f32(-5, 5, 2, 3), np.float32(3),
                                      np.float64([1, 2])], {"axis": 1}),
    "depth_to_space_dcr": ("DepthToSpace", [f32(-1, 1, 2, 12, 3, 5)], {"blocksize": 2}),
    "depth_to_space_crd": ("DepthToSpace", [f32(-1, 1, 1, 18, 2, 3)],
                           {"blocksize": 3, "mode": "CRD"}),
    "space_to_depth": ("SpaceToDepth", [f32(-1, 1, 2, 3, 6, 4)], {"blocksize": 2}),
    "instance_norm": ("InstanceNormalization", [f32(-3, 5, 2, 3, 7, 5), f32(0.5, 2, 3),
                                                f32(-1, 1, 3)], {"epsilon": 1e-3}),
    "instance_norm_3d": ("InstanceNormalization", [f32(10, 11, 1, 4, 13), f32(0.5, 2, 4),
                                                   f32(-1, 1, 4)], {}),
}
NORMWISE = ("InstanceNormalization", "ReduceLogSum")
EXACT = ("Mod", "BitShift", "OneHot", "DepthToSpace", "SpaceToDepth", "ReduceMax",
         "ReduceMin", "Round")


def make_task(op: str, inputs: list[np.ndarray], attrs: dict) -> Task:
    opdef = get_op(op)
    types = [TensorType.of(x) for x in inputs]
    values = [x if i in opdef.value_inputs else None for i, x in enumerate(inputs)]
    outputs = opdef.infer(types, attrs, values)
    params = tuple(freeze_attr(np.asarray(v)) if v is not None else None for v in values)
    frozen = tuple(sorted((k, freeze_attr(v)) for k, v in attrs.items()))
    return Task(op, tuple(types), tuple(outputs), frozen, params)


def onnx_reference(op: str, inputs: list[np.ndarray], attrs: dict) -> np.ndarray:
    names = [f"in{i}" for i in range(len(inputs))]
    node = helper.make_node(op, names, ["out"], **attrs)
    graph = helper.make_graph(
        [node], "case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
         for n, x in zip(names, inputs)],
        [helper.make_tensor_value_info("out", onnx.TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = dict(zip(names, inputs))
    with np.errstate(all="ignore"):
        return np.asarray(ReferenceEvaluator(model).run(None, feeds)[0])


def expected(name: str) -> np.ndarray:
    """ONNX's reference on the inputs widened to float64, rounded to the output dtype
    (the correctly rounded result, up to the reference's own float64 error)."""
    op, inputs, attrs = CASES[name]
    if op == "BitShift":   # signed shifts are BitShift-28's; onnx's evaluator is numpy's
        shift = np.left_shift if attrs["direction"] == "LEFT" else np.right_shift
        return shift(*inputs)
    wide = [x.astype(np.float64) if x.dtype == np.float32 else x for x in inputs]
    if op == "OneHot":   # the spec truncates float indices (onnx's evaluator does not)
        wide[0] = np.trunc(wide[0]) if wide[0].dtype.kind == "f" else wide[0]
        wide[1] = wide[1].reshape(())   # and reads depth as a scalar
    dtype = TASKS[name].outputs[0].dtype
    return onnx_reference(op, wide, attrs).astype(dtype)


TASKS = {name: make_task(*case) for name, case in CASES.items()}


def _args(task: Task, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    buffers = [np.ascontiguousarray(inputs[i]) for i in task.buffer_inputs]
    out = np.full(task.outputs[0].shape, 77, task.outputs[0].dtype)
    return buffers, out


def check(name: str, got: np.ndarray) -> None:
    op = CASES[name][0]
    want = expected(name)
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, want.dtype)
    if op in EXACT or want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        tol = 1e-12 if want.dtype == np.float64 else 1e-5
        # elementwise math: relative to each element (tiny results must keep their
        # digits); normalizations end in `+ bias`: relative to the output's magnitude
        atol = tol * float(np.abs(want).max()) if op in NORMWISE else 0.0
        np.testing.assert_allclose(got, want, rtol=tol, atol=atol, err_msg=name)


@pytest.fixture(scope="module")
def cpu_lib(tmp_path_factory):
    fns = [lower(cpu.build_kernel(task, f"k_{name}", targets.CPU)) for name, task in TASKS.items()]
    path = tmp_path_factory.mktemp("cpu") / "kernels.so"
    return ctypes.CDLL(str(build_shared_library({"more_elementwise": print_c_module(fns)},
                                                path)))


@pytest.fixture(scope="module")
def cuda_functions():
    return {name: lower(cuda.build_kernel(task, f"k_{name}", targets.CUDA))
            for name, task in TASKS.items()}


@pytest.fixture(scope="module")
def cuda_source(cuda_functions):
    return print_cuda_module(list(cuda_functions.values()))


@pytest.fixture(scope="module")
def emulated(cuda_source):
    return kernel_module({"more_elementwise": cuda_source})


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_kernel(cpu_lib, name):
    task = TASKS[name]
    buffers, out = _args(task, CASES[name][1])
    getattr(cpu_lib, f"k_{name}")(*[ctypes.c_void_p(a.ctypes.data) for a in buffers + [out]])
    check(name, out)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_kernel_emulated(emulated, cuda_functions, name):
    task, fn = TASKS[name], cuda_functions[name]
    buffers, out = _args(task, CASES[name][1])
    emulated.launch(fn.name, fn.attr("grid"), fn.attr("block"), buffers + [out])
    check(name, out)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_the_kernels(cuda_source, tmp_path):
    cubins = compile_cubins({"more_elementwise": cuda_source}, ["sm_80"], tmp_path,
                            include_dirs=[CUDA_INCLUDE_DIR], ptx=False)
    assert cubins["sm_80"]["more_elementwise"].stat().st_size > 0


def test_mod_and_shift_edges_match_numpy():
    """The cases cover what C leaves undefined or traps on: INT_MIN % -1, shifts by the
    width and past it, negative values shifted right."""
    a, b = CASES["mod_int32_0"][1]
    assert (a == np.iinfo(np.int32).min).any() and (b == -1).any()
    for dt in ("uint8", "int64"):
        _, shifts = CASES[f"bitshift_{dt}_left"][1]
        assert (shifts == np.iinfo(dt).bits).any() and (shifts > np.iinfo(dt).bits).any()
