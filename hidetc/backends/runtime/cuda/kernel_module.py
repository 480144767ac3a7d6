"""Single CUDA kernels on the GPU with numpy buffers: the real-device twin of the
emulator's `EmulatedModule`, with the same `launch(kernel, grid, block, args)` call.

What it is for: running the kernel tests (intrinsics, hand-written kernels, every
schedule template on awkward shapes) on a real GPU, unchanged, so a primitive that the
emulator models wrongly shows up alone, before whole models run (bench/gpu_check.sh).

Assumes: the CUDA session of `driver.session()` (device 0, its primary context) is usable
on this thread; the kernels are `extern "C"`. Guarantees: the units are compiled by nvcc
for this GPU's arch only (cached by content, like every build); each launch copies every
numpy-array argument to the device, runs the kernel, waits, and copies every array back
into the caller's array (so outputs and untouched elements read as on the emulator);
numpy scalars are passed by value with their dtype. A launch or kernel fault raises a
one-line ArtifactError naming the kernel and its grid and block; a fault is sticky, so
the module (and the process's CUDA context) is unusable afterwards.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import numpy as np

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, declared_dynamic_shared
from hidetc.backends.runtime.cuda.driver import session
from hidetc.backends.toolchain.nvcc import compile_cubins
from hidetc.errors import ArtifactError

Dims = Union[int, Sequence[int]]


def _dims(value: Dims) -> tuple[int, int, int]:
    dims = (int(value),) if isinstance(value, (int, np.integer)) else tuple(int(d) for d in value)
    return dims + (1,) * (3 - len(dims))  # type: ignore[return-value]


class DeviceModule:
    """CUDA C units (name -> source) built for this GPU and loaded; see the module doc."""

    def __init__(self, sources: Mapping[str, str], include_dirs: Sequence[Path] = ()):
        self._session = session()
        if self._session.fault:
            raise ArtifactError(self._session.fault)
        self.drv = self._session.drv
        self.arch = self._session.arch
        self._dir = tempfile.TemporaryDirectory(prefix="hidetc-kernels-")
        built = compile_cubins(dict(sources), [self.arch], Path(self._dir.name), ptx=False,
                               include_dirs=(CUDA_INCLUDE_DIR, *include_dirs))
        self._modules = [self.drv.module_from_file(str(path))
                         for path in built[self.arch].values()]
        self._functions: dict[str, Any] = {}
        self._dynamic = {k: v for src in sources.values()
                         for k, v in declared_dynamic_shared(src).items()}

    def function(self, kernel: str) -> Any:
        if kernel not in self._functions:
            for module in self._modules:
                try:
                    self._functions[kernel] = module.get_function(kernel)
                    break
                except self.drv.Error:
                    continue
            else:
                raise KeyError(f"kernel {kernel!r} is in none of the modules")
        return self._functions[kernel]

    def dynamic_shared(self, kernel: str) -> int:
        """The dynamic shared bytes `kernel` declares (0: static shared memory only)."""
        return self._dynamic.get(kernel, 0)

    def launch(self, kernel: str, grid: Dims, block: Dims, args: Sequence[Any],
               shared_bytes: int = 0) -> None:
        """Run `kernel<<<grid, block, shared_bytes>>>(*args)` and wait for it; a kernel
        that declares dynamic shared memory gets at least that much (its limit raised
        past 48 KiB when it needs more)."""
        fn = self.function(kernel)
        shared_bytes = max(int(shared_bytes), self._dynamic.get(kernel, 0))
        if shared_bytes > 48 * 1024:
            fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                             shared_bytes)
        call_args = []
        for i, arg in enumerate(args):
            if isinstance(arg, np.ndarray):
                if not arg.flags.c_contiguous:
                    raise ValueError(f"argument {i}: arrays must be C-contiguous")
                call_args.append(self.drv.InOut(arg) if arg.nbytes else np.intp(0))
            elif isinstance(arg, np.generic):
                call_args.append(arg)
            else:
                raise TypeError(f"argument {i}: expected a numpy array or a numpy scalar with "
                                f"a dtype (e.g. np.int32(5)), got {type(arg).__name__}")
        g, b = _dims(grid), _dims(block)
        try:
            fn(*call_args, grid=g, block=b, shared=int(shared_bytes))
            self.drv.Context.synchronize()
        except self.drv.Error as exc:
            raise ArtifactError(f"{kernel}<<<{g}, {b}>>> failed on "
                                f"{self._session.describe()}: {exc}") from None
