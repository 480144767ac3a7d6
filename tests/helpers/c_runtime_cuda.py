"""The shared pieces of the C runtime's cuda-path tests (`tests/runtime/test_c_runtime_cuda*.py`):
a fake CUDA driver (`tests/helpers/fake_libcuda.c`, built here with gcc and named by
HIDETC_CUDA_DRIVER) whose device memory is host memory and which traces every call to a
file; hand-made cuda artifacts (stand-in kernel images: no nvcc needed) whose `fake_add` /
`fake_copy` kernels the fake runs, so values flow end to end; the runtime's API through
ctypes (`Cuda`) and the fixtures `fake_so`, `lib` and `cuda`."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers.cuda_artifact import launch

from hidetc.backends.runtime import c_build
from hidetc.backends.runtime.c_executor import ContextOptions, open_runtime
from hidetc.backends.runtime.plan_file import write_plan
from hidetc.backends.runtime.sizes import parse_dims
from hidetc.backends.runtime.weights import write_weights
from hidetc.graph.symbolic import evaluate

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None,
                               reason="gcc not installed: the C runtime and the fake CUDA "
                                      "driver are built with it")

FAKE_SOURCE = Path(__file__).resolve().parent / "fake_libcuda.c"
OK, MACHINE, SHAPE, MEMORY, DEVICE = 0, 6, 7, 8, 10
N = 64                           # floats in the static artifact's x and y
ARENA = 4096
W = np.linspace(-1, 1, 256, dtype=np.float32)
C = np.arange(8, dtype=np.float32) * 0.5
# distinct first 16 bytes: the fake traces them (head=) so a test sees which was loaded
IMAGES = {"sm_80": b"cubin for sm_80 -- fake", "sm_90": b"cubin for sm_90 -- fake!",
          "compute_90": b"// PTX compute_90 fake\n"}


# ---------------------------------------------------------------- building, artifacts


@pytest.fixture(scope="module")
def fake_so(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fake_cuda") / "libfakecuda.so"
    subprocess.run(["gcc", "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC",
                    "-shared", "-pthread", str(FAKE_SOURCE), "-o", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def lib():
    return open_runtime(c_build.build_runtime() / "lib" / c_build.LIBRARY)


def _weights(root: Path) -> dict:
    entries = write_weights(root / "weights.bin",
                            {"pad": np.zeros(5, np.float32), "w": W, "c": C})
    return {"file": "weights.bin", "entries": {k: e.to_dict() for k, e in entries.items()}}


def _module(root: Path, archs=("sm_80", "sm_90"), ptx=True) -> dict:
    (root / "kernels").mkdir(exist_ok=True)
    module = {"name": "model", "cubins": {}}
    for arch in archs:
        (root / "kernels" / f"{arch}.cubin").write_bytes(IMAGES[arch])
        module["cubins"][arch] = f"kernels/{arch}.cubin"
    if ptx:
        (root / "kernels" / "model.ptx").write_bytes(IMAGES["compute_90"])
        module["ptx"] = {"arch": "compute_90", "file": "kernels/model.ptx"}
    return module


SCALARS = [["i32", -7], ["f32", 0.5], ["input", 0], ["u32", 3], ["f64", 1.25], ["i64", -1],
           ["u64", 2**63 + 5]]


def static_artifact(root: Path, **images) -> dict:
    """x[64] -> y = x + w (fake_add into the arena, fake_copy out, 64 KiB of dynamic
    shared memory), a launch of every scalar kind, and three outputs no kernel writes:
    x back, a constant, y again."""
    root.mkdir(parents=True, exist_ok=True)
    weights = _weights(root)
    w = weights["entries"]["w"]
    vec = {"dtype": "float32", "shape": [N]}
    manifest = {
        "format_version": 1, "target": "cuda", "hidetc_version": "test",
        "inputs": [{"name": "x", **vec}],
        "outputs": [{"name": "y", **vec}, {"name": "x_copy", **vec},
                    {"name": "c", "dtype": "float32", "shape": [8]}, {"name": "y2", **vec}],
        "output_sources": [{"kind": "kernel"}, {"kind": "input", "index": 0},
                           {"kind": "constant", "name": "c"}, {"kind": "output", "index": 0}],
        "memory": {"arena_bytes": ARENA, "total_bytes": ARENA, "offsets": {}},
        "weights": weights,
        "cuda": {"modules": [_module(root, **images)],
                 "launches": [
                     launch("fake_add", [4], [64], [["arena", 256], ["input", 0],
                                                    ["weights", w["offset"]], ["i64", N]]),
                     launch("scalars", [2, 3, 4], [8, 4, 2], SCALARS),
                     launch("fake_copy", [1], [32], [["output", 0], ["arena", 256],
                                                     ["i64", N], ["i32", 4]],
                            shared=64 * 1024)]}}
    write_plan(root, manifest)
    return manifest


def dynamic_artifact(root: Path, graph_cache: int = 2) -> dict:
    """x[n], n in 1..256 -> y = x + w[:n]; variant 0 (n <= 64) at arena offset 0, variant 1
    at 2048, each with a kept-zero region of its own; grids and sizes from n; a `tail`
    launch whose grid n // 128 is empty below 128."""
    root.mkdir(parents=True, exist_ok=True)
    weights = _weights(root)
    w = weights["entries"]["w"]["offset"]

    def launches(at):
        return [launch("fake_add", ["((63 + n)//64)"], [64],
                       [["arena", at], ["input", 0], ["weights", w], ["size", 0]]),
                launch("tail", ["n//128", 2], [32], [["size", 0], ["arena", at]]),
                launch("fake_copy", [1], [32], [["output", 0], ["arena", at], ["size", 0],
                                                ["i32", 4]])]
    manifest = {
        "format_version": 1, "target": "cuda", "hidetc_version": "test",
        "inputs": [{"name": "x", "dtype": "float32", "shape": ["n"]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": ["n"]}],
        "memory": {"arena_bytes": ARENA, "total_bytes": ARENA,
                   "offsets": {"scratch.zeroed": 1024}, "bytes": {"scratch.zeroed": 64}},
        "weights": weights,
        "cuda": {"modules": [_module(root)], "launches": launches(0),
                 "variant_launches": [launches(2048)]},
        "dynamic": {"symbols": {"n": {"min": 1, "max": 256}}, "order": ["n"],
                    "graph_cache": graph_cache,
                    "variants": [{"guards": ["-64 + n <= 0"], "forward": "v0"},
                                 {"guards": ["-65 + n >= 0"], "forward": "v1",
                                  "arena_bytes": ARENA,
                                  "memory": {"offsets": {"scratch.zeroed": 3072},
                                             "bytes": {"scratch.zeroed": 512}}}]}}
    write_plan(root, manifest)
    return manifest


# ---------------------------------------------------------------- the API through ctypes


class Cuda:
    """The runtime, the fake driver and its trace for one test; frees what it made."""

    def __init__(self, lib, fake_so: Path, trace: Path, monkeypatch):
        self.lib, self.trace_path, self.env = lib, trace, monkeypatch
        self.fake = ctypes.CDLL(str(fake_so))      # the very .so the runtime dlopens
        self.fake.fake_cuda_live.argtypes, self.fake.fake_cuda_live.restype = \
            [ctypes.c_char_p], ctypes.c_long
        self.env_driver = str(fake_so)
        monkeypatch.setenv("HIDETC_CUDA_DRIVER", str(fake_so))
        monkeypatch.setenv("FAKE_CUDA_TRACE", str(trace))
        for name in ("FAKE_CUDA_CC", "FAKE_CUDA_FAIL", "FAKE_CUDA_FAIL_RC", "FAKE_CUDA_DEVICES",
                     "FAKE_CUDA_MAX_THREADS", "HIDETC_CUDA_SYNC_EACH"):
            monkeypatch.delenv(name, raising=False)
        self.models, self.contexts, self.buffers = [], [], []
        self.own_ctx = None

    # -- trace
    def lines(self) -> list[tuple[str, dict]]:
        if not self.trace_path.exists():
            return []
        out = []
        for line in self.trace_path.read_text().splitlines():
            head, *fields = line.split()
            out.append((head, dict(f.split("=", 1) for f in fields)))
        return out

    def clear(self) -> None:
        self.trace_path.unlink(missing_ok=True)

    def calls(self, name: str) -> list[dict]:
        return [kv for head, kv in self.lines() if head == name]

    def live(self, what: str) -> int:
        return int(self.fake.fake_cuda_live(what.encode()))

    # -- the API
    def error(self) -> str:
        return (self.lib.hidetc_last_error() or b"").decode()

    def load(self, root: Path):
        handle = ctypes.c_void_p()
        status = self.lib.hidetc_model_load(str(root).encode(), 0, ctypes.byref(handle))
        if status == OK:
            self.models.append(handle)
        return status, handle

    def model(self, root: Path):
        status, handle = self.load(root)
        assert status == OK, self.error()
        return handle

    def create(self, model, stream=None, io_on_device=0):
        options = ContextOptions(threads=0, stream=stream, io_on_device=io_on_device)
        handle = ctypes.c_void_p()
        status = self.lib.hidetc_context_create(model, ctypes.byref(options),
                                                ctypes.byref(handle))
        if status == OK:
            self.contexts.append(handle)
        return status, handle

    def context(self, model, **options):
        status, handle = self.create(model, **options)
        assert status == OK, self.error()
        return handle

    def set_shape(self, context, *dims) -> int:
        return self.lib.hidetc_context_set_input_shape(
            context, 0, len(dims), (ctypes.c_int64 * len(dims))(*dims))

    def run(self, context, inputs, outputs) -> int:
        ins = (ctypes.c_void_p * len(inputs))(*[_address(a) for a in inputs])
        outs = (ctypes.c_void_p * len(outputs))(*[_address(a) for a in outputs])
        return self.lib.hidetc_context_run(context, ins, outs)

    def free_context(self, context) -> None:
        self.contexts.remove(context)
        self.lib.hidetc_context_free(context)

    def free_model(self, model) -> None:
        self.models.remove(model)
        self.lib.hidetc_model_free(model)

    # -- the caller's own CUDA work (io_on_device, its stream, its workspace)
    def driver(self) -> None:
        """Retain the primary context and make it current, as an application would."""
        if self.own_ctx is None:
            ctx = ctypes.c_void_p()
            assert self.fake.cuInit(0) == 0
            assert self.fake.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
            self.own_ctx = ctx
        assert self.fake.cuCtxSetCurrent(self.own_ctx) == 0

    def device_alloc(self, nbytes: int) -> int:
        self.driver()
        ptr = ctypes.c_uint64()
        assert self.fake.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)) == 0
        self.buffers.append(ptr.value)
        return ptr.value

    def stream(self) -> int:
        self.driver()
        s = ctypes.c_void_p()
        assert self.fake.cuStreamCreate(ctypes.byref(s), 1) == 0
        self.buffers.append(("stream", s.value))
        return s.value

    def close(self) -> None:
        for context in reversed(self.contexts):
            self.lib.hidetc_context_free(context)
        for model in reversed(self.models):
            self.lib.hidetc_model_free(model)
        self.contexts, self.models = [], []
        if self.own_ctx is not None:
            self.fake.cuCtxSetCurrent(self.own_ctx)
            for b in self.buffers:
                if isinstance(b, tuple):
                    self.fake.cuStreamDestroy_v2(ctypes.c_void_p(b[1]))
                else:
                    self.fake.cuMemFree_v2(ctypes.c_uint64(b))
            self.fake.cuDevicePrimaryCtxRelease_v2(0)
            self.fake.cuCtxSetCurrent(None)
            self.own_ctx, self.buffers = None, []

    def assert_released(self) -> None:
        """Everything the runtime made is gone: the fake's live counts are zero."""
        self.close()
        for what in ("allocations", "modules", "streams", "events", "graphs", "execs",
                     "ctx_refs"):
            assert self.live(what) == 0, what


def _address(a) -> int:
    return a if isinstance(a, int) else a.ctypes.data


@pytest.fixture
def cuda(lib, fake_so, tmp_path, monkeypatch):
    c = Cuda(lib, fake_so, tmp_path / "trace.txt", monkeypatch)
    yield c
    c.close()


def host_outputs():
    return [np.full(N, np.nan, np.float32), np.full(N, np.nan, np.float32),
            np.full(8, np.nan, np.float32), np.full(N, np.nan, np.float32)]


def launches(cuda) -> list[dict]:
    return cuda.calls("launch")


def allocations(cuda) -> list[tuple[int, int]]:
    return [(int(kv["ptr"], 16), int(kv["bytes"])) for kv in cuda.calls("cuMemAlloc")]


def _staging(manifest: dict, largest: dict) -> tuple[list[int], list[int], int]:
    """The offsets of the inputs and outputs in a context's staging allocation (each at
    its largest shape, 256-byte aligned) and its size."""
    offsets, off = [], 0
    for spec in manifest["inputs"] + manifest["outputs"]:
        offsets.append(off)
        dims = [evaluate(d, largest) for d in parse_dims(spec["shape"], spec["name"])]
        size = int(np.prod(dims, dtype=np.int64)) * np.dtype(spec["dtype"]).itemsize
        off += -(-size // 256) * 256
    n = len(manifest["inputs"])
    return offsets[:n], offsets[n:], off
