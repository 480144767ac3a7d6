"""The sanitizer against bugs planted in every kind of generated kernel (issue 26's
targets; the tensor-core and split-K ones are in test_sanitizer.py): the SIMT GEMM, a
multi-warp reduction (Softmax, its partials through shared memory) and an injective
kernel (a Transpose with its Sub prologue). Each bug is one a GPU would expose and a
tolerance can hide; each must be reported naming the kernel that carries it.

Two small f32 models are compiled once for sm_80; every test plants one bug in a copy."""
from __future__ import annotations

import re
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hidetc
import models
from hidetc.backends.runtime.emulated import SanitizerError

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
ROWS, COLS, K = 20, 500, 64          # 20 x 500 = 10000: not a multiple of any block
SOFTMAX = (4, 3000)                  # long rows: several warps per row, shared partials


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _gemm_model() -> onnx.ModelProto:
    """MatMul (SIMT in f32) -> ReduceSum, Sub -> Transpose (injective, Sub grafted)."""
    w = (np.random.default_rng(0).standard_normal((K, COLS)) / 8).astype(np.float32)
    f32 = TensorProto.FLOAT
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("ReduceSum", ["h", "axes"], ["r"], keepdims=1),
         helper.make_node("Sub", ["h", "r"], ["d"]),
         helper.make_node("Transpose", ["d"], ["y"], perm=[1, 0])],
        [helper.make_tensor_value_info("x", f32, [ROWS, K])],
        [helper.make_tensor_value_info("y", f32, [COLS, ROWS])],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(np.array([1], np.int64), "axes")])


def _softmax_model() -> onnx.ModelProto:
    f32 = TensorProto.FLOAT
    return _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                  [helper.make_tensor_value_info("x", f32, list(SOFTMAX))],
                  [helper.make_tensor_value_info("y", f32, list(SOFTMAX))], [])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{name: (artifact dir, manifest, inputs)}, compiled once."""
    root, out = tmp_path_factory.mktemp("planted"), {}
    for name, proto in (("gemm", _gemm_model()), ("softmax", _softmax_model())):
        models.save(proto, root / f"{name}.onnx")
        result = hidetc.compile_model(root / f"{name}.onnx", root / name, target="cuda",
                                      arch="sm_80")
        out[name] = (root / name, result.manifest, models.sample_inputs(proto, seed=1))
    return out


def _kernel(manifest, op: str) -> str:
    return next(k["name"] for k in manifest["kernels"] if k["op"] == op)


def _planted(built, tmp_path, name: str, kernel: str, edit) -> list[str]:
    """Copy artifact `name`, apply `edit(text of kernel) -> text` to `kernel`'s
    definition only, run it sanitized; the hazards (none: AssertionError)."""
    src, manifest, inputs = built[name]
    out = tmp_path / name
    shutil.copytree(src, out)
    (path,) = (out / "kernels" / "src").glob("*.cu")
    text = path.read_text()
    start = text.index(f"\n{kernel}(")
    end = text.index("\n}\n", start)
    changed = edit(text[start:end])
    assert changed != text[start:end], "the edit changed nothing"
    path.write_text(text[:start] + changed + text[end:])
    with pytest.raises(SanitizerError) as caught:
        hidetc.load(out, emulate=True, sanitize=True, verify_checksums=False).run(inputs)
    return caught.value.hazards


def _drop_line(text: str, pattern: str, nth: int = 0) -> str:
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if re.search(pattern, line)]
    assert len(hits) > nth, (pattern, hits)
    return "".join(lines[:hits[nth]] + lines[hits[nth] + 1:])


def test_the_clean_artifacts_run_clean(built):
    for name, (out, manifest, inputs) in built.items():
        templates = {k["template"] for k in manifest["kernels"]}
        results = hidetc.load(out, emulate=True, sanitize=True).run(inputs)
        assert all(np.isfinite(v).all() for v in results.values()), name
        if name == "gemm":
            assert "cuda.matmul_simt" in templates, templates


def test_simt_gemm_accumulator_never_zeroed(built, tmp_path):
    """Local arrays start as poison: the accumulator's first reads are NaN, and the
    value the GEMM writes holds poison -- named with the GEMM, not its readers."""
    matmul = _kernel(built["gemm"][1], "MatMul")
    hazards = _planted(built, tmp_path, "gemm", matmul,
                       lambda t: _drop_line(t, r"acc\[[^\]]*\] = 0\.0f;"))
    assert any(h.startswith(f"kernel {matmul}: ") and "'h' hold poison" in h
               for h in hazards), hazards


def test_simt_gemm_shared_tile_smaller_than_its_indexing(built, tmp_path):
    matmul = _kernel(built["gemm"][1], "MatMul")
    hazards = _planted(built, tmp_path, "gemm", matmul,
                       lambda t: re.sub(r"float sb\[(\d+)\];",
                                        lambda m: f"float sb[{int(m.group(1)) - 8}];", t))
    (hazard,) = hazards
    assert hazard.startswith(f"kernel {matmul}: ") and re.search(r"shared array sb\[\d+\] "
                                                                 r"indexed at \d+", hazard)


def test_simt_gemm_barrier_removed(built, tmp_path):
    """The barrier that ends each k step removed: a thread goes on to load the next
    step's tile before the other threads stored it (in the emulator's order, a load of
    bytes not yet stored; in another, a race)."""
    matmul = _kernel(built["gemm"][1], "MatMul")
    hazards = _planted(built, tmp_path, "gemm", matmul,
                       lambda t: _drop_line(t, r"__syncthreads\(\);", nth=1))
    (hazard,) = hazards
    assert hazard.startswith(f"kernel {matmul}: ") and (
        "race on shared memory" in hazard or "uninitialized shared memory" in hazard), hazard


def test_reduction_barrier_removed(built, tmp_path):
    """The barrier between the warps' partials and their combination removed."""
    softmax = _kernel(built["softmax"][1], "Softmax")
    hazards = _planted(built, tmp_path, "softmax", softmax,
                       lambda t: _drop_line(t, r"__syncthreads\(\);"))
    (hazard,) = hazards
    assert hazard.startswith(f"kernel {softmax}: ") and (
        "race on shared memory" in hazard or "uninitialized shared memory" in hazard), hazard


def test_reduction_partials_array_too_small(built, tmp_path):
    softmax = _kernel(built["softmax"][1], "Softmax")
    hazards = _planted(built, tmp_path, "softmax", softmax,
                       lambda t: re.sub(r"(float \w+_partial)\[(\d+)\];",
                                        lambda m: f"{m.group(1)}[{int(m.group(2)) - 1}];",
                                        t, count=1))
    (hazard,) = hazards
    assert hazard.startswith(f"kernel {softmax}: ") and "_partial[" in hazard, hazard


def test_reduction_guard_dropping_the_row_tail(built, tmp_path):
    """The vector loop's guard tightened by one vector: the row's last vector is never
    loaded into the row's register cache, whose poison then flows into every sum --
    every output element is written, and every one carries poison."""
    softmax = _kernel(built["softmax"][1], "Softmax")
    hazards = _planted(built, tmp_path, "softmax", softmax,
                       lambda t: t.replace(f"* 4 < {SOFTMAX[1]})", f"* 4 < {SOFTMAX[1] - 4})",
                                           1))
    (hazard,) = hazards
    assert hazard.startswith(f"kernel {softmax}: ") and "carry poison" in hazard, hazard


@pytest.mark.parametrize("bound,words", [(-1, "never wrote 1 of the 10000 elements"),
                                         (+1, "past the end of output 'y'")])
def test_injective_guard_off_by_one(built, tmp_path, bound, words):
    transpose = _kernel(built["gemm"][1], "Transpose")
    total = ROWS * COLS
    hazards = _planted(built, tmp_path, "gemm", transpose,
                       lambda t: t.replace(f"< {total})", f"< {total + bound})", 1))
    (hazard,) = hazards
    assert hazard.startswith(f"kernel {transpose}: ") and words in hazard, hazard


def test_a_load_past_the_input_reads_poison(built, tmp_path):
    """The GEMM's first A-tile load shifted one row down: the last row reads past the
    graph input, into its red zone, and the poison reaches the value it computes."""
    matmul = _kernel(built["gemm"][1], "MatMul")
    hazards = _planted(built, tmp_path, "gemm", matmul,
                       lambda t: t.replace("&a[(m0 + (int32_t)threadIdx.x / 4) * 64",
                                           "&a[(m0 + (int32_t)threadIdx.x / 4 + 1) * 64", 1))
    assert any(h.startswith(f"kernel {matmul}: ") and "'h' hold poison" in h
               for h in hazards), hazards
