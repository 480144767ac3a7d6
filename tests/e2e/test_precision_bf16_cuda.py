"""`--precision bf16` end to end on the cuda target: the tiny benchmark models compiled
with bfloat16 storage (cross-compiled for sm_80: nvcc builds the cubins, no GPU needed),
every kernel run in the emulator, sanitized, the outputs within the bf16 tolerance (2e-2
norm-wise relative) of ONNX Runtime in f32, and each kernel within its per-operation
bound of the reference interpreter given the same inputs (`kernel_check`, the check of
`hidetc run --emulate --sanitize --compare`); the weights and kernels are bfloat16 while
the artifact's inputs and outputs keep the model's float32, MatMuls run on the bf16
tensor cores (or the GEMV kernel), and so do the channels-last convolutions. A model of
split-K MatMuls (GELU and a residual grafted) and a split-K ConvNHWC, and one of pools,
elementwise math and an awkward MatMul, the same way; and the sanitizer still finds a
bug in a bfloat16 kernel (an accumulator never zeroed: its bf16 output holds poison).

The kernel-level checks at the top need no nvcc: the printer's bfloat16 (every operation
in float, rounded once; conversions; constants; BitCast) run in the emulator against
numpy bit for bit, and the rules computing in float32 with one rounding at the store.
The tensor-core templates in bf16 kernel by kernel: tests/schedules/test_cuda_tc_bf16.py;
the bf16 mma and conversions: tests/emulator/test_emu_intrinsics.py."""
from __future__ import annotations

import re
import shutil

import ml_dtypes  # noqa: F401  (the "bfloat16" dtype name)
import numpy as np
import onnx
import pytest
from helpers import targets
from helpers.kernel_device import kernel_module
from helpers.precision_models import check_interface, kernel_body, ops_model
from helpers.split_k_model import split_k_model

import hidetc
import models
from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_function, print_cuda_module
from hidetc.backends.runtime.emulated import SanitizerError
from hidetc.backends.toolchain.nvcc import compile_cubins
from hidetc.compute.task import Task
from hidetc.driver.backend import BACKENDS
from hidetc.driver.config import TOLERANCES
from hidetc.driver.kernel_check import check_kernels
from hidetc.driver.verify import compare, run_onnxruntime
from hidetc.graph.ir import TensorType
from hidetc.schedules import cuda
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Call, Const, block_idx, cast, maximum, thread_idx
from hidetc.tir.mapping import spatial
from hidetc.tir.pipeline import lower

BF16, F32 = "bfloat16", "float32"
BF16_RTOL = TOLERANCES["bf16"]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def _task(op: str, inputs, output, attrs=()) -> Task:
    return Task(op, tuple(inputs), (output,), tuple(attrs), (None,) * len(inputs))


def _source(task: Task, name: str = "k") -> str:
    return print_cuda_function(lower(cuda.build_kernel(task, name, targets.CUDA)))


# kernels (no nvcc) ----------------------------------------------------------------------
def test_elementwise_bf16_computes_in_f32_and_rounds_once():
    t = TensorType(BF16, (3, 5))
    src = _source(_task("Add", [t, TensorType(BF16, (5,))], t))
    assert "__nv_bfloat16 *__restrict__ out" in src
    assert src.count("__bfloat162float") == 2 and src.count("__float2bfloat16_rn") == 1
    sig = _source(_task("Sigmoid", [t], t))
    assert "__float2bfloat16_rn(1.0f /" in sig and sig.count("__float2bfloat16_rn") == 1
    # Casts stay exact casts: one rounding into bfloat16, a plain widening out of it
    down = _source(_task("Cast", [TensorType(F32, (3,))], TensorType(BF16, (3,)),
                         (("to", BF16),)))
    assert "= __float2bfloat16_rn(in0[" in down
    up = _source(_task("Cast", [TensorType(BF16, (3,))], TensorType(F32, (3,)),
                       (("to", F32),)))
    assert "= __bfloat162float(in0[" in up and "__float2bfloat16" not in up
    ints = _source(_task("Cast", [TensorType("int64", (3,))], TensorType(BF16, (3,)),
                         (("to", BF16),)))
    assert "__double2bfloat16((double)(in0[" in ints        # one rounding, not via float


def test_pool_and_reduction_bf16_accumulate_in_f32():
    x = TensorType(BF16, (1, 2, 6, 6))
    attrs = (("kernel_shape", (3, 3)), ("pads", (1, 1, 1, 1)), ("strides", (1, 1)))
    src = _source(_task("AveragePool", [x], x, attrs))
    assert "float acc" in src and "__nv_bfloat16 acc" not in src
    assert src.count("__float2bfloat16_rn") == 1
    soft = _source(_task("Softmax", [TensorType(BF16, (4, 50))], TensorType(BF16, (4, 50)),
                         (("axis", -1),)))
    assert "float total" in soft and "float cache[" in soft   # the row in f32 registers
    rounded = re.findall(r"__float2bfloat16_rn\(([^;]*)\);", soft)
    assert rounded and all(r.endswith("/ total") for r in rounded)   # once, at the store


N = 300


def _ops_kernel():
    """One kernel of bfloat16 expressions (see `test_printer_bf16_matches_numpy_bits`)."""
    kb = KernelBuilder("bf16_ops", "cuda")
    a, b = kb.buffer("a", BF16, (N,)), kb.buffer("b", BF16, (N,))
    i, d = kb.buffer("i", "int32", (N,)), kb.buffer("d", "float64", (N,))
    out = kb.buffer("out", BF16, (8, N))
    bits, lt = kb.buffer("bits", "uint16", (N,)), kb.buffer("lt", "bool", (N,))
    with kb.for_mapping(spatial(N), block_idx() * 128 + thread_idx()) as (k,):
        x, y = a[k], b[k]
        for row, value in enumerate([x + y, x * y, x / y, maximum(x, y), -x,
                                     x * Const(0.1, BF16) - y, cast(i[k], BF16),
                                     cast(d[k], BF16)]):
            kb.store(out, (row, k), value)
        kb.store(bits, (k,), Call("bitcast", (x,), "uint16"))
        kb.store(lt, (k,), x < y)
    return lower(kb.finish(grid=(-(-N // 128), 1, 1), block=(128, 1, 1)))


def _bf16(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (ml_dtypes: nearest even, once)."""
    return np.asarray(values, np.float32).astype(BF16)


def _bf16_of_double(x: np.ndarray) -> np.ndarray:
    """float64 -> the nearest bfloat16 as float64, rounded once (ml_dtypes goes through
    float32): 8 significant bits, ties to even (numpy's round), past the range inf."""
    x = np.array(x, np.float64)
    finite = np.isfinite(x) & (x != 0)
    _, e = np.frexp(x[finite])
    quantum = np.ldexp(1.0, np.maximum(e - 8, -133))
    x[finite] = np.round(x[finite] / quantum) * quantum
    top = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    return np.where(np.abs(x) > top, np.copysign(np.inf, x), x)


def test_printer_bf16_matches_numpy_bits():
    """Each operation on bfloat16 is the float32 operation rounded once to bfloat16 (what
    numpy with ml_dtypes computes), NaN kept; a constant is its bfloat16 value; an int32
    and a float64 round once (2^25 + 2^17 + 1 through float would round twice, to an
    even 2^25); BitCast gives the bits; a comparison compares the floats."""
    fn = _ops_kernel()
    text = print_cuda_module([fn])
    constant = re.search(r"__float2bfloat16_rn\(([-\d.e]+)f\)", text)   # 0.1 in bfloat16
    assert constant and np.float32(constant.group(1)) == np.float32(0.10009765625)
    assert "__bfloat16_as_ushort(" in text and "hidetc_f2bf" not in text
    rng = np.random.default_rng(3)
    a = _bf16(rng.standard_normal(N) * 4.0)
    b = _bf16(rng.standard_normal(N) * 4.0)
    a[:4] = _bf16([np.nan, 1.0, np.inf, -0.0])
    b[:4] = _bf16([1.0, np.nan, 2.0, 0.0])
    i = rng.integers(-2 ** 30, 2 ** 30, N).astype(np.int32)
    i[:2] = [2 ** 25 + 2 ** 17 + 1, -(2 ** 25 + 2 ** 17 + 1)]
    d = rng.standard_normal(N) * 1e3
    d[:2] = [1.0 + 2.0 ** -8 + 2.0 ** -40, 3e38 * 1.2]      # above a tie; past the range
    out = np.zeros((8, N), BF16)
    bits, lt = np.zeros(N, np.uint16), np.zeros(N, np.bool_)
    kernel_module({"bf16_ops": text}).launch(fn.name, fn.attr("grid"), fn.attr("block"),
                                             [a, b, i, d, out, bits, lt])
    x, y = a.astype(np.float32), b.astype(np.float32)
    c = np.float32(_bf16(0.1))
    with np.errstate(all="ignore"):
        want = [x + y, x * y, x / y, np.maximum(x, y), -x,
                _bf16(x * c).astype(np.float32) - y]
    for row, value in enumerate(want):
        np.testing.assert_array_equal(out[row].astype(np.float32), _bf16(value).astype(
            np.float32), err_msg=f"row {row}")
    np.testing.assert_array_equal(out[6].astype(np.float64)[:2], [2 ** 25 + 2 ** 18,
                                                                  -(2 ** 25 + 2 ** 18)])
    np.testing.assert_array_equal(out[6].astype(np.float64), _bf16_of_double(i))
    assert out[7][0].astype(np.float64) == 1.0 + 2.0 ** -7     # not 1.0, through float
    np.testing.assert_array_equal(out[7].astype(np.float64), _bf16_of_double(d))
    assert np.isinf(out[7][1].astype(np.float32))
    np.testing.assert_array_equal(bits, a.view(np.uint16))
    np.testing.assert_array_equal(lt, x < y)


@needs_nvcc
def test_nvcc_compiles_the_bf16_printer_output(tmp_path):
    compile_cubins({"bf16_ops": print_cuda_module([_ops_kernel()])}, ("sm_80", "sm_90"),
                   tmp_path, include_dirs=[CUDA_INCLUDE_DIR], ptx=False)


def test_the_cuda_target_accepts_bf16():
    BACKENDS["cuda"].check_precision("bf16", named=True, machine=targets.CUDA)
    names = [name for name, _ in BACKENDS["cuda"].graph_passes("bf16")]
    assert names[0] == "to_bfloat16" and "choose_layout" in names and \
        names[-1] == "fuse_attention"


# end to end (nvcc + emulator) -----------------------------------------------------------
def check_bf16_artifact(proto: onnx.ModelProto, out, manifest: dict) -> None:
    check_interface(proto, manifest, "bf16")
    # bfloat16 storage: weights, and every kernel's task but the interface Casts
    weight_dtypes = {e["dtype"] for e in manifest["weights"]["entries"].values()}
    assert "float32" not in weight_dtypes and "bfloat16" in weight_dtypes
    for kernel in manifest["kernels"]:
        if kernel["op"] != "Cast":
            assert "float32" not in kernel["task"] and "float16" not in \
                kernel["task"].replace("bfloat16", ""), kernel["task"]
    source = "\n".join(p.read_text() for p in sorted((out / "kernels" / "src").glob("*.cu")))
    assert re.search(r"\b__nv_bfloat16 \*", source) and not re.search(r"\bhalf\b", source)
    # MatMuls on bf16 tensor cores, but those of few rows the cost model gives the GEMV
    for k in manifest["kernels"]:
        if k["op"] in ("MatMul", "FusedAttention") or k["template"] == "cuda.conv_tc":
            body = kernel_body(source, k["name"])
            assert ("hidetc_mma_m16n8k16_bf16f32" in body or
                    k["template"] == "cuda.matmul_gemv"), k["name"]
            assert "_f16f32" not in body, k["name"]


def compile_and_compare(proto, tmp_path, seed: int = 2, **options) -> tuple[dict, dict]:
    """Compile `proto` for cuda in bf16 (sm_80), check the artifact, run it in the
    emulator (sanitized) against ONNX Runtime at the bf16 tolerance and each kernel
    against the reference interpreter; (the compile's manifest, the report)."""
    path = tmp_path / "model.onnx"
    models.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cuda", precision="bf16",
                                  arch="sm_80", **options)
    check_bf16_artifact(proto, tmp_path / "out", result.manifest)
    model = hidetc.load(tmp_path / "out", emulate=True, sanitize=True)
    inputs = models.sample_inputs(proto, seed=seed)
    report = compare(model.run(inputs), run_onnxruntime(path, inputs), rtol=BF16_RTOL)
    assert report["status"] == "passed", report
    assert check_kernels(model, path, inputs) == []
    return result.manifest, report


# inception_v3 (the one tiny model with AveragePool, covered below) takes the longest
# to build: it runs with `make test-slow`
MODELS = [pytest.param(name, marks=pytest.mark.slow) if name == "inception_v3" else name
          for name in sorted(models.REGISTRY)]


@needs_nvcc
@pytest.mark.parametrize("name", MODELS)
def test_tiny_model_bf16_emulated(name, tmp_path):
    manifest, report = compile_and_compare(models.build(name, tiny=True), tmp_path)
    ops = {k["op"] for k in manifest["kernels"]}
    if name in ("bert_base", "gpt2"):      # every layer's attention in one kernel
        assert "FusedAttention" in ops and "Softmax" not in ops
    else:                                  # the CNNs channels-last on tensor cores
        assert any(k["template"] == "cuda.conv_tc" for k in manifest["kernels"])
    errors = [o["rel_error"] for o in report["outputs"].values() if "rel_error" in o]
    assert errors and max(errors) > 0      # really bfloat16: not bit-equal to float32


@needs_nvcc
def test_bf16_split_k_matmul_and_conv_on_tensor_cores_sanitized(tmp_path):
    """The MatMuls (GELU and the residual Add grafted) and the 3x3 convolution run on
    tensor cores with split K (an A100's SMs), each kernel checked on exact inputs."""
    manifest, _ = compile_and_compare(split_k_model(), tmp_path, gpu="a100")
    tc = [k for k in manifest["kernels"] if k["template"] in ("cuda.matmul_tc", "cuda.conv_tc")]
    assert {k["template"] for k in tc} == {"cuda.matmul_tc", "cuda.conv_tc"}
    assert {k["op"] for k in tc} == {"MatMul", "ConvNHWC"}
    assert any("splits=1)" not in k["config"] for k in tc if k["op"] == "MatMul")
    assert any("splits=1)" not in k["config"] for k in tc if k["op"] == "ConvNHWC")


@needs_nvcc
def test_bf16_ops_emulated(tmp_path):
    compile_and_compare(ops_model(), tmp_path)


@needs_nvcc
def test_the_sanitizer_sees_poison_in_bf16_values(tmp_path):
    """The first MatMul (GELU grafted) with its accumulators never zeroed: they start as
    the emulator's poison, and the bfloat16 value it writes holds poison -- reported
    naming that kernel."""
    proto = split_k_model()
    models.save(proto, tmp_path / "m.onnx")
    result = hidetc.compile_model(tmp_path / "m.onnx", tmp_path / "out", target="cuda",
                                  precision="bf16", arch="sm_80", gpu="a100")
    kernel = next(k for k in result.manifest["kernels"] if k["op"] == "MatMul")
    (written,) = kernel["writes"]
    assert result.manifest["memory"]["dtypes"][written] == BF16
    for path in (tmp_path / "out" / "kernels" / "src").glob("*.cu"):
        text = path.read_text()
        if f"\n{kernel['name']}(" in text:
            start = text.index(f"\n{kernel['name']}(")
            zeroed = re.compile(r"\n *acc\[[^\]]*\] = 0\.0f;").search(text, start)
            path.write_text(text[:zeroed.start()] + text[zeroed.end():])
    with pytest.raises(SanitizerError) as caught:
        hidetc.load(tmp_path / "out", emulate=True, sanitize=True, verify_checksums=False).run(
            models.sample_inputs(proto, seed=1))
    assert any(h.startswith(f"kernel {kernel['name']}: ") and f"{written!r} hold poison" in h
               for h in caught.value.hazards), caught.value.hazards
