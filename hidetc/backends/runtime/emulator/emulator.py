"""The CUDA emulator: the generated .cu text (the very text nvcc compiles) run on the CPU.

`build_emulated(sources)` compiles every source with g++ as C++17 with
`-DHIDETC_EMULATE` (hidetc_cuda.h then includes hidetc_emu.h, which defines the CUDA
built-ins, and swaps every inline-PTX helper for its emulated twin), adds the runtime
(`hidetc_emu.cpp`: the scheduler; `hidetc_emu_resolve.cpp`: the collectives' results),
and links one shared library. Objects are cached by content in the
hidetc build cache (`hidetc.backends.toolchain.cache`): the key covers the source, the flags (which
carry a digest of the headers, so editing a header rebuilds) and the compiler identity.
A compile failure raises ToolchainError with the command that reproduces it.

`EmulatedModule(path).launch(kernel, grid, block, args)` runs a kernel through its
uniform entry `NAME_emu_entry(void **args)`: numpy arrays are passed as device pointers
(C-contiguous, used in place: outputs are written into them), numpy scalars
(`np.int32(5)`, `np.float32(0.5)`) by value. Execution model (hidetc_emu.cpp): blocks
run one after another; a block's threads are fibers on the calling thread, switched at
`__syncthreads` and the warp collectives, so barriers, shared memory, shuffles, votes,
ldmatrix and mma behave as on the GPU; divergent barriers, divergent warp collectives,
misaligned vector/async copies and deadlocks raise EmulatorError naming the block and
the threads. What a GPU leaves undefined is made visible: each block starts with its
shared memory poisoned (all bits set: NaN in floats), each local array too; cp.async
lands only at its thread's covering wait_group (poison until then); every index into a
shared array (static, or a slice of the dynamic one) is bounds-checked. With
`launch(races=True)` shared-memory accesses are tracked per barrier interval (races
between warps, and within a warp with no warp synchronization between; loads of bytes
never stored or still in flight); `reverse=True` runs blocks and threads last to
first. Global memory is not bounds-checked here (the sanitized executor,
`hidetc.backends.runtime.emulated`, puts red zones around every tensor), and races
between blocks show only as a result that depends on their order (blocks run one at a
time). Launches are serialized by a process-wide lock.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, HEADER_NAME
from hidetc.backends.toolchain.cache import BuildCache, cache_key
from hidetc.backends.toolchain.gcc import compile_objects, link_shared

EMULATOR_DIR = Path(__file__).resolve().parent
RUNTIME_SOURCES = {"hidetc_emu_runtime": EMULATOR_DIR / "hidetc_emu.cpp",
                   "hidetc_emu_resolve": EMULATOR_DIR / "hidetc_emu_resolve.cpp"}
RUNTIME_HEADERS = (CUDA_INCLUDE_DIR / HEADER_NAME, EMULATOR_DIR / "hidetc_emu.h",
                   EMULATOR_DIR / "hidetc_emu_internal.h")
COMPILER = "g++"
# -fno-semantic-interposition: calls inside one library bind to it even when another
# loaded library defines the same kernel name; -fno-strict-aliasing: fragments are
# reinterpreted (halves as 32-bit registers); -ffp-contract=off: no implicit fma.
BASE_FLAGS: tuple[str, ...] = ("-x", "c++", "-std=c++17", "-O1", "-fPIC",
                               "-fno-semantic-interposition", "-fno-strict-aliasing",
                               "-ffp-contract=off", "-DHIDETC_EMULATE")
DEFAULT_STACK_SIZE = 256 * 1024  # bytes per emulated thread (kernels' locals live there)
_LAUNCH_LOCK = threading.Lock()
Dims = Union[int, Sequence[int]]


class EmulatorError(RuntimeError):
    """A kernel misbehaved under emulation (deadlock, divergence, misalignment, bad launch):
    a bug in a kernel or template, not a user error."""


def include_dirs() -> tuple[Path, Path]:
    """The -I directories of an emulated build: the device header, then the emulation one."""
    return CUDA_INCLUDE_DIR, EMULATOR_DIR


def headers_digest() -> str:
    """sha256 over the headers: part of every object's cache key, via the flags."""
    return cache_key([h.read_bytes() for h in RUNTIME_HEADERS])


def compile_flags(extra_flags: Sequence[str] = ()) -> tuple[str, ...]:
    incs = tuple(f"-I{d}" for d in include_dirs())
    return BASE_FLAGS + incs + (f"-DHIDETC_HEADERS_DIGEST={headers_digest()[:16]}",
                                *extra_flags)


def build_emulated(sources: Mapping[str, str], out_path: Optional[Union[str, Path]] = None,
                   *, cache: Optional[BuildCache] = None,
                   extra_flags: Sequence[str] = ()) -> Path:
    """Compile `sources` (name -> .cu text) and the scheduler into one shared library.

    With `out_path` None the library lives in the cache (`<root>/emulator/<key>.so`, key
    over the objects) and is linked once; otherwise it is (re)linked at `out_path`.
    `extra_flags` go to every compile (e.g. `-DHIDETC_EMU_UCONTEXT`)."""
    reserved = set(sources) & set(RUNTIME_SOURCES)
    if reserved:
        raise ValueError(f"source names {sorted(reserved)} are reserved for the emulator")
    cache = cache or BuildCache()
    units = dict(sources)
    units.update((name, path.read_text()) for name, path in RUNTIME_SOURCES.items())
    objects = compile_objects(units, compile_flags(extra_flags), cc=COMPILER, cache=cache)
    if out_path is None:
        out = cache.root / "emulator" / f"{cache_key([o.name for o in objects])}.so"
        if out.is_file():
            return out
    else:
        out = Path(out_path)
    return link_shared(objects, out, ("-O1",), cc=COMPILER)


def _dims(value: Dims, what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) for d in dims):
        raise ValueError(f"{what} must be an int or 1 to 3 ints, got {value!r}")
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    if min(dims) < 1 or max(dims) >= 2 ** 32:
        raise ValueError(f"{what} dimensions must be in 1..2**32-1, got {dims}")
    return dims  # type: ignore[return-value]


def _marshal(args: Sequence[Any]) -> tuple[ctypes.Array, list[Any]]:
    """(void *args[], objects to keep alive during the call)."""
    keep: list[Any] = []
    ptrs = []
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray):
            if not a.flags.c_contiguous:
                raise ValueError(f"argument {i}: arrays must be C-contiguous")
            keep.append(a)
        elif isinstance(a, np.generic):
            a = np.array(a)  # a 0-d array holding the value with its dtype
            keep.append(a)
        else:
            raise TypeError(f"argument {i}: expected a numpy array or a numpy scalar with "
                            f"a dtype (e.g. np.int32(5)), got {type(a).__name__}")
        ptrs.append(a.ctypes.data)
    return (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs), keep


class EmulatedModule:
    """A library from `build_emulated`; `launch` runs one kernel on the CPU."""

    def __init__(self, path: Union[str, Path], stack_size: int = DEFAULT_STACK_SIZE):
        self.path = Path(path)
        self.stack_size = int(stack_size)
        self.lib = ctypes.CDLL(str(self.path))
        self._launch = self.lib.hidetc_emu_launch
        self._launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_void_p]
        self._launch.restype = ctypes.c_int
        self.lib.hidetc_emu_last_error.restype = ctypes.c_char_p
        self.lib.hidetc_emu_switch_count.restype = ctypes.c_ulonglong
        self.lib.hidetc_emu_set_stack_size.argtypes = [ctypes.c_size_t]
        self.lib.hidetc_emu_set_order.argtypes = [ctypes.c_int]
        self.lib.hidetc_emu_set_race_checks.argtypes = [ctypes.c_int]

    def entry(self, kernel_name: str) -> int:
        """The address of `kernel_name`'s emulator entry."""
        try:
            fn = getattr(self.lib, f"{kernel_name}_emu_entry")
        except AttributeError:
            raise KeyError(f"kernel {kernel_name!r} is not in {self.path} (no "
                           f"{kernel_name}_emu_entry)") from None
        return ctypes.cast(fn, ctypes.c_void_p).value

    def launch(self, kernel_name: str, grid: Dims, block: Dims, args: Sequence[Any],
               reverse: bool = False, races: bool = False) -> None:
        """Run `kernel_name<<<grid, block>>>(*args)`; raise EmulatorError if it misbehaves.
        `reverse`: the grid's blocks run last to first and each block's threads start
        and leave its barriers last to first (a kernel whose result depends on either
        order gives another result). `races`: shared-memory loads and stores (and
        ldmatrix rows, landing cp.async) are tracked per barrier interval; one warp's
        access to bytes another warp stored (or a store to bytes another loaded) in the
        same interval fails the launch, naming the threads and source lines (accesses
        within a warp are taken as warp-synchronous)."""
        entry = self.entry(kernel_name)
        g, b = _dims(grid, "grid"), _dims(block, "block")
        argv, keep = _marshal(args)
        with _LAUNCH_LOCK:
            self.lib.hidetc_emu_set_stack_size(self.stack_size)
            self.lib.hidetc_emu_set_order(int(reverse))
            self.lib.hidetc_emu_set_race_checks(int(races))
            rc = self._launch(entry, *g, *b, ctypes.cast(argv, ctypes.c_void_p))
            message = self.lib.hidetc_emu_last_error().decode(errors="replace")
        del keep
        if rc != 0:
            raise EmulatorError(f"{kernel_name}<<<{g}, {b}>>>: {message}")

    @property
    def switch_count(self) -> int:
        """Fiber switches so far in this library (for measuring the emulator's speed)."""
        return int(self.lib.hidetc_emu_switch_count())
