"""GridSample: the catalogue's numpy reference, the CPU kernel (gcc, one shared library
for all cases) and the CUDA kernel (the emulator, one .cu for all cases; nvcc must
compile a few when installed) against onnx's reference implementation
(`onnx.reference.ReferenceEvaluator`, which computes in the input dtype: float32).

Cases: every mode x padding_mode x align_corners on 4-D inputs and on 5-D inputs (5-D
cubic for the numpy reference only: its kernels are large), grids reaching beyond
[-1, 1] (x 1.7) with exact values sprinkled in (0, +-0.5, +-1, +-0.25, +-0.75: nearest
ties, borders), one-element axes, float64 and integer (nearest) inputs. Floats compare
to rtol 1e-4, atol 1e-5 (the reference's float32 rounding; the node tests use rtol
1e-3), nearest exactly. Plus the importer's opset-16 mode names and the one-line
errors."""
from __future__ import annotations

import ctypes
import itertools
import shutil

import numpy as np
import onnx
import pytest
from helpers import targets
from helpers.kernel_device import kernel_module
from helpers.onnx_util import one_node_model
from onnx import helper
from onnx.reference import ReferenceEvaluator

import hidetc
from hidetc.backends.codegen.c import print_c_module
from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.toolchain.gcc import build_shared_library
from hidetc.backends.toolchain.nvcc import compile_cubins
from hidetc.compute.task import Task
from hidetc.errors import ModelError, ShapeError
from hidetc.frontend.onnx.importer import import_model
from hidetc.graph.ir import TensorType, freeze_attr
from hidetc.graph.ops.registry import get_op
from hidetc.graph.reference import run_graph
from hidetc.schedules import cpu, cuda
from hidetc.tir.pipeline import lower

R = np.random.default_rng(11)
MODES = ("linear", "nearest", "cubic")
PADDINGS = ("zeros", "border", "reflection")
SPECIAL = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25, 0.75, -0.75], np.float32)


def grid(*shape, dtype=np.float32):
    g = R.standard_normal(shape) * 1.7
    flat = g.reshape(-1)
    flat[::3] = SPECIAL[R.integers(0, len(SPECIAL), flat[::3].shape)]
    return g.astype(dtype)


def data(*shape, dtype=np.float32):
    if np.dtype(dtype).kind in "iu":
        return R.integers(-100, 100, shape).astype(dtype)
    return R.standard_normal(shape).astype(dtype)


def _cases() -> dict:
    cases = {}
    x4, g4 = data(2, 3, 4, 5), grid(2, 3, 4, 2)
    x5, g5 = data(1, 2, 3, 4, 2), grid(1, 2, 3, 3, 3)
    for mode, pad, align in itertools.product(MODES, PADDINGS, (0, 1)):
        attrs = {"mode": mode, "padding_mode": pad, "align_corners": align}
        cases[f"4d_{mode}_{pad}_{align}"] = (x4, g4, attrs)
        cases[f"5d_{mode}_{pad}_{align}"] = (x5, g5, attrs)
    cases["3d_cubic_border_0"] = (data(2, 2, 7), grid(2, 5, 1),
                                  {"mode": "cubic", "padding_mode": "border"})
    cases["4d_linear_f64"] = (data(1, 2, 3, 5, dtype=np.float64), grid(1, 4, 3, 2),
                              {"padding_mode": "reflection"})
    cases["4d_nearest_int32"] = (data(1, 2, 3, 5, dtype=np.int32), grid(1, 4, 3, 2),
                                 {"mode": "nearest"})
    cases["4d_nearest_f16_grid"] = (data(1, 2, 3, 5), grid(1, 4, 3, 2, dtype=np.float16),
                                    {"mode": "nearest", "padding_mode": "border"})
    # one-element axes: reflection at align_corners reads the only element (onnx's
    # reference divides by zero there: compared with border, the same on such an axis)
    inside = R.uniform(-1, 1, (1, 3, 4, 2)).astype(np.float32)
    cases["4d_one_element_axis"] = (data(1, 2, 1, 5), inside,
                                    {"padding_mode": "reflection", "align_corners": 1})
    cases["4d_one_element_axis_zeros"] = (data(1, 2, 4, 1), grid(1, 3, 4, 2), {"mode": "cubic"})
    return cases


CASES = _cases()
# the kernels compiled: all but the 5-D cubic ones (64 taps each: large and slow to build;
# 5-D linear and nearest cover three nested axes, 4-D cubic the cubic taps)
KERNELS = [name for name in CASES if not name.startswith("5d_cubic")]
# nvcc (slow on double math) compiles one kernel of each path: every math call used
NVCC = ("4d_cubic_reflection_0", "4d_cubic_border_0", "4d_nearest_int32")
SAME_AS = {"4d_one_element_axis": {"padding_mode": "border"}}


def onnx_reference(x: np.ndarray, g: np.ndarray, attrs: dict) -> np.ndarray:
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in (("x", x), ("grid", g))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    return np.asarray(ReferenceEvaluator(model).run(None, {"x": x, "grid": g})[0])


def expected(name: str) -> np.ndarray:
    x, g, attrs = CASES[name]
    return onnx_reference(x, g, {**attrs, **SAME_AS.get(name, {})})


def check(name: str, got: np.ndarray) -> None:
    want = expected(name)
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape)
    if want.dtype.kind in "iu" or CASES[name][2].get("mode") == "nearest":
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


def make_task(x: np.ndarray, g: np.ndarray, attrs: dict) -> Task:
    types = [TensorType.of(x), TensorType.of(g)]
    outputs = get_op("GridSample").infer(types, attrs, [None, None])
    frozen = tuple(sorted((k, freeze_attr(v)) for k, v in attrs.items()))
    return Task("GridSample", tuple(types), tuple(outputs), frozen, (None, None))


TASKS = {name: make_task(*CASES[name]) for name in KERNELS}


def _run_args(name: str) -> list[np.ndarray]:
    x, g, _ = CASES[name]
    out = np.full(TASKS[name].outputs[0].shape, 77, TASKS[name].outputs[0].dtype)
    return [np.ascontiguousarray(x), np.ascontiguousarray(g), out]


@pytest.fixture(scope="module")
def cpu_lib(tmp_path_factory):
    fns = [lower(cpu.build_kernel(task, f"gs_{name}", targets.CPU)) for name, task in TASKS.items()]
    path = tmp_path_factory.mktemp("cpu") / "grid_sample.so"
    return ctypes.CDLL(str(build_shared_library({"grid_sample": print_c_module(fns)}, path)))


@pytest.fixture(scope="module")
def cuda_functions():
    return {name: lower(cuda.build_kernel(task, f"gs_{name}", targets.CUDA))
            for name, task in TASKS.items()}


@pytest.fixture(scope="module")
def emulated(cuda_functions):
    source = print_cuda_module(list(cuda_functions.values()))
    return kernel_module({"grid_sample": source})


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_matches_onnx(name):
    x, g, attrs = CASES[name]
    check(name, get_op("GridSample").reference([x, g], attrs)[0])


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_cpu_kernel(cpu_lib, name):
    args = _run_args(name)
    getattr(cpu_lib, f"gs_{name}")(*[ctypes.c_void_p(a.ctypes.data) for a in args])
    check(name, args[-1])


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_cuda_kernel_emulated(emulated, cuda_functions, name):
    fn = cuda_functions[name]
    args = _run_args(name)
    emulated.launch(fn.name, fn.attr("grid"), fn.attr("block"), args)
    check(name, args[-1])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_the_kernels(cuda_functions, tmp_path):
    source = print_cuda_module([cuda_functions[name] for name in NVCC])
    cubins = compile_cubins({"grid_sample": source}, ["sm_80"], tmp_path,
                            include_dirs=[CUDA_INCLUDE_DIR], ptx=False)
    assert cubins["sm_80"]["grid_sample"].stat().st_size > 0


def test_huge_and_nan_coordinates_stay_in_bounds(cpu_lib):
    """Coordinates far outside never read outside X (border: the edge values; zeros: 0),
    nor does a NaN coordinate (its value is NaN)."""
    for name in ("4d_cubic_border_0", "4d_linear_zeros_0", "4d_nearest_reflection_1"):
        args = _run_args(name)
        args[1] = args[1].copy()
        args[1][0, 0, :4] = [[1e30, -1e30], [3e9, -3e9], [-7e20, 0.3], [np.nan, 0.0]]
        getattr(cpu_lib, f"gs_{name}")(*[ctypes.c_void_p(a.ctypes.data) for a in args])
        x, _, attrs = CASES[name]
        want = get_op("GridSample").reference([x, args[1][:, :, :3]], attrs)[0]
        np.testing.assert_allclose(args[-1][:, :, :, :3], want, rtol=1e-5, atol=1e-6,
                                   err_msg=name)


@pytest.mark.parametrize("opset,mode,want", [(16, "bilinear", "linear"), (16, "bicubic", "cubic"),
                                             (16, "nearest", "nearest"), (20, "cubic", "cubic"),
                                             (22, "linear", "linear")])
def test_importer_reads_the_mode_names_of_each_opset(opset, mode, want):
    x, g = data(1, 1, 3, 4), grid(1, 2, 2, 2)
    model = one_node_model("GridSample", {"x": x, "g": g}, ["y"], {"mode": mode}, opset=opset)
    graph = import_model(model)
    (node,) = [n for n in graph.nodes if n.op == "GridSample"]
    assert node.attr("mode") == want
    got = run_graph(graph, {"x": x, "g": g})["y"]
    np.testing.assert_allclose(got, onnx_reference(x, g, {"mode": want}), rtol=1e-4, atol=1e-5)


def test_importer_refuses_a_mode_of_another_opset():
    x, g = data(1, 1, 3, 4), grid(1, 2, 2, 2)
    model = one_node_model("GridSample", {"x": x, "g": g}, ["y"], {"mode": "linear"}, opset=16)
    with pytest.raises(ModelError, match="GridSample.*mode='linear'.*bilinear"):
        import_model(model)


@pytest.mark.parametrize("x,g,attrs,message", [
    ((1, 1, 3, 4), (1, 2, 2, 3), {}, r"input 1 \(grid\) has shape \[1,2,2,3\], expected"),
    ((2, 1, 3, 4), (1, 2, 2, 2), {}, r"input 1 \(grid\) has shape \[1,2,2,2\]"),
    ((1, 3), (1, 2, 1), {}, r"input 0 \(X\) has shape \[1,3\]"),
    ((1, 1, 3, 4), (1, 2, 2, 2), {"mode": "bilinear"}, r"mode='bilinear', expected one of"),
    ((1, 1, 3, 4), (1, 2, 2, 2), {"padding_mode": "wrap"}, r"padding_mode='wrap'"),
])
def test_shape_errors_are_one_line(x, g, attrs, message):
    types = [TensorType("float32", x), TensorType("float32", g)]
    with pytest.raises(ShapeError, match=message) as info:
        get_op("GridSample").infer(types, attrs, [None, None])
    assert "\n" not in str(info.value) and str(info.value).startswith("GridSample: ")


def test_integer_data_needs_nearest():
    types = [TensorType("int32", (1, 1, 3, 4)), TensorType("float32", (1, 2, 2, 2))]
    with pytest.raises(ShapeError, match="input 0 has dtype int32"):
        get_op("GridSample").infer(types, {"mode": "linear"}, [None, None])


# MaxUnpool (an importer decomposition: ScatterElements into zeros, Reshape, Pad) ---------
def _unpool_inputs(shape: tuple, attrs: dict) -> dict:
    """X and distinct flat indices into the inferred output (as MaxPool's would be)."""
    k = len(shape) - 2
    strides, pads = attrs.get("strides", [1] * k), attrs.get("pads", [0] * (2 * k))
    inferred = list(shape[:2]) + [(shape[2 + i] - 1) * strides[i] - pads[i] - pads[k + i]
                                  + attrs["kernel_shape"][i] for i in range(k)]
    where = R.choice(int(np.prod(inferred)), int(np.prod(shape)), replace=False)
    return {"x": data(*shape), "i": where.reshape(shape).astype(np.int64)}


def _unpool_reference(inputs: dict, constants: dict, attrs: dict) -> np.ndarray:
    names = list(inputs) + list(constants)
    node = helper.make_node("MaxUnpool", names, ["out"], **attrs)
    graph = helper.make_graph(
        [node], "unpool",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info("out", onnx.TensorProto.UNDEFINED, None)],
        [onnx.numpy_helper.from_array(a, n) for n, a in constants.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    return ReferenceEvaluator(model).run(None, inputs)[0]


UNPOOL = {
    "2d_stride2": ((2, 3, 3, 4), {"kernel_shape": [2, 2], "strides": [2, 2]}, None),
    "2d_output_shape": ((1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [2, 2]},
                        [1, 2, 11, 12]),
    "2d_pads_overlap": ((1, 2, 5, 6), {"kernel_shape": [3, 2], "strides": [1, 2],
                                       "pads": [1, 0, 1, 1]}, None),
    "1d_pads": ((2, 1, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, [2, 1, 19]),
}


@pytest.mark.parametrize("name", sorted(UNPOOL))
def test_max_unpool_matches_onnx(name, tmp_path):
    shape, attrs, output_shape = UNPOOL[name]
    inputs = _unpool_inputs(shape, attrs)
    constants = {} if output_shape is None else {"s": np.array(output_shape, np.int64)}
    want = _unpool_reference(inputs, constants, attrs)
    model = one_node_model("MaxUnpool", inputs, ["out"], attrs, constants, opset=22)
    got = run_graph(import_model(model), inputs)["out"]
    np.testing.assert_array_equal(got, want)
    if name == "2d_pads_overlap":   # and compiled for the CPU
        onnx.save(model, tmp_path / "model.onnx")
        hidetc.compile_model(tmp_path / "model.onnx", tmp_path / "out", target="cpu",
                             verify=False)
        np.testing.assert_array_equal(hidetc.load(tmp_path / "out").run(inputs)["out"], want)


def test_max_unpool_refuses_a_smaller_output_shape():
    inputs = _unpool_inputs((1, 1, 2, 2), {"kernel_shape": [2, 2], "strides": [2, 2]})
    model = one_node_model("MaxUnpool", inputs, ["out"],
                           {"kernel_shape": [2, 2], "strides": [2, 2]},
                           {"s": np.array([1, 1, 3, 4], np.int64)}, opset=22)
    with pytest.raises(ModelError, match=r"MaxUnpool.*input 2 \(output_shape\) is \[1, 1, 3, 4\]"):
        import_model(model)
