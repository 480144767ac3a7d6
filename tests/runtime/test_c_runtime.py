"""The C runtime (`libhidetc_runtime.so`, `hidetc.h`) on cpu artifacts: the same outputs
as the Python runtime bit for bit (static and dynamic shapes, outputs no kernel writes),
the API's metadata, one loaded model under 8 threads (bit-identical, weights mapped once,
no heap growth), every bad artifact an error code and one line (through the API and as
`hidetc-run`'s exit status), and no libpython in a process that runs an artifact."""
from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers.cli import invoke
from helpers.onnx_util import matmul_relu_model

import hidetc
from hidetc.backends.runtime import c_build
from hidetc.backends.runtime.c_executor import ContextOptions, TensorInfo, open_runtime
from hidetc.backends.runtime.plan_file import PLAN_FILE, write_plan
from hidetc.errors import ArtifactError

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("c_runtime")
    static = root / "static"
    hidetc.compile_model(matmul_relu_model(root / "s.onnx", False, seed=0), static, target="cpu")
    dynamic = root / "dynamic"
    hidetc.compile_model(matmul_relu_model(root / "d.onnx", True, seed=1), dynamic, target="cpu",
                         dims={"b": "1..64"})
    return {"static": static, "dynamic": dynamic}


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _c_load(out: Path):
    """(status, message) of hidetc_model_load on `out`, through ctypes."""
    lib = open_runtime(out / "lib" / c_build.LIBRARY)
    handle = ctypes.c_void_p()
    status = lib.hidetc_model_load(str(out).encode(), 0, ctypes.byref(handle))
    message = lib.hidetc_last_error().decode()
    if status == 0:
        lib.hidetc_model_free(handle)
    return status, message


def _runner(out: Path, *args, inputs=None, tmp: Path):
    args = list(args)
    for name, array in (inputs or {}).items():
        np.save(tmp / f"{name}.npy", array)
        args += ["--input", f"{name}={tmp / (name + '.npy')}"]
    return subprocess.run([str(out / "bin" / "hidetc-run"), str(out), *args,
                           "--output-dir", str(tmp / "outs")], capture_output=True, text=True)


def test_artifact_carries_the_runtime_and_plan(artifacts):
    for out in artifacts.values():
        manifest = yaml.safe_load((out / "manifest.yaml").read_text())
        runtime = manifest["runtime"]
        for key in ("header", "library", "runner", "plan"):
            assert (out / runtime[key]).is_file(), key
            assert runtime[key] in manifest["files"], key     # checksummed like the rest
        assert runtime["abi"] == ctypes.CDLL(str(out / runtime["library"])).hidetc_abi_version()


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_c_runtime_equals_python_runtime(artifacts, kind):
    out = artifacts[kind]
    py, c = hidetc.load(out), hidetc.load(out, runtime="c")
    for batch in ((4,) if kind == "static" else (1, 7, 64, 3)):
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        want, got = py.run({"x": x}), c.run({"x": x})
        assert set(want) == set(got)
        for name in want:
            assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
            assert got[name].tobytes() == want[name].tobytes(), name
    c.close()
    py.close()


def test_closed_contexts_are_not_kept(artifacts):
    """A service that opens and closes a context per request: the executor holds only
    the open ones (it held every context it ever made)."""
    model = hidetc.load(artifacts["static"], runtime="c")
    x = np.ones((4, 8), np.float32)
    kept = model.context(threads=1)
    for _ in range(50):
        with model.context(threads=1) as ctx:
            ctx.run({"x": x})
    assert model._executor._contexts == {kept._context}
    kept.close()
    assert not model._executor._contexts
    model.close()


def test_metadata_and_workspace(artifacts):
    lib = open_runtime(artifacts["dynamic"] / "lib" / c_build.LIBRARY)
    model = ctypes.c_void_p()
    assert lib.hidetc_model_load(str(artifacts["dynamic"]).encode(), 0, ctypes.byref(model)) == 0
    info = TensorInfo()
    assert lib.hidetc_model_input_info(model, 0, ctypes.byref(info)) == 0
    assert (info.name, info.dtype_name, info.rank) == (b"x", b"float32", 2)
    assert (info.dims[0], info.dim_min[0], info.dim_max[0], info.dims[1]) == (-1, 1, 64, 8)
    assert lib.hidetc_model_output_info(model, 0, ctypes.byref(info)) == 0
    assert (info.name, info.dim_min[0], info.dim_max[0], info.dims[1]) == (b"y", 1, 64, 16)
    # the dynamic dims by the names they were compiled with; static ones have none
    assert lib.hidetc_model_input_dim_name(model, 0, 0) == b"b"
    assert lib.hidetc_model_output_dim_name(model, 0, 0) == b"b"
    assert lib.hidetc_model_input_dim_name(model, 0, 1) is None
    assert lib.hidetc_model_input_dim_name(model, 3, 0) is None            # out of range
    assert lib.hidetc_model_output_dim_name(model, 0, 7) is None
    assert lib.hidetc_model_input_info(model, 5, ctypes.byref(info)) == 1    # argument
    assert b"out of range" in lib.hidetc_last_error()
    context = ctypes.c_void_p()
    options = ContextOptions(threads=1)
    assert lib.hidetc_context_create(model, ctypes.byref(options), ctypes.byref(context)) == 0
    size = ctypes.c_size_t()
    assert lib.hidetc_context_workspace_bytes(context, ctypes.byref(size)) == 7   # shape unset
    assert b"set its shape" in lib.hidetc_last_error()
    dims = (ctypes.c_int64 * 2)(65, 8)
    assert lib.hidetc_context_set_input_shape(context, 0, 2, dims) == 7
    assert b"65" in lib.hidetc_last_error() and b"1..64" in lib.hidetc_last_error()
    dims[0] = 5
    assert lib.hidetc_context_set_input_shape(context, 0, 2, dims) == 0
    assert lib.hidetc_context_workspace_bytes(context, ctypes.byref(size)) == 0
    manifest = yaml.safe_load((artifacts["dynamic"] / "manifest.yaml").read_text())
    assert size.value <= manifest["memory"]["arena_bytes"]
    # a caller's workspace: runs the same as the context's own
    buf = np.zeros(size.value + 64, np.uint8)
    aligned = buf.ctypes.data + (-buf.ctypes.data) % 64
    assert lib.hidetc_context_set_workspace(context, ctypes.c_void_p(aligned), size.value) == 0
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    outs = [np.empty((5, 16), np.float32), np.empty((5, 8), np.float32), np.empty(3, np.float32)]
    ins = (ctypes.c_void_p * 1)(x.ctypes.data)
    ptrs = (ctypes.c_void_p * 3)(*[o.ctypes.data for o in outs])
    assert lib.hidetc_context_run(context, ins, ptrs) == 0, lib.hidetc_last_error()
    want = hidetc.load(artifacts["dynamic"]).run({"x": x})
    assert outs[0].tobytes() == want["y"].tobytes() and np.array_equal(outs[1], x)
    lib.hidetc_context_free(context)
    lib.hidetc_model_free(model)


def _bad(tmp_path, artifacts, how):
    out = _copy(artifacts["static"], tmp_path / how)
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    if how == "truncated_plan":
        data = (out / PLAN_FILE).read_bytes()
        (out / PLAN_FILE).write_bytes(data[:len(data) // 2])
    elif how == "flipped_kernel":
        lib = out / manifest["library"]
        data = bytearray(lib.read_bytes())
        data[len(data) // 2] ^= 0xFF
        lib.write_bytes(bytes(data))
    elif how == "other_weights":
        shutil.copy(artifacts["dynamic"] / "weights.bin", out / "weights.bin")
    elif how == "newer_abi":
        write_plan(out, manifest, abi=999)
    elif how == "newer_manifest":
        write_plan(out, {**manifest, "format_version": 999})
    elif how == "missing_isa":
        write_plan(out, {**manifest, "cpu_features": ["avx9000_imaginary"]})
    elif how == "no_plan":
        (out / PLAN_FILE).unlink()
    return out


BAD = {"truncated_plan": (3, "truncated"), "flipped_kernel": (5, "sha256"),
       "other_weights": (5, "weights.bin"), "newer_abi": (4, "ABI"),
       "newer_manifest": (4, "manifest format"), "missing_isa": (6, "avx9000_imaginary"),
       "no_plan": (2, "plan.bin")}


@pytest.mark.parametrize("how", sorted(BAD))
def test_bad_artifacts_give_their_code_and_one_line(tmp_path, artifacts, how):
    out = _bad(tmp_path, artifacts, how)
    code, fragment = BAD[how]
    status, message = _c_load(out)
    assert status == code, (status, message)
    assert fragment in message and "\n" not in message, message
    run = _runner(out, inputs={"x": np.zeros((4, 8), np.float32)}, tmp=tmp_path)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], run.stderr
    assert not (tmp_path / "outs").exists() or not any((tmp_path / "outs").iterdir())


def _build_check(tmp_path, sanitize=None) -> Path:
    built = c_build.build_runtime(sanitize)
    exe = tmp_path / f"threads_check_{sanitize or 'plain'}"
    flags = list(c_build.SANITIZE[sanitize])
    subprocess.run(["gcc", "-std=c11", "-O1", *flags, f"-I{built / 'include'}",
                    str(HERE / "c" / "threads_check.c"), f"-L{built / 'lib'}",
                    "-lhidetc_runtime", f"-Wl,-rpath,{built / 'lib'}", "-pthread", "-o",
                    str(exe)], check=True)
    return exe


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_eight_threads_one_model_bit_identical_no_growth(tmp_path, artifacts, kind):
    """8 threads x 1250 passes = 10,000 runs on one loaded model."""
    exe = _build_check(tmp_path)
    # malloc's thread caches and extra arenas count as memory in use: off (exact count)
    env = {"PATH": "/usr/bin:/bin",
           "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1"}
    proc = subprocess.run([str(exe), str(artifacts[kind]), "8", "1250"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "ok passes=10000" in proc.stdout, proc.stderr


@pytest.mark.parametrize("sanitize", ["address", "thread"])
def test_runtime_sanitized(tmp_path, artifacts, sanitize):
    """The runtime built with ASan+UBSan (LSan: no leak at exit) and with TSan, 8
    threads on one model; one intra-op thread (libgomp is not instrumented)."""
    exe = _build_check(tmp_path, sanitize)
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
           "TSAN_OPTIONS": "halt_on_error=1:report_signal_unsafe=0"}
    for kind in ("static", "dynamic"):
        proc = subprocess.run([str(exe), str(artifacts[kind]), "8", "50"], capture_output=True,
                              text=True, timeout=300, env=env)
        assert proc.returncode == 0 and "ok passes=400" in proc.stdout, proc.stderr[-3000:]
        assert "WARNING: ThreadSanitizer" not in proc.stderr, proc.stderr[-3000:]
        assert "runtime error" not in proc.stderr, proc.stderr[-3000:]


def test_no_libpython_in_a_running_artifact(tmp_path, artifacts):
    out = artifacts["static"]
    ldd = subprocess.run(["ldd", str(out / "bin" / "hidetc-run")], capture_output=True,
                         text=True)
    assert "python" not in ldd.stdout.lower()
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    run = _runner(out, "--maps", str(tmp_path / "maps"), inputs={"x": x}, tmp=tmp_path)
    assert run.returncode == 0, run.stderr
    maps = (tmp_path / "maps").read_text()
    assert "libhidetc_runtime" in maps and "libpython" not in maps
    want = hidetc.load(out).run({"x": x})
    for name, array in want.items():
        assert np.load(tmp_path / "outs" / f"{name}.npy").tobytes() == array.tobytes()


def test_plan_rejects_what_the_c_side_cannot_hold(tmp_path, artifacts):
    manifest = yaml.safe_load((artifacts["static"] / "manifest.yaml").read_text())
    deep = {**manifest, "inputs": [{**manifest["inputs"][0], "shape": [1] * 17}]}
    with pytest.raises(ArtifactError, match="rank 17"):
        write_plan(_copy(artifacts["static"], tmp_path / "deep"), deep)
    # the trailer covers every byte: one flipped bit in the body is caught
    out = _copy(artifacts["static"], tmp_path / "flip")
    data = bytearray((out / PLAN_FILE).read_bytes())
    data[40] ^= 1
    (out / PLAN_FILE).write_bytes(bytes(data))
    status, message = _c_load(out)
    assert status == 5 and "checksum" in message
    assert struct.unpack("<I", bytes(data[12:16]))[0] == 1      # the ABI the plan needs


def test_readme_c_example_compiles_and_runs(tmp_path, artifacts):
    """The README's C program (load, query, run, free), built against an artifact's
    header and library, prints the Python runtime's first output value."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Deploying without Python"):]
    source = section[section.index("```c\n") + 5:]
    source = source[:source.index("```")]
    (tmp_path / "app.c").write_text(source)
    for kind, out in artifacts.items():
        exe = tmp_path / f"app_{kind}"
        subprocess.run(["gcc", "-std=c11", "-Wall", "-Werror", str(tmp_path / "app.c"),
                        f"-I{out / 'include'}", f"-L{out / 'lib'}", "-lhidetc_runtime",
                        f"-Wl,-rpath,{out / 'lib'}", "-o", str(exe)], check=True)
        proc = subprocess.run([str(exe), str(out)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        batch = 4 if kind == "static" else 1
        want = hidetc.load(out).run({"x": np.zeros((batch, 8), np.float32)})["y"]
        assert proc.stdout.strip() == f"y[0] = {float(want.reshape(-1)[0]):.9g}", proc.stdout


def test_cli_runs_through_the_c_runtime(artifacts, tmp_path):
    x = np.random.default_rng(5).standard_normal((4, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = invoke("run", artifacts["static"], "--input", tmp_path / "x.npy", "--runtime", "c",
                    "--repeat", "2", "--output", tmp_path / "o.npz")
    assert result.exit_code == 0, result.output
    got = np.load(tmp_path / "o.npz")
    want = hidetc.load(artifacts["static"]).run({"x": x})
    assert all(got[k].tobytes() == v.tobytes() for k, v in want.items())
