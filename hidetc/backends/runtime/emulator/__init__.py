"""The CUDA emulator: generated CUDA C compiled by g++ and run on the CPU with
cooperative fibers per thread block (see emulator.py and hidetc_emu.cpp)."""
from hidetc.backends.runtime.emulator.emulator import (
    EmulatedModule,
    EmulatorError,
    build_emulated,
    compile_flags,
    include_dirs,
)

__all__ = ["EmulatedModule", "EmulatorError", "build_emulated", "compile_flags", "include_dirs"]
