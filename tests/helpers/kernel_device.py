"""Where the kernel tests run their CUDA C: in the emulator (the default: every machine),
or on the real GPU with HIDETC_KERNEL_DEVICE=gpu (the GPU check's primitives step runs
the intrinsics, hand-written kernel and template tests that way, so the emulator's
references judge the hardware too).

`kernel_module(units)` takes {unit name: CUDA source} and returns an object with
`launch(kernel, grid, block, args)`: numpy arrays in and out, numpy scalars by value.
"""
from __future__ import annotations

import os
from typing import Mapping

import numpy as np

from hidetc.backends.runtime.cuda.kernel_module import DeviceModule
from hidetc.backends.runtime.emulator import EmulatedModule, build_emulated
from hidetc.tir import scratch

ENV = "HIDETC_KERNEL_DEVICE"


def on_gpu() -> bool:
    device = os.environ.get(ENV, "emulator")
    if device not in ("emulator", "gpu"):
        raise ValueError(f"{ENV}={device!r}: expected 'emulator' or 'gpu'")
    return device == "gpu"


def kernel_module(units: Mapping[str, str]):
    if on_gpu():
        return DeviceModule(units)
    return EmulatedModule(build_emulated(dict(units)))


def launch_checked(module, fn, args: list) -> None:
    """Launch the lowered kernel `fn` on `args` (its task's arrays; its scratch buffers,
    `hidetc.tir.scratch`, are appended zeroed). A kernel with scratch (split-K) runs
    twice, the second time -- in the emulator -- with its blocks and threads in reverse
    order (so another block arrives last at each tile): the outputs must be the same bits, and
    the zeroed scratch (the arrival counters) left zero."""
    extra = scratch.zero_arrays(fn)
    kinds = [kind for _, kind in scratch.scratch_params(fn)]
    grid, block = fn.attr("grid"), fn.attr("block")
    module.launch(fn.name, grid, block, list(args) + extra)
    if not extra:
        return
    first = [a.copy() for a in args]
    if isinstance(module, EmulatedModule):
        module.launch(fn.name, grid, block, list(args) + extra, reverse=True)
    else:
        module.launch(fn.name, grid, block, list(args) + extra)
    for before, after in zip(first, args):
        assert np.array_equal(before, after, equal_nan=True), \
            f"{fn.name}: another block order gave other bits"
    for array, kind in zip(extra, kinds):
        assert kind != scratch.ZEROED or not array.any(), f"{fn.name}: scratch left non-zero"
