"""The CUDA runtime. Without a GPU: the `cuda` manifest section, image selection, argument
packing, the one-line errors when pycuda or the GPU is missing, and the executor's whole
flow (staging, graph capture and replay, failures) against a fake pycuda driver whose
"kernels" are Python. With a GPU (`pytest -m gpu`): hand-written kernels compiled by
hidetc.toolchain.nvcc, run through CudaExecutor and compared with numpy."""
import json
import os
import re
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hidetc.errors import ArtifactError, InputError
from hidetc.runtime.cuda import driver
from hidetc.runtime.cuda import executor as cuda_executor
from hidetc.runtime.cuda.executor import CudaExecutor
from hidetc.runtime.cuda.manifest import ModuleSpec, pack_args, parse_section, select_image
from hidetc.runtime.weights import write_weights
from hidetc.toolchain.cache import BuildCache
from hidetc.toolchain.nvcc import compile_cubins

N = 16384                     # floats: relu_reverse stages them in 64 KiB of shared memory
ROOT = str(Path(__file__).resolve().parents[2])


def _launch(kernel, grid, block, args, shared=0):
    return {"kernel": kernel, "module": "model", "grid": grid, "block": block,
            "shared_bytes": shared, "args": args}


def _pipeline(w_offset, extra=()):
    return [_launch("scale_bias", [N // 256], [256],
                    [["input", 0], ["weights", w_offset], ["arena", 0], ["i32", N]]),
            *extra,
            _launch("relu_reverse", [1], [256], [["arena", 0], ["output", 0], ["i32", N]],
                    shared=4 * N)]


def _artifact(root: Path, cubins: dict, launches=None, ptx=None, arena=4 * N) -> dict:
    """A hand-made cuda manifest + weights.bin (w = scale then bias) under `root`."""
    w = np.linspace(-1, 1, 2 * N, dtype=np.float32)
    entries = write_weights(root / "weights.bin", {"w": w})
    module = {"name": "model", "cubins": cubins}
    if ptx:
        module["ptx"] = ptx
    return {"target": "cuda",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [N]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [N]}],
            "memory": {"arena_bytes": arena, "total_bytes": arena, "offsets": {}},
            "weights": {"file": "weights.bin",
                        "entries": {k: e.to_dict() for k, e in entries.items()}},
            "cuda": {"modules": [module],
                     "launches": launches or _pipeline(entries["w"].offset)}}


def _expected(x: np.ndarray) -> np.ndarray:
    w = np.linspace(-1, 1, 2 * N, dtype=np.float32)
    return np.maximum(x * w[:N] + w[N:], 0)[::-1]


# ---------------------------------------------------------------- manifest (pure)


def test_section_errors_name_the_launch():
    base = {"cuda": {"modules": [{"name": "model", "cubins": {"sm_90": "a.cubin"}}],
                     "launches": []}}
    assert parse_section(base).launches == ()
    cases = [(_launch("k", [1], [2048], []), "launch 0 (k): grid [1, 1, 1] / block [2048"),
             (_launch("k", [0], [1], []), "grid must be 1 to 3 positive integers"),
             (_launch("k", [1], [1], [["heap", 0]]), "unknown argument kind 'heap'"),
             (_launch("k", [1], [1], [["i32", 1.5]]), "i32 value must be an integer"),
             ({**_launch("k", [1], [1], []), "module": "nope"}, "unknown module 'nope'")]
    for raw, message in cases:
        base["cuda"]["launches"] = [raw]
        with pytest.raises(ArtifactError, match=re.escape(message)):
            parse_section(base)
    with pytest.raises(ArtifactError, match="needs a 'cuda' section"):
        parse_section({})


def test_image_selection():
    both = ModuleSpec("m", {"sm_80": "80.cubin", "sm_90": "90.cubin"}, ("compute_90", "m.ptx"))
    assert select_image(both, (9, 0)) == ("90.cubin", "cubin sm_90")
    assert select_image(both, (8, 6))[0] == "80.cubin"          # same major, older minor
    assert select_image(both, (10, 0))[0] == "m.ptx"            # newer GPU: JIT the PTX
    with pytest.raises(ArtifactError, match="sm_75, which hidetc does not support"):
        select_image(both, (7, 5), "Tesla T4")
    only80 = ModuleSpec("m", {"sm_80": "80.cubin"})
    with pytest.raises(ArtifactError, match="artifact has sm_80 but this GPU is sm_90; "
                                            "recompile with --arch sm_90"):
        select_image(only80, (9, 0))


def test_pack_args_follows_the_c_abi():
    section = parse_section({"cuda": {"modules": [{"name": "model", "cubins": {"sm_90": "x"}}],
                                      "launches": [_launch("k", [1], [1], [
                                          ["i32", 7], ["input", 0], ["weights", 64],
                                          ["f32", 0.5], ["arena", 16], ["output", 1]])]}})
    (spec,) = section.launches
    buf = pack_args(spec, [1000], [2000, 3000], (4096, 64), (8192, 128))
    assert struct.unpack("@iQQfQQ", buf) == (7, 1000, 8192 + 64, 0.5, 4096 + 16, 3000)
    assert len(buf) == 4 + 4 + 8 + 8 + 4 + 4 + 8 + 8        # padding before each pointer
    with pytest.raises(ArtifactError, match="points past the arena"):
        pack_args(spec, [1000], [2000, 3000], (4096, 8), (8192, 128))


# ---------------------------------------------------------------- missing pycuda / GPU


def test_missing_pycuda_is_one_line(tmp_path):
    try:
        import pycuda  # noqa: F401
        pytest.skip("pycuda is installed here")
    except ImportError:
        pass
    with pytest.raises(ArtifactError, match=r"^pycuda is not installed: pip install "
                                            r"'hidetc\[cuda\]'$"):
        CudaExecutor(tmp_path, _artifact(tmp_path, {"sm_90": "a.cubin"}))


def test_missing_driver_or_gpu_messages():
    def no_libcuda(name):
        raise ImportError("libcuda.so.1: cannot open shared object file: No such file")
    with pytest.raises(ArtifactError, match=r"^this artifact targets cuda but no CUDA GPU is "
                                            r"visible \(pycuda: libcuda.so.1: cannot open"):
        driver.import_pycuda_driver(no_libcuda)

    def no_pytools(name):
        raise ModuleNotFoundError("No module named 'pytools'", name="pytools")
    with pytest.raises(ArtifactError, match="pycuda cannot be imported"):
        driver.import_pycuda_driver(no_pytools)
    fake = FakeDriver(init_error="cuInit failed: no CUDA-capable device is detected")
    with pytest.raises(ArtifactError, match="no CUDA GPU is visible .pycuda: cuInit failed"):
        driver._open(lambda name: fake)


# ---------------------------------------------------------------- fake pycuda driver


class FakeDriver:
    """Enough of pycuda.driver for the executor; memory is host bytes, kernels Python."""
    class Error(Exception):
        pass

    class MemoryError(Error):
        pass

    class LaunchError(Error):
        pass

    function_attribute = SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES=8, MAX_THREADS_PER_BLOCK=0)

    def __init__(self, capability=(9, 0), memory=1 << 28, init_error=None):
        fake = self
        self.memory, self.init_error, self.blocks = memory, init_error, {}
        self.next, self.capturing, self.launched, self.pending = 1 << 20, None, [], None
        self.Device = type("Device", (), {
            "count": staticmethod(lambda: 1), "__init__": lambda s, i: None,
            "compute_capability": lambda s: capability, "name": lambda s: "Fake GPU",
            "retain_primary_context": lambda s: SimpleNamespace(push=lambda: None)})
        self.Context = SimpleNamespace(synchronize=lambda: None, pop=lambda: None)

        class Stream:
            handle = 1234

            def __init__(self, flags=0):
                pass

            def synchronize(self):
                if fake.pending:
                    raise fake.pending
        self.Stream = Stream
        self.Event = lambda: SimpleNamespace(record=lambda stream: None,
                                             time_since=lambda other: 0.25)

    def init(self):
        if self.init_error:
            raise self.Error(self.init_error)

    def _find(self, ptr, n):
        for base, block in self.blocks.items():
            if base <= ptr and ptr + n <= base + len(block):
                return block, ptr - base
        raise AssertionError(f"bad device access {ptr:#x}+{n}")

    def read(self, ptr, n, dtype=np.uint8):
        block, off = self._find(ptr, n)
        return np.frombuffer(bytes(block[off:off + n]), dtype)

    def write(self, ptr, data):
        data = bytes(memoryview(np.ascontiguousarray(data)).cast("B"))
        block, off = self._find(ptr, len(data))
        block[off:off + len(data)] = data

    def mem_alloc(self, n):
        if n > self.memory:
            raise self.MemoryError("cuMemAlloc failed: out of memory")
        base, self.next = self.next, self.next + n + (1 << 20)
        self.blocks[base] = bytearray(n)
        return _Alloc(base)

    def mem_get_info(self):
        return self.memory, 2 * self.memory

    def memset_d8(self, ptr, value, n):
        self.write(ptr, np.full(n, value, np.uint8))

    def memcpy_htod(self, ptr, src, stream=None):
        self.write(ptr, np.asarray(src))

    memcpy_htod_async = memcpy_htod

    def memcpy_dtoh_async(self, dst, ptr, stream=None):
        dst[...] = self.read(ptr, dst.nbytes)

    def pagelocked_empty(self, n, dtype):
        return np.zeros(n, dtype)

    def module_from_file(self, path):
        assert Path(path).is_file()
        return SimpleNamespace(get_function=self._function)

    def _function(self, name):
        if name not in KERNELS:
            raise self.Error("cuModuleGetFunction failed: named symbol not found")

        def launch(grid, block, args, shared, stream):
            thunk = (name, lambda: KERNELS[name](self, args))
            if self.capturing is not None:
                self.capturing.append(thunk)
            else:
                self.launched.append(name)
                thunk[1]()
        return SimpleNamespace(_launch_kernel=launch, set_attribute=lambda a, v: None,
                               get_attribute=lambda a: 1024)


class _Alloc(int):
    def free(self):
        pass


def _scale_bias(fake, args):
    x, w, tmp, n = struct.unpack("@QQQi", args)
    wv = fake.read(w, 8 * n, np.float32)
    fake.write(tmp, fake.read(x, 4 * n, np.float32) * wv[:n] + wv[n:])


def _relu_reverse(fake, args):
    tmp, y, n = struct.unpack("@QQi", args)
    fake.write(y, np.maximum(fake.read(tmp, 4 * n, np.float32), 0)[::-1].copy())


def _trap_if_positive(fake, args):
    (x,) = struct.unpack("@Q", args)
    if fake.read(x, 4, np.float32)[0] > 0:
        fake.pending = fake.LaunchError("cuStreamSynchronize failed: unspecified launch failure")


KERNELS = {"scale_bias": _scale_bias, "relu_reverse": _relu_reverse,
           "trap_if_positive": _trap_if_positive}


class FakeGraphs:
    def __init__(self, fake):
        self.fake, self.graphs, self.destroyed = fake, {}, []

    def capture(self, stream, body):
        self.fake.capturing = []
        try:
            body()
        finally:
            recorded, self.fake.capturing = self.fake.capturing, None
        handle = 100 + len(self.graphs)
        self.graphs[handle] = recorded
        return handle

    def launch(self, executable, stream):
        for name, thunk in self.graphs[executable.value]:
            self.fake.launched.append(name)
            thunk()
        return 0

    def destroy(self, handle):
        self.destroyed.append(handle)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    drv = FakeDriver()
    graphs = FakeGraphs(drv)
    monkeypatch.setattr(driver, "_SESSION", None)
    monkeypatch.setattr(driver, "_graph_api", lambda: (graphs, None))
    driver.session(importer=lambda name: drv)
    (tmp_path / "a.cubin").write_bytes(b"fake cubin")
    drv.graphs = graphs
    return drv


def test_fake_flow_graph_replay_matches_numpy(fake, tmp_path):
    ex = CudaExecutor(tmp_path, _artifact(tmp_path, {"sm_90": "a.cubin"}))
    assert ex.uses_graph and fake.launched == ["scale_bias", "relu_reverse"] * 2  # warm-up
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal(N, dtype=np.float32)
        np.testing.assert_array_equal(ex.run({"x": x})["y"], _expected(x))
    assert ex.last_latency_ms == 0.25 and len(fake.launched) == 8
    ex.close()
    assert fake.graphs.destroyed == [100]


def test_fake_other_thread_and_measure(fake, tmp_path):
    ex = CudaExecutor(tmp_path, _artifact(tmp_path, {"sm_90": "a.cubin"}))
    x = np.ones(N, np.float32)
    result = {}
    worker = threading.Thread(target=lambda: result.update(ex.run({"x": x})))
    worker.start()
    worker.join()
    np.testing.assert_array_equal(result["y"], _expected(x))
    assert ex.measure(repeat=3, warmup=1) == [0.25] * 3


def test_fake_profile_times_each_launch_outside_the_graph(fake, tmp_path):
    ex = CudaExecutor(tmp_path, _artifact(tmp_path, {"sm_90": "a.cubin"}))
    fake.launched.clear()
    x = np.random.default_rng(3).standard_normal(N, dtype=np.float32)
    assert ex.profile({"x": x}, repeat=3) == [0.25, 0.25]    # the fake's event interval
    assert fake.launched == ["scale_bias", "relu_reverse"] * 4  # warm-up + 3, not replays
    np.testing.assert_array_equal(fake.read(ex._outputs[0].device, 4 * N, np.float32),
                                  _expected(x))
    with pytest.raises(InputError, match=r"input 'x': expected shape \[16384\], got \[7\]"):
        ex.profile({"x": x[:7]})


def test_fake_flow_without_graph_api(fake, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(driver._SESSION, "graphs", None)
    monkeypatch.setattr(driver._SESSION, "graph_unavailable", "no cuGraphLaunch")
    ex = CudaExecutor(tmp_path, _artifact(tmp_path, {"sm_90": "a.cubin"}))
    assert not ex.uses_graph and ex.graph_unavailable == "no cuGraphLaunch"
    x = np.ones(N, np.float32)
    np.testing.assert_array_equal(ex.run({"x": x})["y"], _expected(x))


def test_fake_replay_fault_is_located_and_final(fake, tmp_path, monkeypatch):
    manifest = _artifact(tmp_path, {"sm_90": "a.cubin"})
    offset = manifest["cuda"]["launches"][0]["args"][1][1]
    manifest["cuda"]["launches"] = _pipeline(offset, [
        _launch("trap_if_positive", [1], [1], [["input", 0]])])
    seen = []
    monkeypatch.setattr(cuda_executor, "locate_failure",
                        lambda path, m, inputs, timeout: seen.append((inputs, timeout)) or
                        "kernel launch 1 failed")
    ex = CudaExecutor(tmp_path, manifest, locate_timeout_s=42)  # zero inputs: warm-up passes
    with pytest.raises(ArtifactError, match="^kernel launch 1 failed$"):
        ex.run({"x": np.ones(N, np.float32)})
    assert seen and seen[0][0]["x"][0] == 1 and seen[0][1] == 42
    for retry in (lambda: ex.run({"x": np.ones(N, np.float32)}),
                  lambda: CudaExecutor(tmp_path, manifest)):
        with pytest.raises(ArtifactError, match="unusable in this process after a GPU fault"):
            retry()


def test_fake_warm_up_fault_names_the_kernel(fake, tmp_path):
    manifest = _artifact(tmp_path, {"sm_90": "a.cubin"})
    manifest["cuda"]["launches"].insert(1, _launch("trap_if_positive", [1], [1],
                                                   [["weights", 4 * (2 * N - 1)]]))
    with pytest.raises(ArtifactError, match=r"kernel launch 1 \(trap_if_positive, grid "
                                            r"\[1, 1, 1\], block \[1, 1, 1\].*launch failure"):
        CudaExecutor(tmp_path, manifest)


def test_fake_errors(fake, tmp_path):
    manifest = _artifact(tmp_path, {"sm_90": "a.cubin"}, arena=1 << 40)
    with pytest.raises(ArtifactError, match=r"out of GPU memory: the activation arena needs "
                                            r"1,099,511,627,776 bytes but only 268,435,456 of"):
        CudaExecutor(tmp_path, manifest)
    manifest = _artifact(tmp_path, {"sm_90": "a.cubin"})
    manifest["cuda"]["launches"][0]["kernel"] = "missing"
    with pytest.raises(ArtifactError, match="kernel 'missing' is not in module 'model'"):
        CudaExecutor(tmp_path, manifest)
    with pytest.raises(ArtifactError, match="missing.cubin: listed in the manifest but missing"):
        CudaExecutor(tmp_path, _artifact(tmp_path, {"sm_90": "missing.cubin"}))


# ---------------------------------------------------------------- on a real GPU

CUDA_SOURCE = r"""
extern "C" __global__ void scale_bias(const float *x, const float *w, float *tmp, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) tmp[i] = x[i] * w[i] + w[n + i];
}
extern "C" __global__ void relu_reverse(const float *tmp, float *y, int n) {
  extern __shared__ float s[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = tmp[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = s[n - 1 - i];
    y[i] = v > 0.f ? v : 0.f;
  }
}
extern "C" __global__ void trap_if_positive(const float *x) { if (x[0] > 0.f) __trap(); }
"""


@pytest.fixture(scope="module")
def gpu_kernels(tmp_path_factory):
    reason = None
    try:
        gpu = driver.session()
    except ArtifactError as exc:
        reason = str(exc)
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("cuda_artifact")
    built = compile_cubins({"model": CUDA_SOURCE}, [gpu.arch], root / "kernels",
                           cache=BuildCache(root / "cache"))
    rel = str(built[gpu.arch]["model"].relative_to(root))
    return root, gpu, {gpu.arch: rel}


def _child(code: str, *args: str, env=None) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               **(env or {}))
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=300, env=env)
    return proc.stdout + proc.stderr


CHILD = """
import json, sys
from pathlib import Path
import numpy as np
from hidetc.errors import HidetcError
from hidetc.runtime.cuda import CudaExecutor
try:
    ex = CudaExecutor(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))
    for _ in range(2):
        ex.run({"x": np.ones(%d, np.float32)})
except HidetcError as exc:
    print("ERROR:", exc)
""" % N


@pytest.mark.gpu
def test_gpu_graph_matches_numpy_and_replays_cheaply(gpu_kernels):
    root, gpu, cubins = gpu_kernels
    ex = CudaExecutor(root, _artifact(root, cubins))
    assert ex.uses_graph, ex.graph_unavailable
    eager = CudaExecutor(root, _artifact(root, cubins), use_graph=False)
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal(N, dtype=np.float32)
        np.testing.assert_allclose(ex.run({"x": x})["y"], _expected(x), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(eager.run({"x": x})["y"], ex.run({"x": x})["y"])
        assert ex.last_latency_ms > 0
    host = []
    for i in range(1000):
        start = time.perf_counter_ns()
        ex.replay()
        host.append(time.perf_counter_ns() - start)
        if i % 50 == 49:
            ex.synchronize()
    ex.synchronize()
    runs = []
    for _ in range(200):
        start = time.perf_counter_ns()
        ex.run({"x": x})
        runs.append((time.perf_counter_ns() - start) / 1e3 - ex.last_latency_ms * 1e3)
    print(f"replay host {np.median(host) / 1e3:.1f} us, run() host overhead "
          f"{np.median(runs):.1f} us on {gpu.describe()}")
    assert np.median(host) / 1e3 < 20


@pytest.mark.gpu
def test_gpu_profile_times_every_launch(gpu_kernels):
    root, gpu, cubins = gpu_kernels
    ex = CudaExecutor(root, _artifact(root, cubins))
    x = np.random.default_rng(4).standard_normal(N, dtype=np.float32)
    times = ex.profile({"x": x}, repeat=20)
    assert len(times) == 2 and all(t > 0 for t in times), times
    np.testing.assert_allclose(ex.run({"x": x})["y"], _expected(x), rtol=1e-6, atol=1e-6)
    print(f"profile ms {times} on {gpu.describe()}")


@pytest.mark.gpu
def test_gpu_module_load_per_arch(gpu_kernels, tmp_path):
    """The cubin for this GPU, and the PTX of an older compute capability JIT-compiled by
    the driver (the image a GPU newer than the artifact's archs gets), both run the
    pipeline (test_gpu_errors: a cubin of the other family is refused)."""
    root, gpu, cubins = gpu_kernels
    ptx_arch = "sm_80"
    built = compile_cubins({"model": CUDA_SOURCE}, [ptx_arch], root / "kernels_ptx",
                           cache=BuildCache(root / "cache"), ptx=True)
    ptx = next(files["model"] for key, files in built.items() if key.startswith("compute_"))
    ptx_key = next(key for key in built if key.startswith("compute_"))
    x = np.random.default_rng(5).standard_normal(N, dtype=np.float32)
    for cubin_map, extra in ((cubins, None),
                             ({}, {"arch": ptx_key, "file": str(ptx.relative_to(root))})):
        ex = CudaExecutor(root, _artifact(root, cubin_map, ptx=extra))
        np.testing.assert_allclose(ex.run({"x": x})["y"], _expected(x), rtol=1e-6, atol=1e-6)
        ex.close()


@pytest.mark.gpu
def test_gpu_kernel_faults_name_the_kernel(gpu_kernels):
    root, gpu, cubins = gpu_kernels
    manifest = _artifact(root, cubins)
    offset = manifest["cuda"]["launches"][0]["args"][1][1]
    manifest["cuda"]["launches"] = _pipeline(offset, [
        _launch("trap_if_positive", [1], [1], [["input", 0]])])
    (root / "trap.json").write_text(json.dumps(manifest))
    out = _child(CHILD, str(root), str(root / "trap.json"))   # faults at replay: located
    assert "ERROR: kernel launch 1 (trap_if_positive, grid [1, 1, 1]" in out, out
    manifest["cuda"]["launches"][1]["args"] = [["weights", offset + 4 * (2 * N - 1)]]
    (root / "trap.json").write_text(json.dumps(manifest))
    out = _child(CHILD, str(root), str(root / "trap.json"))   # faults at warm-up
    assert "ERROR: kernel launch 1 (trap_if_positive" in out, out


@pytest.mark.gpu
def test_gpu_errors(gpu_kernels):
    root, gpu, cubins = gpu_kernels
    other = "sm_90" if gpu.capability[0] == 8 else "sm_80"
    with pytest.raises(ArtifactError, match=f"artifact has {other} but .* is {gpu.arch}; "
                                            f"recompile with --arch {gpu.arch}"):
        CudaExecutor(root, _artifact(root, {other: next(iter(cubins.values()))}))
    with pytest.raises(ArtifactError, match=r"out of GPU memory: the activation arena needs "
                                            r"1,125,899,906,842,624 bytes but only"):
        CudaExecutor(root, _artifact(root, cubins, arena=1 << 50))
    (root / "ok.json").write_text(json.dumps(_artifact(root, cubins)))
    out = _child(CHILD, str(root), str(root / "ok.json"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert "ERROR: this artifact targets cuda but no CUDA GPU is visible (pycuda:" in out, out
