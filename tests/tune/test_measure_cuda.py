"""Measuring candidates for the cuda target (`hidetc.driver.tune.measure_cuda`) without a GPU:
every measuring test runs the emulator backend (nvcc still compiles every unit for
sm_80, so the cubins a GPU would load are built and cached too).

- the f32 SIMT MatMul template: 4 configs measured, ranked, `best` picks one;
- a fake template whose candidates segfault, hang, hit a divergent barrier (an
  EmulatorError: the stand-in for a CUDA error that poisons a context), compute wrong
  values or fail to build -- each dropped with its reason in one call, the good ones
  measured; a second call compiles nothing;
- the f16 tensor-core MatMul (checked at 1e-2 against float32 from the same inputs),
  its units compiled ahead by `prebuild`;
- without a GPU, `backend=None` is a clear error;
- the pycuda backend's flow (events, rotation, L2 scratch, a fault, a block too large)
  against a fake pycuda driver.
"""
from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import targets

from hidetc.compute.task import Task
from hidetc.driver.tune import worker_cuda
from hidetc.driver.tune.measure import MeasureStats, best, measure_candidates, prebuild
from hidetc.driver.tune.measure_cuda import measure_cuda, prebuild_cuda
from hidetc.driver.tune.worker import Fault
from hidetc.errors import HidetcError
from hidetc.graph.ir import TensorType
from hidetc.schedules.cuda import TEMPLATES
from hidetc.target import cuda_target
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import block_idx, maximum, syncthreads, thread_idx

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")

F32, F16 = "float32", "float16"
ARCH = "sm_80"
N, THREADS = 4096, 256


def matmul_task(m: int, k: int, n: int, dtype: str = F32) -> Task:
    return Task("MatMul", (TensorType(dtype, (m, k)), TensorType(dtype, (k, n))),
                (TensorType(dtype, (m, n)),), (), (None, None))


def measure(task, template, configs, **kw):
    return measure_candidates(task, template, configs, target=targets.CUDA,
                              measurer=measure_cuda, arch=ARCH, backend="emulator", **kw)


def test_simt_matmul_measured_and_ranked():
    task, template = matmul_task(33, 24, 40), TEMPLATES["MatMul"]
    target = cuda_target(ARCH)
    default = template.default(task, target)
    others = [c for c in template.space(task, target) if c != default]
    configs = [default] + random.Random(0).sample(others, 3)
    stats, seen = MeasureStats(), []
    results = measure(task, template, configs, repeat=3, progress=seen.append, stats=stats)
    assert [r.config for r in results] == [repr(c) for c in configs]
    assert all(r.error is None and r.time_ms > 0 for r in results), results
    assert best(results).time_ms == min(r.time_ms for r in results)
    assert seen[-1] == len(configs) and seen == sorted(seen)
    assert stats.units == 1 and stats.worker_starts == 1 and stats.built == 4
    print(f"\nsimt 33x24x40: build {stats.build_s:.2f}s compile {stats.compile_s:.2f}s "
          f"(cached units {stats.units_cached}) measure {stats.measure_s:.2f}s")


# ---------------------------------------------------------------- a misbehaving template


@dataclass(frozen=True)
class FakeConfig:
    kind: str      # good | good2 | segv | hang | diverge | wrong | raise


class FakeReluTemplate:
    """Relu on N floats, one thread per element; each config is a way to be right or
    wrong."""
    name = "test.fake_relu_cuda"
    kinds = ("good", "segv", "hang", "diverge", "wrong", "raise", "good2")

    def space(self, task, target):
        return [FakeConfig(k) for k in self.kinds]

    def default(self, task, target):
        return FakeConfig("good")

    def build(self, task, config, name, target):
        kind = config.kind
        if kind == "raise":
            raise RuntimeError("this config cannot be built")
        threads = 128 if kind == "good2" else THREADS
        kb = KernelBuilder(name, "cuda")
        x, out = kb.buffer("x", F32, (N,)), kb.buffer("out", F32, (N,))
        i = block_idx() * threads + thread_idx()
        if kind == "hang":      # ~4.6e18 dependent float adds: never ends
            with kb.for_range(2**31 - 1, name="a"):
                with kb.for_range(2**31 - 1, name="b"):
                    kb.store(out, (0,), out[0] + 1.0)
        elif kind == "segv":    # 8 GiB past a 16 KiB buffer
            kb.store(out, (i + (2**31 - 1 - N),), x[i])
        elif kind == "diverge":  # barriers at two source lines: undefined in CUDA
            with kb.if_then(thread_idx() < 32):
                kb.emit(syncthreads())
            with kb.otherwise():
                kb.emit(syncthreads())
            kb.store(out, (i,), maximum(x[i], 0.0))
        else:
            kb.store(out, (i,), maximum(x[i], 0.0) + (1e-2 if kind == "wrong" else 0.0))
        return kb.finish(grid=(N // threads, 1, 1), block=(threads, 1, 1))


def relu_task() -> Task:
    return Task("Relu", (TensorType(F32, (N,)),), (TensorType(F32, (N,)),), (), (None,))


def test_bad_candidates_are_dropped_with_reasons(tmp_path, monkeypatch):
    monkeypatch.setenv("HIDETC_CACHE_DIR", str(tmp_path / "cache"))
    template, task = FakeReluTemplate(), relu_task()
    configs = template.space(task, None)
    stats = MeasureStats()
    results = measure(task, template, configs, repeat=5, timeout_s=3.0, stats=stats)
    by_kind = {c.kind: r for c, r in zip(configs, results)}
    assert [r.config for r in results] == [repr(c) for c in configs]
    for kind in ("good", "good2"):
        assert by_kind[kind].error is None and by_kind[kind].time_ms > 0, by_kind[kind]
    assert by_kind["segv"].error.startswith("fault: signal 11"), by_kind["segv"]
    assert by_kind["hang"].error == "timeout after 3s"
    assert by_kind["diverge"].error.startswith("fault: emulator: tune_k3"), \
        by_kind["diverge"]
    assert "different __syncthreads" in by_kind["diverge"].error
    assert by_kind["wrong"].error.startswith("wrong result: output 0: rel err")
    assert by_kind["raise"].error == "build: RuntimeError: this config cannot be built"
    assert all(r.time_ms is None for k, r in by_kind.items() if k not in ("good", "good2"))
    assert best(results) in (by_kind["good"], by_kind["good2"])
    # a fresh worker after the segfault, the hang and the fault
    assert stats.units == 1 and stats.units_cached == 0 and stats.worker_starts == 4

    again = MeasureStats()
    results2 = measure(task, template, configs, repeat=5, timeout_s=3.0, stats=again)
    assert again.units == 1 and again.units_cached == 1 and again.units_split == 0
    assert [r.error for r in results2] == [r.error for r in results]


def test_failing_compile_drops_only_that_candidate(tmp_path, monkeypatch):
    """A kernel nvcc rejects (its unit gets an `#error`, marked by the constant the
    "wrong" kernel adds) fails its unit; the unit is retried kernel by kernel and only
    that kernel is dropped."""
    import hidetc.driver.tune.measure_cuda as measure_cuda

    monkeypatch.setenv("HIDETC_CACHE_DIR", str(tmp_path / "cache"))
    plain = measure_cuda.print_cuda_module

    def poisoned(fns, prelude=""):
        text = plain(fns, prelude)
        return text + ("#error rejected by the test\n" if "0.01f" in text else "")

    monkeypatch.setattr(measure_cuda, "print_cuda_module", poisoned)
    configs = [FakeConfig("good"), FakeConfig("wrong"), FakeConfig("good2")]
    stats = MeasureStats()
    results = measure(relu_task(), FakeReluTemplate(), configs, repeat=3, stats=stats)
    assert results[0].error is None and results[2].error is None, results
    assert results[1].error.startswith("compile: nvcc compiling"), results[1]
    assert stats.units == 1 and stats.units_split == 1


def test_f16_tensor_core_matmul_checked_at_1e_2(tmp_path, monkeypatch):
    """Also: `prebuild` fills the caches, so the measuring call compiles nothing."""
    monkeypatch.setenv("HIDETC_CACHE_DIR", str(tmp_path / "cache"))
    task, template = matmul_task(32, 32, 32, F16), TEMPLATES["MatMul/f16"]
    target = cuda_target(ARCH)
    default = template.default(task, target)
    configs = [default, next(c for c in template.space(task, target) if c != default)]
    prebuild([(task, template, configs)], target=targets.CUDA, builder=prebuild_cuda,
             arch=ARCH, backend="emulator")
    stats = MeasureStats()
    results = measure(task, template, configs, repeat=3, stats=stats)
    assert all(r.error is None and r.time_ms > 0 for r in results), results
    assert stats.units == stats.units_cached == 1
    inputs, (ref,) = worker_cuda.inputs_and_reference(task, 0)
    assert ref.dtype == np.float64 and all(a.dtype == np.float16 for a in inputs)
    exact = inputs[0].astype(np.float64) @ inputs[1].astype(np.float64)
    np.testing.assert_allclose(ref, exact, rtol=1e-12)   # the float64 yardstick
    assert worker_cuda.mismatch(ref, exact) is None                  # within 1e-2
    assert worker_cuda.mismatch((ref * 1.05).astype(np.float16), exact) is not None


def test_backend_choice():
    from hidetc.backends.runtime.select import gpu_available
    with pytest.raises(ValueError, match="cuda candidates need that target's measurer"):
        measure_candidates(relu_task(), FakeReluTemplate(), [FakeConfig("good")],
                           target=targets.CUDA)
    with pytest.raises(ValueError, match="cuda candidates need that target's measurer"):
        prebuild([(relu_task(), FakeReluTemplate(), [FakeConfig("good")])],
                 target=targets.CUDA)
    with pytest.raises(HidetcError, match="unknown cuda measuring backend 'tpu'"):
        measure_candidates(relu_task(), FakeReluTemplate(), [FakeConfig("good")],
                           target=targets.CUDA, measurer=measure_cuda, backend="tpu")
    if gpu_available():
        return
    with pytest.raises(HidetcError, match=r"needs a CUDA GPU here \(or backend='emulator'"):
        measure_candidates(relu_task(), FakeReluTemplate(), [FakeConfig("good")],
                           target=targets.CUDA, measurer=measure_cuda)
    prebuild([(relu_task(), FakeReluTemplate(), [FakeConfig("good")])], target=targets.CUDA,
             builder=prebuild_cuda)


# ---------------------------------------------------------------- pycuda, faked


class FakeDriver:
    """Enough of pycuda.driver for PyCudaBackend: memory is host bytes, a "cubin" names
    a Python kernel, events return a fixed time; `fail` makes the next wait raise."""
    class Error(Exception):
        pass

    device_attribute = SimpleNamespace(L2_CACHE_SIZE="l2")
    function_attribute = SimpleNamespace(MAX_THREADS_PER_BLOCK="max_threads",
                                         MAX_DYNAMIC_SHARED_SIZE_BYTES="max_dynamic_shared")

    def __init__(self):
        self.memory, self.next, self.log, self.fail = {}, 4096, [], None
        fake = self

        class Stream:
            def synchronize(self):
                if fake.fail:
                    error, fake.fail = fake.fail, None
                    raise fake.Error(error)

        class Event:
            def record(self, stream):
                fake.log.append("record")

            def synchronize(self):
                Stream().synchronize()

            def time_since(self, other):
                return 0.5
        self.Stream, self.Event = Stream, Event

    def mem_alloc(self, nbytes):
        base, self.next = self.next, self.next + nbytes + 4096
        self.memory[base] = bytearray(nbytes)
        return base

    def memcpy_htod(self, dst, src):
        self.memory[int(dst)][:src.nbytes] = src.tobytes()

    def memcpy_dtoh(self, dst, src):
        dst[...] = np.frombuffer(bytes(self.memory[src][:dst.nbytes]), dst.dtype).reshape(
            dst.shape)

    def memset_d8_async(self, dst, value, size, stream):
        self.log.append(("memset", size))

    def module_from_buffer(self, data):
        fake = self
        kind = data.decode()

        class Function:
            def prepare(self, fmt):
                self.fmt = fmt

            def get_attribute(self, attr):
                return 256

            def set_attribute(self, attr, value):
                fake.log.append(("set_attribute", attr, value))

            def prepared_async_call(self, grid, block, stream, *args, shared_size=0):
                fake.log.append(("launch", grid, block, len(self.fmt)))
                fake.log.append(("shared", shared_size))
                if kind == "fault":
                    fake.fail = "cuStreamSynchronize failed: an illegal memory access"
                    return
                x = np.frombuffer(bytes(fake.memory[args[0]]), np.float32)
                y = np.maximum(x, 0) + (0.5 if kind == "wrong" else 0)
                fake.memory[args[1]][:] = y.astype(np.float32).tobytes()
        return SimpleNamespace(get_function=lambda name: Function())


def test_pycuda_backend_flow_on_a_fake_driver(tmp_path, monkeypatch):
    from hidetc.backends.runtime.cuda import driver as cuda_driver
    fake = FakeDriver()
    device = SimpleNamespace(get_attribute=lambda attr: 1 << 20)
    session = SimpleNamespace(drv=fake, device=device, describe=lambda: "Fake GPU (sm_90)")
    monkeypatch.setattr(cuda_driver, "session", lambda: session)
    for kind in ("good", "wrong", "fault"):
        (tmp_path / f"{kind}.cubin").write_text(kind)
    job = {"task": relu_task(), "backend": "pycuda", "repeat": 4, "warmup": 2, "seed": 0,
           "budget_s": 5.0, "candidates": []}
    measurer = worker_cuda.DeviceMeasurer(job, None)
    assert len(measurer.sets) == worker_cuda.rotation_copies(2 * 4 * N, 1 << 20) == 8
    time_ms, min_ms, error = measurer.measure(str(tmp_path / "good.cubin"), "k",
                                              (16, 1, 1), (256, 1, 1))
    assert error is None and time_ms == min_ms == 0.5
    launches = [e for e in fake.log if e[0] == "launch"]
    assert len(launches) == 1 + 2 + 4 and launches[0] == ("launch", (16, 1, 1), (256, 1, 1), 2)
    assert fake.log.count(("memset", 2 << 20)) == 2 + 4      # L2 scratch before each timing
    # split-K's scratch buffers (zeroed, after the task's) and 64 KiB of dynamic shared
    # memory (the kernel's limit raised first)
    fake.log.clear()
    assert measurer.measure(str(tmp_path / "good.cubin"), "k", (16, 1, 1), (256, 1, 1),
                            (((4,), "int32"), ((64,), "float32")), 65536)[2] is None
    assert ("set_attribute", "max_dynamic_shared", 65536) in fake.log
    launches = [e for e in fake.log if e[0] == "launch"]
    assert launches and all(e[3] == 4 for e in launches)     # 2 task buffers + 2 scratch
    assert {e for e in fake.log if e[0] == "shared"} == {("shared", 65536)}
    assert measurer.measure(str(tmp_path / "wrong.cubin"), "k", (16,), (256,))[2].startswith(
        "wrong result: output 0: rel err")
    with pytest.raises(worker_cuda.LoadError, match="a block of 512 threads"):
        measurer.measure(str(tmp_path / "good.cubin"), "k", (8,), (512,))
    with pytest.raises(Fault, match="illegal memory access"):
        measurer.measure(str(tmp_path / "fault.cubin"), "k", (16,), (256,))
