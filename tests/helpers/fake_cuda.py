"""A fake pycuda driver for the CUDA runtime tests without a GPU: memory is host bytes,
"kernels" are Python functions on the packed arguments (`KERNELS`), CUDA graphs are
recorded lists of launches (`FakeGraphs`); the `fake` fixture installs both as the
process's CUDA session and writes a stand-in cubin `a.cubin` under tmp_path."""
import struct
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from helpers.cuda_artifact import N

from hidetc.backends.runtime.cuda import driver


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
        self.next, self.launched, self.pending = 1 << 20, [], None
        self.grids = []
        self.rendezvous, self.arrived = None, 0
        self._local = threading.local()      # stream capture is per thread, as CUDA's
        self.lock = threading.Lock()
        self.Device = type("Device", (), {
            "count": staticmethod(lambda: 1), "__init__": lambda s, i: None,
            "compute_capability": lambda s: capability, "name": lambda s: "Fake GPU",
            "retain_primary_context": lambda s: SimpleNamespace(push=lambda: None)})
        self.captures = 0                   # streams capturing now, on any thread

        def synchronize_context():
            if fake.captures:                # as CUDA: not while a stream captures
                raise fake.Error("cuCtxSynchronize failed: operation not permitted when "
                                 "stream is capturing")
        self.Context = SimpleNamespace(synchronize=synchronize_context, pop=lambda: None)

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

    @property
    def capturing(self):
        return getattr(self._local, "capturing", None)

    @capturing.setter
    def capturing(self, value):
        self._local.capturing = value

    def init(self):
        if self.init_error:
            raise self.Error(self.init_error)

    def _find(self, ptr, n):
        with self.lock:
            blocks = list(self.blocks.items())
        for base, block in blocks:
            if base <= ptr and ptr + n <= base + len(block):
                return block, ptr - base
        raise AssertionError(f"bad device access {ptr:#x}+{n}")        # freed, or never

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
        with self.lock:
            base, self.next = self.next, self.next + n + (1 << 20)
            self.blocks[base] = bytearray(n)
        allocation = _Alloc(base)
        allocation.fake = self
        return allocation

    def mem_get_info(self):
        return self.memory, 2 * self.memory

    def memset_d8(self, ptr, value, n):
        self.write(ptr, np.full(n, value, np.uint8))

    def memset_d8_async(self, ptr, value, n, stream=None):
        """Stream-ordered memset (recorded in `grids` as ("memset", ptr, n))."""
        self.grids.append(("memset", ptr, n))
        self.write(ptr, np.full(n, value, np.uint8))

    def memcpy_htod(self, ptr, src, stream=None):
        self.write(ptr, np.asarray(src))

    def memcpy_htod_async(self, ptr, src, stream=None):
        """A pass's input upload; the first `rendezvous.parties` wait for each other at
        `rendezvous` (a Barrier) when one is set."""
        with self.lock:
            self.arrived += 1
            meet = self.rendezvous is not None and self.arrived <= self.rendezvous.parties
        if meet:
            self.rendezvous.wait(timeout=5)
        self.write(ptr, np.asarray(src))

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
            self.grids.append((name, tuple(grid)))       # launched or captured
            thunk = (name, lambda: KERNELS[name](self, args))
            if self.capturing is not None:
                self.capturing.append(thunk)
            else:
                self.launched.append(name)
                thunk[1]()
        return SimpleNamespace(_launch_kernel=launch, set_attribute=lambda a, v: None,
                               get_attribute=lambda a: 1024)


class _Alloc(int):
    def free(self):                 # an access after it is a "bad device access"
        with self.fake.lock:
            del self.fake.blocks[int(self)]


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


def _scale_bias_sized(fake, args):
    x, w, tmp, n = struct.unpack("@QQQq", args)      # n: the pass's size, an int64
    wv = fake.read(w, 8 * N, np.float32)
    fake.write(tmp, fake.read(x, 4 * n, np.float32) * wv[:n] + wv[N:N + n])


def _relu_reverse_sized(fake, args):
    tmp, y, n = struct.unpack("@QQq", args)
    fake.write(y, np.maximum(fake.read(tmp, 4 * n, np.float32), 0)[::-1].copy())


KERNELS = {"scale_bias": _scale_bias, "relu_reverse": _relu_reverse,
           "trap_if_positive": _trap_if_positive, "scale_bias_sized": _scale_bias_sized,
           "relu_reverse_sized": _relu_reverse_sized}


class FakeGraphs:
    """Graph capture and replay; with `hold` set, a replay (with `capture_hold`, a
    capture) waits until it is set."""

    def __init__(self, fake):
        self.fake, self.graphs, self.destroyed = fake, {}, []
        self.hold, self.held = None, threading.Event()
        self.capture_hold, self.capture_held = None, threading.Event()

    def capture(self, stream, body):
        self.fake.capturing = []
        with self.fake.lock:
            self.fake.captures += 1
        try:
            if self.capture_hold is not None:
                self.capture_held.set()
                assert self.capture_hold.wait(timeout=5)
            body()
        finally:
            recorded, self.fake.capturing = self.fake.capturing, None
            with self.fake.lock:
                self.fake.captures -= 1
        with self.fake.lock:
            handle = 100 + len(self.graphs)
            self.graphs[handle] = recorded
        return handle

    def launch(self, executable, stream):
        if self.hold is not None:
            self.held.set()
            assert self.hold.wait(timeout=5)
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
