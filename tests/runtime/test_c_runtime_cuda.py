"""The C runtime's cuda path (`runtime/c/cuda*.c`) without a GPU: against a fake CUDA driver
(`tests/helpers/fake_libcuda.c`, built here with gcc and named by HIDETC_CUDA_DRIVER)
whose device memory is host memory and which traces every call to a file. Hand-made
cuda artifacts (stand-in kernel images: no nvcc needed) whose `fake_add` / `fake_copy`
kernels the fake runs, so values flow end to end. Checked: the trace holds the plan's
launches in order with their grids, blocks, shared bytes and packed arguments (pointers =
the staged input/output buffers, arena + offset, weights + offset; scalars as a C struct);
a graph captured on the first pass (thread-local capture mode) and replayed after; a
dynamic artifact's grids and size arguments at the sizes set, its empty launches
skipped, its graphs in a bounded LRU, its kept-zero region zeroed on a variant change;
io_on_device with the caller's pointers (plain launches until a pointer set repeats);
the caller's stream; a caller's workspace; weights uploaded once per model whatever the
contexts; contexts used from other threads; the image chosen per compute capability;
every failure one line with the right status; nothing leaked (the fake counts)."""
from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers.onnx_util import matmul_relu_model

import hidetc
from hidetc.backends.runtime import c_build
from hidetc.backends.runtime.artifact import read_manifest
from hidetc.backends.runtime.c_executor import ContextOptions, open_runtime
from hidetc.backends.runtime.cuda.manifest import pack_args, parse_section
from hidetc.backends.runtime.plan_file import write_plan
from hidetc.backends.runtime.sizes import parse_dims
from hidetc.backends.runtime.weights import write_weights
from hidetc.graph.guards import Guard
from hidetc.graph.symbolic import evaluate

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc not installed: the C runtime and the fake CUDA "
                                       "driver are built with it")

FAKE_SOURCE = Path(__file__).resolve().parents[1] / "helpers" / "fake_libcuda.c"
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


def launch(kernel, grid, block, args, shared=0):
    return {"kernel": kernel, "module": "model", "grid": grid, "block": block,
            "shared_bytes": shared, "args": args}


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


# ---------------------------------------------------------------- static artifact


def test_static_pass_launches_the_plan_with_its_arguments_then_replays(cuda, tmp_path):
    root = tmp_path / "static"
    manifest = static_artifact(root)
    w_off = manifest["weights"]["entries"]["w"]["offset"]
    model = cuda.model(root)
    weight_bytes = (root / "weights.bin").stat().st_size
    [(weights, wb)] = allocations(cuda)
    assert wb == weight_bytes
    assert [(kv["dst"], int(kv["bytes"])) for kv in cuda.calls("cuMemcpyHtoD")] == \
        [(hex(weights), weight_bytes)]
    # one module (the sm_90 cubin on the default sm_90 fake); 64 KiB opted in once
    [module] = cuda.calls("cuModuleLoadData")
    assert module["head"] == IMAGES["sm_90"][:16].hex()
    assert [(kv["name"], kv["attribute"], kv["value"]) for kv in
            cuda.calls("cuFuncSetAttribute")] == [("fake_copy", "8", str(64 * 1024))]

    cuda.clear()
    context = cuda.context(model)
    (arena, arena_bytes), (io, nbytes) = allocations(cuda)
    ins, outs, total = _staging(manifest, {})
    assert (arena_bytes, nbytes) == (ARENA, total)
    assert {(int(kv["dst"], 16), int(kv["bytes"])) for kv in cuda.calls("cuMemsetD8")} == \
        {(arena, ARENA), (io, nbytes)}                             # zeroed once
    x_dev, y_dev = io + ins[0], io + outs[0]

    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    for run in range(3):
        cuda.clear()
        outputs = host_outputs()
        assert cuda.run(context, [x], outputs) == OK, cuda.error()
        np.testing.assert_array_equal(outputs[0], x + W[:N])
        np.testing.assert_array_equal(outputs[1], x)
        np.testing.assert_array_equal(outputs[2], C)
        np.testing.assert_array_equal(outputs[3], x + W[:N])
        heads = [h for h, _ in cuda.lines()]
        got = launches(cuda)
        assert [kv["kernel"] for kv in got] == ["fake_add", "scalars", "fake_copy"]
        assert [(kv["grid"], kv["block"], kv["shared"]) for kv in got] == [
            ("4,1,1", "64,1,1", "0"), ("2,3,4", "8,4,2", "0"), ("1,1,1", "32,1,1", "65536")]
        args = [bytes.fromhex(kv["args"]) for kv in got]
        assert args[0] == struct.pack("@QQQq", arena + 256, x_dev, weights + w_off, N)
        assert args[1] == struct.pack("@ifQIdqQ", -7, 0.5, x_dev, 3, 1.25, -1, 2**63 + 5)
        assert args[2] == struct.pack("@QQqi", y_dev, arena + 256, N, 4)
        assert all(kv["graph"] != "-" for kv in got)                  # replayed graphs
        assert len({kv["graph"] for kv in got}) == 1
        # copies: x in, y back (the other outputs are filled on the host)
        assert [(kv["dst"], kv["bytes"]) for kv in cuda.calls("cuMemcpyHtoD")] == \
            [(hex(x_dev), str(4 * N))]
        assert [(kv["src"], kv["bytes"]) for kv in cuda.calls("cuMemcpyDtoH")] == \
            [(hex(y_dev), str(4 * N))]
        assert heads[-1] == "cuStreamSynchronize"
        if run == 0:      # captured on the first pass, thread-local mode, then launched
            [begin] = cuda.calls("cuStreamBeginCapture")
            assert begin["mode"] == "1"
            assert [kv["kernel"] for kv in cuda.calls("capture")] == \
                ["fake_add", "scalars", "fake_copy"]
            assert heads.index("cuStreamEndCapture") < heads.index("cuGraphLaunch")
            graph = got[0]["graph"]
        else:             # later passes: the same graph, nothing captured
            assert "cuStreamBeginCapture" not in heads and "capture" not in heads
            assert [kv["exec"] for kv in cuda.calls("cuGraphLaunch")] == [graph]
    assert cuda.lib.hidetc_context_last_latency_ms(context) == 0.25
    cuda.assert_released()


def test_weights_are_uploaded_once_per_model_whatever_the_contexts(cuda, tmp_path):
    root = tmp_path / "static"
    static_artifact(root)
    model = cuda.model(root)
    weight_bytes = (root / "weights.bin").stat().st_size
    contexts = [cuda.context(model) for _ in range(3)]
    x = np.ones(N, np.float32)
    for context in contexts * 2:
        outputs = host_outputs()
        assert cuda.run(context, [x], outputs) == OK, cuda.error()
        np.testing.assert_array_equal(outputs[0], x + W[:N])
    uploads = [kv for kv in cuda.calls("cuMemcpyHtoD") if int(kv["bytes"]) == weight_bytes]
    assert len(uploads) == 1
    assert len(cuda.calls("cuModuleLoadData")) == 1
    assert len(cuda.calls("cuStreamBeginCapture")) == 3             # a graph per context
    assert cuda.live("streams") == 3 and cuda.live("execs") == 3
    for context in contexts:
        cuda.free_context(context)
    assert cuda.live("execs") == 0 and cuda.live("streams") == 0
    assert cuda.live("allocations") == 1                            # the weights
    cuda.assert_released()


def test_contexts_run_from_other_threads_at_once(cuda, tmp_path):
    """Contexts made on this thread, run on others (the fake's current context is per
    thread: each entry point makes it current), two threads at once."""
    root = tmp_path / "static"
    static_artifact(root)
    model = cuda.model(root)
    contexts = [cuda.context(model) for _ in range(2)]
    problems = []

    def work(k):
        x = np.full(N, float(k + 1), np.float32)
        for _ in range(20):
            outputs = host_outputs()
            status = cuda.run(contexts[k], [x], outputs)
            if status != OK or not np.array_equal(outputs[0], x + W[:N]):
                problems.append((k, status, cuda.error()))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    assert {kv["mode"] for kv in cuda.calls("cuStreamBeginCapture")} == {"1"}
    cuda.assert_released()


def test_caller_stream_runs_the_passes(cuda, tmp_path):
    root = tmp_path / "static"
    static_artifact(root)
    model = cuda.model(root)
    cuda.clear()
    stream = cuda.stream()
    [created] = cuda.calls("cuStreamCreate")
    cuda.clear()
    context = cuda.context(model, stream=stream)
    [own] = cuda.calls("cuStreamCreate")                   # setup work stays on its own
    assert own["stream"] != created["stream"]
    for _ in range(2):
        cuda.clear()
        outputs = host_outputs()
        assert cuda.run(context, [np.zeros(N, np.float32)], outputs) == OK, cuda.error()
        np.testing.assert_array_equal(outputs[0], W[:N])
        assert {kv["stream"] for kv in launches(cuda)} == {created["stream"]}
        assert {kv["stream"] for kv in cuda.calls("cuStreamSynchronize")} == {created["stream"]}
    cuda.assert_released()


def test_io_on_device_uses_the_callers_pointers(cuda, tmp_path):
    """Device pointers in and out; outputs no kernel writes copied device to device; a
    pointer set captured on its second pass, replayed after; new pointers launch plainly."""
    root = tmp_path / "static"
    manifest = static_artifact(root)
    c_off = manifest["weights"]["entries"]["c"]["offset"]
    model = cuda.model(root)
    [(weights, _)] = allocations(cuda)
    context = cuda.context(model, io_on_device=1)
    assert len(allocations(cuda)) == 2                      # weights, arena: no staging
    x = np.arange(N, dtype=np.float32)
    x_dev = cuda.device_alloc(4 * N)
    ctypes.memmove(x_dev, x.ctypes.data, 4 * N)
    sets = [[cuda.device_alloc(4 * N), cuda.device_alloc(4 * N), cuda.device_alloc(32),
             cuda.device_alloc(4 * N)] for _ in range(2)]

    def host(ptr, n):
        return np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr)).copy()

    expect_graph = ["-", "captured", "replayed", "-", "captured"]
    for run, outs in enumerate([sets[0], sets[0], sets[0], sets[1], sets[1]]):
        cuda.clear()
        assert cuda.run(context, [x_dev], outs) == OK, cuda.error()
        np.testing.assert_array_equal(host(outs[0], N), x + W[:N])
        np.testing.assert_array_equal(host(outs[1], N), x)
        np.testing.assert_array_equal(host(outs[2], 8), C)
        np.testing.assert_array_equal(host(outs[3], N), x + W[:N])
        got = launches(cuda)
        assert bytes.fromhex(got[0]["args"])[8:16] == struct.pack("@Q", x_dev)
        assert bytes.fromhex(got[2]["args"])[:8] == struct.pack("@Q", outs[0])
        assert not cuda.calls("cuMemcpyHtoD") and not cuda.calls("cuMemcpyDtoH")
        assert [(int(kv["dst"], 16), int(kv["src"], 16)) for kv in cuda.calls("cuMemcpyDtoD")] \
            == [(outs[1], x_dev), (outs[2], weights + c_off), (outs[3], outs[0])]
        captured = bool(cuda.calls("cuStreamBeginCapture"))
        mode = "-" if got[0]["graph"] == "-" else "captured" if captured else "replayed"
        assert mode == expect_graph[run], run
    cuda.assert_released()


def test_caller_workspace_replaces_the_arena(cuda, tmp_path):
    root = tmp_path / "static"
    static_artifact(root)
    model = cuda.model(root)
    context = cuda.context(model)
    (arena, _), _ = allocations(cuda)[1:]
    x = np.ones(N, np.float32)
    assert cuda.run(context, [x], host_outputs()) == OK
    workspace = cuda.device_alloc(ARENA)
    cuda.clear()
    assert cuda.lib.hidetc_context_set_workspace(context, workspace, ARENA) == OK, cuda.error()
    assert [(int(kv["dst"], 16), int(kv["bytes"])) for kv in cuda.calls("cuMemsetD8")] == \
        [(workspace, ARENA)]                                        # zeroed when set
    assert [int(kv["ptr"], 16) for kv in cuda.calls("cuMemFree")] == [arena]
    assert len(cuda.calls("cuGraphExecDestroy")) == 1               # held the old arena
    cuda.clear()
    outputs = host_outputs()
    assert cuda.run(context, [x], outputs) == OK, cuda.error()
    np.testing.assert_array_equal(outputs[0], x + W[:N])
    assert bytes.fromhex(launches(cuda)[0]["args"])[:8] == struct.pack("@Q", workspace + 256)
    assert cuda.calls("cuStreamBeginCapture")                       # captured again
    # too small for the pass: refused at run
    assert cuda.lib.hidetc_context_set_workspace(context, workspace, 1024) == OK
    assert cuda.run(context, [x], host_outputs()) == MEMORY
    assert "1024" in cuda.error() and str(ARENA) in cuda.error()
    # back to an arena of its own: allocated and zeroed again
    cuda.clear()
    assert cuda.lib.hidetc_context_set_workspace(context, None, 0) == OK, cuda.error()
    [(arena2, size)] = allocations(cuda)
    assert size == ARENA
    assert [int(kv["dst"], 16) for kv in cuda.calls("cuMemsetD8")] == [arena2]
    outputs = host_outputs()
    assert cuda.run(context, [x], outputs) == OK, cuda.error()
    np.testing.assert_array_equal(outputs[0], x + W[:N])
    cuda.assert_released()


# ---------------------------------------------------------------- dynamic artifact


def test_dynamic_grids_sizes_variants_and_graph_cache(cuda, tmp_path):
    root = tmp_path / "dynamic"
    manifest = dynamic_artifact(root, graph_cache=2)
    w_off = manifest["weights"]["entries"]["w"]["offset"]
    model = cuda.model(root)
    [(weights, _)] = allocations(cuda)
    context = cuda.context(model)
    (arena, _), (io, nbytes) = allocations(cuda)[1:]
    assert nbytes == 2 * 1024                       # x and y at n = 256
    x_dev, y_dev = io, io + 1024
    execs = {}
    # the kept-zero region of the pass's variant is zeroed when the variant changes (the
    # first pass: the arena is all zero already)
    zeroed_regions = [[], [(1024, 64)], [(3072, 512)], [], [(1024, 64)]]
    for n, regions in zip((100, 5, 100, 200, 5), zeroed_regions):
        cuda.clear()
        assert cuda.set_shape(context, n) == OK, cuda.error()
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        y = np.full(n, np.nan, np.float32)
        assert cuda.run(context, [x], [y]) == OK, cuda.error()
        np.testing.assert_array_equal(y, x + W[:n])
        at = 0 if n <= 64 else 2048
        got = launches(cuda)
        expected = [("fake_add", f"{(63 + n) // 64},1,1"), ("fake_copy", "1,1,1")]
        if n >= 128:                                      # n // 128 == 0: skipped
            expected.insert(1, ("tail", f"{n // 128},2,1"))
        assert [(kv["kernel"], kv["grid"]) for kv in got] == expected
        assert bytes.fromhex(got[0]["args"]) == struct.pack("@QQQq", arena + at, x_dev,
                                                            weights + w_off, n)
        assert bytes.fromhex(got[-1]["args"]) == struct.pack("@QQqi", y_dev, arena + at, n, 4)
        assert [kv["bytes"] for kv in cuda.calls("cuMemcpyHtoD")] == [str(4 * n)]
        assert [kv["bytes"] for kv in cuda.calls("cuMemcpyDtoH")] == [str(4 * n)]
        assert [(int(kv["dst"], 16) - arena, int(kv["bytes"]))
                for kv in cuda.calls("cuMemsetD8")] == regions, n
        execs.setdefault(n, []).append(got[0]["graph"])
    # graph cache of 2: 100, 5 captured; 100 replayed; 200 evicts 5; 5 again evicts 100
    assert execs[100][0] == execs[100][1]
    assert execs[5][0] != execs[5][1]
    assert cuda.live("execs") == 2
    cuda.assert_released()


def test_a_pass_with_every_launch_empty_launches_nothing(cuda, tmp_path):
    root = tmp_path / "dynamic"
    manifest = dynamic_artifact(root)
    manifest["cuda"]["launches"] = [launch("tail", ["n//128"], [32], [["size", 0]])]
    write_plan(root, manifest)
    context = cuda.context(cuda.model(root))
    for _ in range(2):
        cuda.clear()
        assert cuda.set_shape(context, 5) == OK
        y = np.full(5, np.nan, np.float32)
        assert cuda.run(context, [np.ones(5, np.float32)], [y]) == OK, cuda.error()
        heads = {h for h, _ in cuda.lines()}
        assert not heads & {"launch", "cuStreamBeginCapture", "cuGraphLaunch"}
        np.testing.assert_array_equal(y, 0)          # the staged buffer, zeroed once
    cuda.assert_released()


def test_dynamic_shape_outside_its_range_is_refused(cuda, tmp_path):
    root = tmp_path / "dynamic"
    dynamic_artifact(root)
    context = cuda.context(cuda.model(root))
    assert cuda.set_shape(context, 257) == SHAPE
    assert "257" in cuda.error()
    cuda.assert_released()


# ---------------------------------------------------------------- images and the machine


@pytest.mark.parametrize("cc, image", [(90, "sm_90"), (86, "sm_80"), (80, "sm_80"),
                                       (100, "compute_90"), (120, "compute_90")])
def test_image_for_the_compute_capability(cuda, tmp_path, monkeypatch, cc, image):
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("FAKE_CUDA_CC", str(cc))
    cuda.model(root)
    [module] = cuda.calls("cuModuleLoadData")
    assert module["head"] == IMAGES[image][:16].hex()
    cuda.assert_released()


@pytest.mark.parametrize("cc, images, message", [
    (70, {}, "is sm_70, which hidetc does not support"),
    (120, {"ptx": False}, "has sm_80, sm_90 but Fake GPU (sm_120) is sm_120; recompile with "
                          "--arch sm_120"),
    (89, {"archs": ("sm_90",), "ptx": True}, "has sm_90 and PTX compute_90 but Fake GPU "
                                             "(sm_89) is sm_89")])
def test_no_image_for_the_gpu_is_a_machine_error(cuda, tmp_path, monkeypatch, cc, images,
                                                 message):
    root = tmp_path / "static"
    static_artifact(root, **images)
    monkeypatch.setenv("FAKE_CUDA_CC", str(cc))
    status, _ = cuda.load(root)
    assert status == MACHINE
    assert message in cuda.error() and "\n" not in cuda.error()
    cuda.assert_released()


def test_missing_driver_or_gpu_is_a_machine_error(cuda, tmp_path, monkeypatch):
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("HIDETC_CUDA_DRIVER", "/nonexistent/libcuda.so.1")
    status, _ = cuda.load(root)
    assert status == MACHINE
    error = cuda.error()
    assert "/nonexistent/libcuda.so.1" in error and "CUDA driver cannot be loaded" in error
    assert "\n" not in error and str(root) in error
    monkeypatch.setenv("HIDETC_CUDA_DRIVER", cuda.env_driver)
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "0")
    assert cuda.load(root)[0] == MACHINE
    assert "no CUDA GPU is visible (no CUDA device found)" in cuda.error()
    monkeypatch.setenv("FAKE_CUDA_DEVICES", "1")
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuInit")
    monkeypatch.setenv("FAKE_CUDA_FAIL_RC", "100")
    assert cuda.load(root)[0] == MACHINE
    assert "CUDA_ERROR_NO_DEVICE" in cuda.error()
    cuda.assert_released()


def test_driver_without_an_entry_point_is_a_machine_error(cuda, tmp_path, monkeypatch):
    old = tmp_path / "libfakecuda_old.so"
    subprocess.run(["gcc", "-std=c11", "-O1", "-fPIC", "-shared", "-pthread",
                    "-DFAKE_CUDA_OLD_DRIVER", str(FAKE_SOURCE), "-o", str(old)], check=True)
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("HIDETC_CUDA_DRIVER", str(old))
    assert cuda.load(root)[0] == MACHINE
    assert f"the CUDA driver {old} has no cuGraphInstantiateWithFlags" in cuda.error()
    cuda.assert_released()


def test_block_over_the_kernels_limit_is_a_machine_error(cuda, tmp_path, monkeypatch):
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("FAKE_CUDA_MAX_THREADS", "32")
    assert cuda.load(root)[0] == MACHINE
    assert "launch 0 (fake_add): a block of 64 threads but the kernel allows at most 32" \
        in cuda.error()
    cuda.assert_released()


# ---------------------------------------------------------------- driver failures


@pytest.mark.parametrize("call, message", [
    ("cuModuleLoadData", "kernels/sm_90.cubin: loading the cubin of module 'model': "
                         "cuModuleLoadData failed on Fake GPU (sm_90): CUDA_ERROR_INVALID_VALUE"),
    ("cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain failed"),
    ("cuModuleGetFunction", "launch 0 (fake_add): kernel 'fake_add' of module 'model': "
                            "cuModuleGetFunction failed"),
    ("cuMemcpyHtoDAsync", "uploading the weights"),
    ("cuFuncSetAttribute", "launch 2 (fake_copy) needs 65536 bytes of dynamic shared memory")])
def test_failing_call_at_load_names_it(cuda, tmp_path, monkeypatch, call, message):
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("FAKE_CUDA_FAIL", call)
    status, _ = cuda.load(root)
    assert status == (MACHINE if call == "cuFuncSetAttribute" else DEVICE)
    assert message in cuda.error() and "\n" not in cuda.error()
    cuda.assert_released()


def test_failing_calls_in_a_pass_name_the_call_and_launch(cuda, tmp_path, monkeypatch):
    root = tmp_path / "static"
    static_artifact(root)
    model = cuda.model(root)
    context = cuda.context(model)
    x = np.ones(N, np.float32)
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuLaunchKernel@2")
    assert cuda.run(context, [x], host_outputs()) == DEVICE
    assert cuda.error() == ("launch 1 (scalars, grid [2, 3, 4], block [8, 4, 2], 0 B dynamic "
                            "shared memory): cuLaunchKernel failed on Fake GPU (sm_90): "
                            "CUDA_ERROR_INVALID_VALUE")
    assert cuda.live("graphs") == 0 and cuda.live("execs") == 0     # the capture undone
    monkeypatch.delenv("FAKE_CUDA_FAIL")
    outputs = host_outputs()
    assert cuda.run(context, [x], outputs) == OK, cuda.error()      # the context goes on
    np.testing.assert_array_equal(outputs[0], x + W[:N])
    for call, rc, where in [("cuGraphLaunch", 1, "replaying the forward pass"),
                            ("cuMemcpyHtoDAsync", 1, "input 'x' (256 bytes)"),
                            ("cuMemcpyDtoHAsync", 1, "output 'y' (256 bytes)"),
                            ("cuStreamSynchronize", 700, "a kernel fault")]:
        monkeypatch.setenv("FAKE_CUDA_FAIL", f"{call}@1")
        monkeypatch.setenv("FAKE_CUDA_FAIL_RC", str(rc))
        assert cuda.run(context, [x], host_outputs()) == DEVICE, call
        assert call in cuda.error() and where in cuda.error(), cuda.error()
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuMemAlloc@1")
    monkeypatch.setenv("FAKE_CUDA_FAIL_RC", "2")
    assert cuda.create(model)[0] == MEMORY
    assert cuda.error() == (f"out of GPU memory: {ARENA} bytes for the activation arena but "
                            f"only 1073741824 of 17179869184 bytes are free on Fake GPU (sm_90)")
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuMemAlloc@2")
    monkeypatch.setenv("FAKE_CUDA_FAIL_RC", "1")
    assert cuda.create(model)[0] == DEVICE
    assert "allocating the input and output buffers" in cuda.error()
    assert cuda.live("streams") == 1 and cuda.live("events") == 2   # the good context's
    cuda.assert_released()


def test_capture_failure_falls_back_to_plain_launches(cuda, tmp_path, monkeypatch):
    root = tmp_path / "static"
    static_artifact(root)
    context = cuda.context(cuda.model(root))
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuGraphInstantiateWithFlags")
    x = np.ones(N, np.float32)
    for _ in range(2):
        cuda.clear()
        outputs = host_outputs()
        assert cuda.run(context, [x], outputs) == OK, cuda.error()
        np.testing.assert_array_equal(outputs[0], x + W[:N])
        assert {kv["graph"] for kv in launches(cuda)} == {"-"}
    assert len(cuda.calls("cuStreamBeginCapture")) == 0             # not tried again
    assert cuda.live("graphs") == 0
    cuda.assert_released()


def test_sync_each_launches_plainly_and_waits_after_each(cuda, tmp_path, monkeypatch):
    root = tmp_path / "static"
    static_artifact(root)
    monkeypatch.setenv("HIDETC_CUDA_SYNC_EACH", "1")
    context = cuda.context(cuda.model(root))
    cuda.clear()
    assert cuda.run(context, [np.ones(N, np.float32)], host_outputs()) == OK, cuda.error()
    heads = [h for h, _ in cuda.lines()]
    assert "cuStreamBeginCapture" not in heads
    seq = [h for h in heads if h in ("launch", "cuStreamSynchronize")]
    assert seq == ["launch", "cuStreamSynchronize"] * 3 + ["cuStreamSynchronize"]
    monkeypatch.setenv("FAKE_CUDA_FAIL", "cuStreamSynchronize@2")
    monkeypatch.setenv("FAKE_CUDA_FAIL_RC", "700")
    assert cuda.run(context, [np.ones(N, np.float32)], host_outputs()) == DEVICE
    assert cuda.error().startswith("launch 1 (scalars, grid [2, 3, 4]")
    assert "CUDA_ERROR_ILLEGAL_ADDRESS (a kernel fault" in cuda.error()
    cuda.assert_released()


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
