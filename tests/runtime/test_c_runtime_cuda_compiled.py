"""The C runtime's cuda path (`runtime/c/cuda*.c`) against the fake CUDA driver
(`helpers.c_runtime_cuda`) on a compiled artifact (needs nvcc): its passes launch the
manifest's launches with the arguments the Python runtime packs; and the runtime built
with sanitizers (ASan+UBSan, TSan) running the hand-made artifacts clean."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import onnx
import pytest
from helpers.c_runtime_cuda import (
    OK,
    N,
    W,
    _staging,
    allocations,
    dynamic_artifact,
    launches,
    needs_gcc,
    static_artifact,
)
from helpers.onnx_util import matmul_relu_model

import hidetc
from hidetc.backends.runtime import c_build
from hidetc.backends.runtime.artifact import read_manifest
from hidetc.backends.runtime.cuda.manifest import pack_args, parse_section
from hidetc.graph.guards import Guard

pytestmark = needs_gcc


# ---------------------------------------------------------------- compiled artifacts


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed: compiling a cuda artifact needs it (the hand-made "
                    "artifacts above need none)")
    root = tmp_path_factory.mktemp("compiled_cuda")
    out = {}
    for dynamic in (False, True):
        target = root / ("dynamic" if dynamic else "static")
        model = matmul_relu_model(root / f"{target.name}.onnx", dynamic, seed=7)
        hidetc.compile_model(model, target, target="cuda",
                             **({"dims": {"b": "1..64"}} if dynamic else {}))
        out[target.name] = target
    return out


@pytest.mark.parametrize("kind, sizes", [("static", [4]), ("dynamic", [20, 40, 1, 64])])
def test_compiled_artifact_launches_match_its_manifest(cuda, compiled, kind, sizes):
    """A compiled artifact (its plan.bin written by the compile): each pass launches its
    dispatch variant's launches of the manifest, in order, at its grid, block and shared
    bytes, with the argument bytes the Python runtime packs (`manifest.pack_args`) for
    the same buffers; the cubin for the GPU is what was loaded."""
    root = compiled[kind]
    manifest = read_manifest(root)
    section = parse_section(manifest)
    order = (manifest.get("dynamic") or {}).get("order") or []
    variants = (manifest.get("dynamic") or {}).get("variants") or [{}]
    largest = {k: v["max"] for k, v in ((manifest.get("dynamic") or {}).get("symbols")
                                        or {}).items()}
    model = cuda.model(root)
    [module] = cuda.calls("cuModuleLoadData")
    cubin = (root / manifest["cuda"]["modules"][0]["cubins"]["sm_90"]).read_bytes()
    assert module["head"] == cubin[:16].hex() and int(module["bytes"]) == len(cubin)
    [(weights, _)] = allocations(cuda)
    wbytes = (root / "weights.bin").stat().st_size
    context = cuda.context(model)
    (arena, arena_bytes), (io, io_size) = allocations(cuda)[1:]
    ins, outs, total = _staging(manifest, largest)
    assert io_size == total
    for b in sizes:
        at = {"b": b} if order else {}
        if order:
            assert cuda.set_shape(context, b, 8) == OK, cuda.error()
        x = np.random.default_rng(b).standard_normal((b, 8)).astype(np.float32)
        outputs = [np.empty((b, 16), np.float32), np.empty((b, 8), np.float32),
                   np.empty(3, np.float32)]
        cuda.clear()
        assert cuda.run(context, [x], outputs) == OK, cuda.error()
        variant = next(k for k, v in enumerate(variants)
                       if all(Guard.parse(g).holds(at) for g in v.get("guards") or ()))
        specs = [spec.at(at, order) for spec in section.variants[variant]]
        got = launches(cuda)
        assert [kv["kernel"] for kv in got] == [spec.kernel for spec in specs if not spec.empty]
        for kv, spec in zip(got, [spec for spec in specs if not spec.empty]):
            assert kv["grid"] == ",".join(map(str, spec.grid))
            assert kv["block"] == ",".join(map(str, spec.block))
            assert int(kv["shared"]) == spec.shared_bytes
            packed = pack_args(spec, [io + o for o in ins], [io + o for o in outs],
                               (arena, arena_bytes), (weights, wbytes))
            assert bytes.fromhex(kv["args"]) == packed, spec.describe()
        # the constant output is filled from the weights (the fake runs no real kernel)
        c = np.asarray(onnx.numpy_helper.to_array(
            onnx.load(root.parent / f"{kind}.onnx").graph.initializer[1]))
        np.testing.assert_array_equal(outputs[2], c)
    # and through the Python API of the C runtime (`hidetc.load(OUT, runtime="c")`)
    loaded = hidetc.load(root, runtime="c")
    x = np.ones((sizes[0], 8), np.float32)
    got = loaded.run({"x": x})
    assert got["y"].shape == (sizes[0], 16)
    np.testing.assert_array_equal(got["c_out"], c)
    loaded.close()
    cuda.assert_released()


@pytest.mark.parametrize("sanitize", ["address", "thread"])
def test_sanitized_runtime_runs_clean(cuda, tmp_path, sanitize):
    """The runtime built with ASan+UBSan (leaks checked at exit) and with TSan, through
    hidetc-run: 4 threads on contexts of one model, static and dynamic, sync-each, and
    failing calls at load, context creation and in a pass -- no report."""
    runner = c_build.build_runtime(sanitize) / c_build.INSTALLED["runner"]
    static_artifact(tmp_path / "static")
    dynamic_artifact(tmp_path / "dynamic")
    np.save(tmp_path / "x.npy", np.arange(N, dtype=np.float32))
    np.save(tmp_path / "x100.npy", np.arange(100, dtype=np.float32))
    env = {"PATH": "/usr/bin:/bin", "HIDETC_CUDA_DRIVER": cuda.env_driver,
           "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99",
           "UBSAN_OPTIONS": "halt_on_error=1:exitcode=98",
           "TSAN_OPTIONS": "halt_on_error=1:exitcode=97:report_signal_unsafe=0"}
    cases = [("static", "x.npy", {}, 0), ("dynamic", "x100.npy", {}, 0),
             ("dynamic", "x.npy", {"HIDETC_CUDA_SYNC_EACH": "1"}, 0),
             ("static", "x.npy", {"FAKE_CUDA_FAIL": "cuModuleLoadData"}, 1),
             ("static", "x.npy", {"FAKE_CUDA_FAIL": "cuMemAlloc@3"}, 1),
             ("static", "x.npy", {"FAKE_CUDA_FAIL": "cuLaunchKernel@5"}, 1)]
    for k, (kind, x, extra, code) in enumerate(cases):
        out = tmp_path / f"out{k}"
        proc = subprocess.run([str(runner), str(tmp_path / kind), "--input",
                               f"x={tmp_path / x}", "--threads", "4", "--repeat", "3",
                               "--output-dir", str(out)], capture_output=True, text=True,
                              timeout=300, env={**env, **extra})
        assert proc.returncode == code, (kind, extra, proc.stderr[-3000:])
        assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, \
            proc.stderr[-3000:]
        if code == 0:
            x_in = np.load(tmp_path / x)
            np.testing.assert_array_equal(np.load(out / "y.npy"), x_in + W[:x_in.size])
        else:
            assert "hidetc-run: error: " in proc.stderr and \
                len(proc.stderr.strip().splitlines()) == 1, proc.stderr
