"""The GPU-only glue that the first GPU session runs untried, checked here against fake
pycuda pieces: DeviceModule's argument marshalling (arrays copied in and out, numpy
scalars by value, empty arrays as null pointers), its one-line errors; the session's
device limits under CudaTarget's field names; the GPU check's device query."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hidetc.backends.runtime.cuda import kernel_module
from hidetc.backends.runtime.cuda.driver import CudaSession
from hidetc.errors import ArtifactError
from hidetc.target import cuda_target

ROOT = Path(__file__).resolve().parents[2]


class FakeDrv:
    """pycuda.driver's high-level call: InOut arrays, the kernel a Python function."""
    class Error(Exception):
        pass

    class InOut:
        def __init__(self, array):
            self.array = array

    Context = SimpleNamespace(synchronize=lambda: None)

    def __init__(self):
        self.calls = []

    def module_from_file(self, path):
        assert Path(path).is_file()
        drv = self

        def get_function(name):
            if name not in ("vadd", "fault"):
                raise drv.Error("cuModuleGetFunction failed: named symbol not found")

            def call(*args, grid, block, shared):
                drv.calls.append((name, args, grid, block, shared))
                if name == "fault":
                    raise drv.Error("cuLaunchKernel failed: an illegal memory access")
                n, a, b, c = args
                if n:                                         # else null pointers
                    c.array[:n] = a.array[:n] + b.array[:n]  # written through, copied out
            return call
        return SimpleNamespace(get_function=get_function)


@pytest.fixture
def device(monkeypatch):
    drv = FakeDrv()
    fake_session = SimpleNamespace(fault=None, drv=drv, arch="sm_90",
                                   describe=lambda: "Fake GPU (sm_90)")
    monkeypatch.setattr(kernel_module, "session", lambda: fake_session)

    def compile_cubins(sources, archs, out_dir, **options):
        out = Path(out_dir) / archs[0]
        out.mkdir(parents=True, exist_ok=True)
        for name in sources:
            (out / f"{name}.cubin").write_bytes(b"cubin")
        return {archs[0]: {name: out / f"{name}.cubin" for name in sources}}
    monkeypatch.setattr(kernel_module, "compile_cubins", compile_cubins)
    return drv


def test_device_module_copies_arrays_in_and_out(device):
    module = kernel_module.DeviceModule({"unit": "// cuda"})
    a, b = np.arange(10, dtype=np.float32), np.ones(10, np.float32)
    c = np.full(12, -1.0, np.float32)
    module.launch("vadd", 2, (128,), [np.int32(10), a, b, c])
    np.testing.assert_array_equal(c[:10], a + 1)
    assert (c[10:] == -1).all()
    name, args, grid, block, shared = device.calls[-1]
    assert (grid, block, shared) == ((2, 1, 1), (128, 1, 1), 0)
    assert isinstance(args[0], np.int32) and all(isinstance(x, FakeDrv.InOut) for x in args[1:])
    module.launch("vadd", 1, 1, [np.int32(0), a[:0], b[:0], c[:0]])
    assert [type(x) for x in device.calls[-1][1][1:]] == [np.intp] * 3   # null pointers


def test_device_module_errors_are_one_line(device):
    module = kernel_module.DeviceModule({"unit": "// cuda"})
    with pytest.raises(ArtifactError, match=r"^fault<<<\(1, 1, 1\), \(32, 1, 1\)>>> failed on "
                                            r"Fake GPU \(sm_90\): cuLaunchKernel failed"):
        module.launch("fault", 1, 32, [])
    with pytest.raises(KeyError, match="'missing' is in none of the modules"):
        module.launch("missing", 1, 1, [])
    with pytest.raises(TypeError, match="argument 0: expected a numpy array or a numpy"):
        module.launch("vadd", 1, 1, [3])
    with pytest.raises(ValueError, match="C-contiguous"):
        module.launch("vadd", 1, 1, [np.zeros((4, 4), np.float32)[:, 0]])


def test_session_limits_become_a_cuda_target():
    attributes = {"MULTIPROCESSOR_COUNT": 46, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 101376,
                  "L2_CACHE_SIZE": 33554432, "MAX_THREADS_PER_MULTIPROCESSOR": 1536,
                  "CLOCK_RATE": 2040000, "MEMORY_CLOCK_RATE": 6251000,
                  "GLOBAL_MEMORY_BUS_WIDTH": 192}
    drv = SimpleNamespace(device_attribute=SimpleNamespace(**{k: k for k in attributes}),
                          Error=RuntimeError)
    dev = SimpleNamespace(get_attribute=lambda key: attributes[key])
    session = CudaSession(drv, dev, None, "Some GPU", (8, 9), None, "none")
    facts = session.limits()
    assert facts == {"name": "Some GPU", "arch": "sm_89", "sms": 46,
                     "shared_optin_bytes": 101376, "l2_bytes": 33554432,
                     "threads_per_sm": 1536, "clock_mhz": 2040, "dram_gbps": 300}
    target = cuda_target(device=facts)
    assert (target.sms, target.threads_per_sm, target.max_threads) == (46, 1536, 1024)
    assert (target.clock_mhz, target.dram_gbps) == (2040, 300)


FAKE_PYCUDA = '''
class Error(Exception):
    pass
device_attribute = type("A", (), {name: name for name in (
    "MULTIPROCESSOR_COUNT", "CLOCK_RATE", "MEMORY_CLOCK_RATE", "GLOBAL_MEMORY_BUS_WIDTH",
    "L2_CACHE_SIZE", "MAX_SHARED_MEMORY_PER_BLOCK", "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN",
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", "MAX_REGISTERS_PER_MULTIPROCESSOR",
    "MAX_REGISTERS_PER_BLOCK")})
VALUES = {"MULTIPROCESSOR_COUNT": 132, "CLOCK_RATE": 1980000}
def init(): pass
def get_driver_version(): return 13000
def get_version(): return (12, 8, 0)
def mem_get_info(): return (100 << 30, 139 << 30)
class Context:
    @staticmethod
    def pop(): pass
class Device:
    def __init__(self, i): pass
    def name(self): return "Fake H200"
    def compute_capability(self): return (9, 0)
    def retain_primary_context(self): return type("C", (), {"push": lambda s: None})()
    def get_attribute(self, key):
        if key not in VALUES:
            raise Error("unknown attribute")
        return VALUES[key]
'''


def test_gpu_check_device_query_with_a_fake_pycuda(tmp_path):
    """Every fact on its own: a missing attribute is 'unknown', the step still passes."""
    package = tmp_path / "site" / "pycuda"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "driver.py").write_text(FAKE_PYCUDA)
    out = tmp_path / "device.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "device",
                           str(out)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(out.read_text())
    assert facts["status"] == "passed" and facts["name"] == "Fake H200"
    assert (facts["capability"], facts["memory_gib"], facts["free_gib"]) == ([9, 0], 139, 100)
    assert facts["sms"] == 132 and facts["sm_clock_mhz"] == 1980
    assert facts["l2_bytes"].startswith("unknown (Error")
