"""`--precision f16` end to end on the cuda target: the tiny benchmark models compiled
with float16 storage (cross-compiled for sm_80: nvcc builds the cubins, no GPU needed),
every kernel run in the emulator (sanitized), the outputs within the f16 tolerance (1e-2 norm-wise
relative) of ONNX Runtime in f32; the weights and kernels are float16 while the
artifact's inputs and outputs keep the model's dtypes, and MatMuls run on tensor cores.

The kernel-level checks at the top need no nvcc."""
from __future__ import annotations

import re
import shutil

import onnx
import pytest
from helpers import targets
from helpers.precision_models import check_interface, kernel_body, ops_model

import hidetc
import models
from hidetc.backends.codegen.cuda import print_cuda_function
from hidetc.compute.task import Task
from hidetc.driver.config import TOLERANCES
from hidetc.driver.verify import compare, run_onnxruntime
from hidetc.graph.ir import TensorType
from hidetc.schedules import cuda
from hidetc.schedules.cuda import matmul_simt, matmul_tc
from hidetc.tir.pipeline import lower

F16_RTOL = TOLERANCES["f16"]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def _task(op: str, inputs, output, attrs=()) -> Task:
    return Task(op, tuple(inputs), (output,), tuple(attrs), (None,) * len(inputs))


def _source(task: Task, name: str = "k") -> str:
    return print_cuda_function(lower(cuda.build_kernel(task, name, targets.CUDA)))


# kernels (no nvcc) ----------------------------------------------------------------------
def test_matmul_dispatch_per_dtype():
    def mm(dt):
        return _task("MatMul", [TensorType(dt, (4, 24)), TensorType(dt, (24, 8))],
                     TensorType(dt, (4, 8)))
    assert cuda.template_for(mm("float16")) is matmul_tc.TEMPLATE
    assert cuda.template_for(mm("float32")) is matmul_simt.TEMPLATE
    assert cuda.TEMPLATES["MatMul/f16"] is matmul_tc.TEMPLATE
    assert "hidetc_mma_m16n8k16" in _source(mm("float16"))
    assert "hidetc_mma_m16n8k16" not in _source(mm("float32"))


def test_elementwise_f16_computes_in_f32_and_rounds_once():
    t = TensorType("float16", (3, 5))
    src = _source(_task("Add", [t, TensorType("float16", (5,))], t))
    assert "half *__restrict__ out" in src
    assert src.count("__half2float") == 2 and src.count("__float2half_rn") == 1
    assert "__hadd_rn" not in src
    sig = _source(_task("Sigmoid", [t], t))
    assert "__float2half_rn(1.0f /" in sig and "__hdiv" not in sig
    # Casts stay exact casts: one rounding into float16, a plain widening out of it
    down = _source(_task("Cast", [TensorType("float32", (3,))], TensorType("float16", (3,)),
                         (("to", "float16"),)))
    assert "= __float2half_rn(in0[" in down
    up = _source(_task("Cast", [TensorType("float16", (3,))], TensorType("float32", (3,)),
                       (("to", "float32"),)))
    assert "= __half2float(in0[" in up and "__float2half" not in up


def test_pool_f16_accumulates_in_f32():
    x, y = TensorType("float16", (1, 2, 6, 6)), TensorType("float16", (1, 2, 6, 6))
    attrs = (("kernel_shape", (3, 3)), ("pads", (1, 1, 1, 1)), ("strides", (1, 1)))
    src = _source(_task("AveragePool", [x], y, attrs))
    assert "float acc" in src and "half acc" not in src
    assert src.count("__float2half_rn") == 1 and "__hadd_rn" not in src


# end to end (nvcc + emulator) -----------------------------------------------------------
def check_f16_artifact(proto: onnx.ModelProto, out, manifest: dict) -> None:
    check_interface(proto, manifest, "f16")
    # float16 storage: weights, and every kernel's task but the interface Casts
    weight_dtypes = {e["dtype"] for e in manifest["weights"]["entries"].values()}
    assert "float32" not in weight_dtypes and "float16" in weight_dtypes
    for kernel in manifest["kernels"]:
        if kernel["op"] != "Cast":
            assert "float32" not in kernel["task"], kernel["task"]
    source = "\n".join(p.read_text() for p in sorted((out / "kernels" / "src").glob("*.cu")))
    assert re.search(r"\bhalf \*", source)
    # MatMuls on tensor cores, but those of few rows the cost model gives the GEMV kernel
    matmuls = {k["name"]: k for k in manifest["kernels"] if k["op"] == "MatMul"}
    for name, kernel in matmuls.items():
        if kernel["template"] == "cuda.matmul_gemv":
            out_shape = [int(d) for d in re.findall(r"\[([\d,]*)\]", kernel["task"])[-1]
                         .split(",") if d]
            assert len(out_shape) < 2 or out_shape[-2] <= 16, kernel["task"]
            assert "__shfl_xor_sync" in kernel_body(source, name), name
        else:
            assert "hidetc_mma_m16n8k16" in kernel_body(source, name), name


def compile_and_compare(proto, tmp_path, seed: int = 2) -> dict:
    path = tmp_path / "model.onnx"
    models.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cuda", precision="f16",
                                  arch="sm_80")
    check_f16_artifact(proto, tmp_path / "out", result.manifest)
    model = hidetc.load(tmp_path / "out", emulate=True, sanitize=True)
    inputs = models.sample_inputs(proto, seed=seed)
    report = compare(model.run(inputs), run_onnxruntime(path, inputs), rtol=F16_RTOL)
    assert report["status"] == "passed", report
    return report


# inception_v3 (the one tiny model with AveragePool, covered below) takes the longest
# to build: it runs with `make test-slow`
MODELS = [pytest.param(name, marks=pytest.mark.slow) if name == "inception_v3" else name
          for name in sorted(models.REGISTRY)]


@needs_nvcc
@pytest.mark.parametrize("name", MODELS)
def test_tiny_model_f16_emulated(name, tmp_path):
    report = compile_and_compare(models.build(name, tiny=True), tmp_path)
    if name in ("bert_base", "gpt2"):      # every layer's attention in one kernel
        kernels = hidetc.load(tmp_path / "out", emulate=True).manifest["kernels"]
        assert any(k["op"] == "FusedAttention" for k in kernels)
        assert not any(k["op"] == "Softmax" for k in kernels)
    errors = [o["rel_error"] for o in report["outputs"].values() if "rel_error" in o]
    assert errors and max(errors) > 0      # really float16: not bit-equal to float32


@needs_nvcc
def test_f16_ops_emulated(tmp_path):
    compile_and_compare(ops_model(), tmp_path)
