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

from hidetc.backends.runtime.cuda.kernel_module import DeviceModule
from hidetc.backends.runtime.emulator import EmulatedModule, build_emulated

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
