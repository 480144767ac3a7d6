"""One f16 MatMul kernel against numpy, for the tensor-core and GEMV template tests:
random f16 inputs, the reference in float32 from the same values; the output sits in
front of a sentinel (a write past it fails) and starts NaN (an element left unwritten
fails); the documented f16 tolerance (norm-wise 1e-2) and, stricter, every element
within the f16 output rounding (4.9e-4 relative, bounded by 1e-3 |ref| + 1e-4 x the
output's RMS)."""
from __future__ import annotations

import numpy as np
from helpers.kernel_device import launch_checked

from hidetc.compute.task import Task


def check_f16_matmul(module, task: Task, fn, rng, what: str) -> None:
    """Launch `fn` (split-K kernels again in reverse order: `launch_checked`) and check
    its output (see the module docstring)."""
    a = rng.uniform(-1, 1, task.inputs[0].shape).astype(np.float16)
    b = rng.uniform(-1, 1, task.inputs[1].shape).astype(np.float16)
    ref = np.matmul(a.astype(np.float32), b.astype(np.float32))
    size = ref.size
    storage = np.full(size + 64, np.float16(7.0))
    storage[:size] = np.nan                       # anything unwritten fails
    out = storage[:size].reshape(ref.shape)
    launch_checked(module, fn, [a, b, out])
    got = out.astype(np.float32)
    assert (storage[size:] == np.float16(7.0)).all(), f"{what}: wrote past the output"
    error = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    assert error <= 1e-2, f"{what}: norm-wise relative error {error}"
    scale = float(np.sqrt(np.mean(ref * ref))) if ref.size else 0.0
    bound = 1e-3 * np.abs(ref) + 1e-4 * scale
    assert (np.abs(got - ref) <= bound).all(), f"{what}: max error {np.abs(got - ref).max()}"
