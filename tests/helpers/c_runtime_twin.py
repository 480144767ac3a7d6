"""The test suite's C-runtime twin: `install()` wraps `Model.run` so that a pass through
the Python runtime on a cpu artifact is repeated through the artifact's C runtime and
compared bit for bit (see tests/conftest.py).

The twin is loaded once per Model (lazily, under a lock: tests run passes from many
threads) with one C context per calling thread, at the Python pass's own intra-op
thread count. A mismatch raises AssertionError naming the output and the first
differing element; a C runtime that refuses an artifact the Python runtime ran is a
failure too (its one-line message is the assertion's)."""
from __future__ import annotations

import subprocess
import threading
import weakref
from pathlib import Path

import numpy as np
import yaml

from hidetc.backends.runtime.c_executor import CRuntimeExecutor
from hidetc.driver import model as model_module

_LOCK = threading.Lock()


def _twin(model):
    with _LOCK:
        twin = model.__dict__.get("_c_twin")
        if twin is None:
            # (the executor on the manifest already read: no second parse or hashing)
            twin = CRuntimeExecutor(model.path, model.manifest, max_contexts=64)
            model.__dict__["_c_twin"] = twin
            weakref.finalize(model, twin.close)
        return twin


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit (as bytes), shapes and dtypes equal."""
    return a.shape == b.shape and a.dtype == b.dtype and \
        np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def compare(expected: dict, got: dict, where: str) -> None:
    for name, a in expected.items():
        b = got[name]
        if not same(a, b):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise AssertionError(f"{where}: C runtime output {name!r} is "
                                     f"{b.dtype}{list(b.shape)}, Python's {a.dtype}"
                                     f"{list(a.shape)}")
            flat_a = a.reshape(-1).view(np.uint8)
            flat_b = b.reshape(-1).view(np.uint8)
            first = int(np.argmax(flat_a != flat_b)) // max(a.itemsize, 1)
            raise AssertionError(f"{where}: C runtime output {name!r} differs from the "
                                 f"Python runtime's at flat index {first}: "
                                 f"{b.reshape(-1)[first]!r} vs {a.reshape(-1)[first]!r}")


def install() -> None:
    original = model_module.Model.run
    if getattr(original, "_c_twin", False):
        return

    def run(self, inputs):
        out = original(self, inputs)
        if self.target == "cpu" and getattr(self, "runtime", "python") == "python" \
                and self.manifest.get("runtime"):
            twin = _twin(self)
            compare(out, twin.run(inputs), str(self.path))
        return out

    def close(self):
        twin = self.__dict__.pop("_c_twin", None)
        if twin is not None:
            twin.close()
        original_close(self)

    original_close = model_module.Model.close
    run._c_twin = True
    model_module.Model.run = run
    model_module.Model.close = close


def runner_outputs(out, inputs: dict, work) -> dict:
    """The outputs of `OUT/bin/hidetc-run` (a process without Python) on `inputs`, read
    back as arrays of the manifest's dtypes (bfloat16 comes back as 2-byte voids)."""
    out, work = Path(out), Path(work)
    work.mkdir(parents=True, exist_ok=True)
    cmd = [str(out / "bin" / "hidetc-run"), str(out), "--output-dir", str(work / "outs")]
    for k, (name, array) in enumerate(inputs.items()):
        np.save(work / f"in{k}.npy", array)
        cmd += ["--input", f"{name}={work / f'in{k}.npy'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    safe = {o["name"]: "".join(c if c.isalnum() or c in "._-" else "_" for c in o["name"])
            for o in manifest["outputs"]}
    return {o["name"]: np.load(work / "outs" / f"{safe[o['name']]}.npy").view(o["dtype"])
            for o in manifest["outputs"]}


def assert_runner_matches(out, inputs: dict, expected: dict, work) -> None:
    """hidetc-run's outputs on `inputs` equal `expected` (the Python runtime's) bit for bit."""
    compare(expected, runner_outputs(out, inputs, work), f"{out} (hidetc-run)")
