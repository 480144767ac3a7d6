"""The CUDA runtime: run a `target: cuda` artifact on GPU 0 through pycuda.

- `manifest`: the artifact's `cuda` section (modules, launches), image selection per GPU
  and kernel-argument packing; pure Python.
- `driver`: the process-wide CUDA session (lazy pycuda import, primary context) and
  CUDA graphs through ctypes.
- `executor`: `CudaExecutor(path, manifest)` with `run(inputs) -> outputs` and
  `last_latency_ms`, as the CPU executor: the loaded model (modules, weights).
- `context`: one execution context (an arena, I/O buffers, a stream, a captured graph):
  each pass in flight has its own.
- `locate`: the child process that names the kernel behind a failed replay.
- `kernel_module`: `DeviceModule(sources).launch(kernel, grid, block, args)`, single
  kernels on numpy buffers (the emulator's call, on the GPU: the kernel tests' device).

Importing this package never imports pycuda: machines without it (or without a GPU)
import hidetc fine and get a one-line error only when they build a `CudaExecutor`.
"""
from hidetc.backends.runtime.cuda.executor import CudaExecutor

__all__ = ["CudaExecutor"]
