"""`hidetc run --emulate --sanitize` (issue 26, in part): a clean artifact runs clean;
bugs planted in an artifact's generated CUDA -- a store guard that drops the last row
or writes one too many, a missing barrier after the cp.async pipeline's wait, a
missing barrier before split-K's last block reads its "arrived last" flag (a race on
shared memory) -- are reported, one line each naming the kernel, exit 2. (The cp.async,
poisoning and race tracking the sanitizer relies on are tested in
tests/emulator/test_emu_runtime.py.)"""
from __future__ import annotations

import hashlib
import re
import shutil

import numpy as np
import onnx
import pytest
import yaml
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import hidetc
import models
from hidetc.backends.runtime.emulated import SanitizerError
from hidetc.tools.cli import main as cli

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
ROWS = 20


def _matmul_model(k: int) -> onnx.ModelProto:
    w = (np.random.default_rng(0).standard_normal((k, 48)) / np.sqrt(k)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [ROWS, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [ROWS, 48])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _compiled(tmp_path, k: int):
    proto = _matmul_model(k)
    models.save(proto, tmp_path / "m.onnx")
    result = hidetc.compile_model(tmp_path / "m.onnx", tmp_path / "out", target="cuda",
                                  precision="f16", gpu="a100")
    np.save(tmp_path / "x.npy", models.sample_inputs(proto, seed=1)["x"])
    return result.manifest, tmp_path / "out"


def _plant(out, edit) -> str:
    """Apply `edit(text) -> text` to the artifact's CUDA source that changes; the kernel
    the edit is in."""
    for path in sorted((out / "kernels" / "src").glob("*.cu")):
        text = path.read_text()
        changed = edit(text)
        if changed != text:
            path.write_text(changed)
            return path.name
    raise AssertionError("the edit changed no source")


def _sanitized(out, tmp_path):
    return CliRunner().invoke(cli, ["run", str(out), "--input", str(tmp_path / "x.npy"),
                                    "--emulate", "--sanitize"])


def test_a_clean_artifact_runs_clean(tmp_path):
    _, out = _compiled(tmp_path, 64)
    result = _sanitized(out, tmp_path)
    assert result.exit_code == 0, result.output
    assert "sanitizer: no hazards" in result.output


def test_a_store_guard_that_drops_the_last_row(tmp_path):
    manifest, out = _compiled(tmp_path, 64)
    _plant(out, lambda t: re.sub(rf"< {ROWS} &&", f"< {ROWS - 1} &&", t, count=1))
    with pytest.raises(SanitizerError) as caught:      # (checksums: the plant edits a file)
        hidetc.load(out, emulate=True, sanitize=True, verify_checksums=False).run(
            {"x": np.load(tmp_path / "x.npy")})
    (hazard,) = caught.value.hazards
    writer = next(k["name"] for k in manifest["kernels"] if k["op"] == "MatMul")
    assert hazard.startswith(f"kernel {writer}: ")
    assert "never wrote 48 of the 960 elements of output 'y'" in hazard


def test_a_store_guard_that_writes_a_row_too_many(tmp_path):
    """Red zones: the guard widened by a row writes past the output's end."""
    manifest, out = _compiled(tmp_path, 64)
    _plant(out, lambda t: re.sub(rf"< {ROWS} &&", f"< {ROWS + 1} &&", t, count=1))
    with pytest.raises(SanitizerError) as caught:
        hidetc.load(out, emulate=True, sanitize=True, verify_checksums=False).run(
            {"x": np.load(tmp_path / "x.npy")})
    (hazard,) = caught.value.hazards
    writer = next(k["name"] for k in manifest["kernels"] if k["op"] == "MatMul")
    assert hazard.startswith(f"kernel {writer}: wrote ") and "past the end of output 'y'" in hazard


def test_a_missing_barrier_after_the_pipeline_wait(tmp_path):
    """The tensor-core main loop's barrier after `wait_group` removed: a thread computes
    on tiles other threads' copies have not landed in yet (poison), and which ones
    depends on the order the threads run in."""
    manifest, out = _compiled(tmp_path, 512)

    def drop_barrier(text: str) -> str:
        lines = text.splitlines(keepends=True)
        wait = next(i for i, line in enumerate(lines)
                    if "hidetc_cp_async_wait_group(" in line and "__global__" not in line)
        assert "__syncthreads();" in lines[wait + 1]
        return "".join(lines[:wait + 1] + lines[wait + 2:])

    _plant(out, drop_barrier)
    with pytest.raises(SanitizerError) as caught:
        hidetc.load(out, emulate=True, sanitize=True, verify_checksums=False).run(
            {"x": np.load(tmp_path / "x.npy")})
    assert any("kernel matmul_" in h for h in caught.value.hazards), caught.value.hazards


def _refresh_checksums(out) -> None:
    """The CLI verifies checksums: record the edited sources' in the manifest."""
    manifest_path = out / "manifest.yaml"
    doc = yaml.safe_load(manifest_path.read_text())
    for rel in list(doc["files"]):
        doc["files"][rel] = hashlib.sha256((out / rel).read_bytes()).hexdigest()
    manifest_path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_the_cli_prints_one_line_per_hazard_and_exits_2(tmp_path):
    _, out = _compiled(tmp_path, 64)
    _plant(out, lambda t: re.sub(rf"< {ROWS} &&", f"< {ROWS - 1} &&", t, count=1))
    _refresh_checksums(out)
    result = _sanitized(out, tmp_path)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines and all(line.startswith("hidetc: hazard: kernel ") for line in lines)
    assert "Traceback" not in result.output


def test_the_per_kernel_comparison_names_the_kernel_that_computes_wrong(tmp_path):
    """A MatMul (its Mul epilogue grafted) then a Softmax, f32: one of the MatMul's
    stores scaled by 1.01 writes every element, in any order -- only comparing each
    kernel with the reference interpreter (`--compare`) finds it, and names the MatMul,
    not the Softmax that reads its output."""
    w = np.random.default_rng(0).standard_normal((16, 24)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]),
         helper.make_node("Mul", ["h", "c"], ["m"]),
         helper.make_node("Softmax", ["m"], ["y"], axis=-1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 24])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(2.0, np.float32), "c")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    models.save(proto, tmp_path / "m.onnx")
    result = hidetc.compile_model(tmp_path / "m.onnx", tmp_path / "out", target="cuda",
                                  arch="sm_80")
    np.save(tmp_path / "x.npy", models.sample_inputs(proto, seed=1)["x"])
    out = tmp_path / "out"
    clean = CliRunner().invoke(cli, ["run", str(out), "--input", str(tmp_path / "x.npy"),
                                     "--emulate", "--sanitize", "--repeat", "1",
                                     "--compare", str(tmp_path / "m.onnx")])
    assert clean.exit_code == 0 and "every kernel matches" in clean.output, clean.output
    matmul = next(k["name"] for k in result.manifest["kernels"] if k["op"] == "MatMul")
    _plant(out, lambda t: re.sub(r"(\n\s*out_1\[[^\n]*\] = )(v_\d+);", r"\1\2 * 1.01f;", t,
                                 count=1))
    _refresh_checksums(out)
    bad = CliRunner().invoke(cli, ["run", str(out), "--input", str(tmp_path / "x.npy"),
                                   "--emulate", "--sanitize", "--repeat", "1",
                                   "--compare", str(tmp_path / "m.onnx")])
    assert bad.exit_code == 2, bad.output
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith(f"hidetc: hazard: kernel {matmul} (MatMul ")
    assert "differs from the reference interpreter's" in line


def test_a_missing_barrier_before_the_split_k_flag_is_read(tmp_path):
    """Thread 0 stores the "arrived last" flag; without the barrier after it, the other
    warps load it in the same barrier interval: a race on shared memory."""
    manifest, out = _compiled(tmp_path, 2048)          # few tiles, long K: split-K
    assert any("splits=1)" not in (k.get("config") or "splits=1)") for k in manifest["kernels"])

    def drop_barrier(text: str) -> str:
        lines = text.splitlines(keepends=True)
        flag = next(i for i, line in enumerate(lines) if "HIDETC_SST(sa, 0," in line)
        barrier = next(i for i in range(flag, len(lines)) if "__syncthreads();" in lines[i])
        return "".join(lines[:barrier] + lines[barrier + 1:])

    _plant(out, drop_barrier)
    with pytest.raises(SanitizerError) as caught:
        hidetc.load(out, emulate=True, sanitize=True, verify_checksums=False).run(
            {"x": np.load(tmp_path / "x.npy")})
    (hazard,) = caught.value.hazards
    assert hazard.startswith("kernel matmul_") and "race on shared memory" in hazard
