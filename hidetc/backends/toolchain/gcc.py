"""gcc for the cpu target: C sources -> cached objects -> one shared library.

The flags (`flags_for(isa)`: the kernels' ISA, the target's; `host_flags()` for code
built to run on this host, the default), and why:
- `-O3 -mavx2 -mfma` (+ `-mavx512f` for kernels built for AVX-512,
  `hidetc.cpu_isa`): a fixed ISA baseline rather than -march=native, so an
  artifact built on one machine runs on any machine with that ISA and the cache key
  does not depend on the build host's exact CPU;
- `-ffp-contract=off`: no implicit a*b+c -> fma contraction, so float results are the
  same as the IR interpreter's and numpy's step-by-step rounding (kernels that want
  FMA call it explicitly), and do not change with the optimizer's mood;
- `-fno-math-errno`: math functions never set errno, which lets gcc inline sqrt and
  vectorize math loops; results are unchanged (we never read errno);
- `-fopenmp` (parallel loops), `-fPIC` (shared library), `-std=c99`.
No -ffast-math: NaN/inf semantics and reassociation must match the reference.

`compile_objects` compiles every source to an object in parallel (a thread pool of
min(cpu_count, len(sources)) running gcc processes), each cached by
sha256(source, flags, compiler identity) -- see `hidetc.backends.toolchain.cache`. A failure raises
ToolchainError with one line: the first error, the exact command to reproduce it, and
the log path (the source is kept beside the log). A missing gcc raises ToolchainError
naming how to install it.
"""
from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

from hidetc.backends.toolchain.cache import BuildCache, atomic_write, cache_key, temp_path_beside
from hidetc.cpu_isa import ISAS
from hidetc.cpu_isa import current as current_isa
from hidetc.errors import ToolchainError

BASE_FLAGS: tuple[str, ...] = ("-std=c99", "-O3", "-fopenmp", "-fPIC", "-ffp-contract=off",
                               "-fno-math-errno")


def flags_for(isa: str) -> tuple[str, ...]:
    """The compile flags of kernels written for `isa` (a cpu_isa.ISAS name)."""
    return BASE_FLAGS[:2] + ISAS[isa].gcc_flags + BASE_FLAGS[2:]


def host_flags() -> tuple[str, ...]:
    """The flags for code that runs on this host (its ISA, `cpu_isa.current()`)."""
    return flags_for(current_isa().name)
LINK_FLAGS: tuple[str, ...] = ("-shared", "-fopenmp", "-fPIC")
LINK_LIBS: tuple[str, ...] = ("-lm",)


def find_compiler(cc: str = "gcc") -> str:
    path = shutil.which(cc)
    if path is None:
        raise ToolchainError(f"{cc} not found: install gcc (e.g. apt-get install gcc) to "
                             "compile for the cpu target")
    return path


@functools.lru_cache(maxsize=None)
def compiler_identity(cc_path: str) -> str:
    """The compiler's path and full `--version` text (part of every cache key)."""
    out = subprocess.run([cc_path, "--version"], capture_output=True, text=True)
    return f"{cc_path}\n{out.stdout}"


def _first_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in lines:
        if "error" in ln.lower():
            return ln
    return lines[0] if lines else "(no compiler output)"


def _safe_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "source"


def run_logged(cmd: list[str], what: str, log: Path) -> None:
    """Run a compiler command; on failure keep its output in `log` and raise."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        return
    output = proc.stdout + proc.stderr
    atomic_write(log, f"$ {shlex.join(cmd)}\n{output}")
    raise ToolchainError(f"{what} failed: {_first_error(output)} | reproduce: "
                         f"{shlex.join(cmd)} | full log: {log}")


def compile_object(name: str, source: str, flags: Optional[Sequence[str]] = None, *,
                   cc: str = "gcc", cache: Optional[BuildCache] = None) -> Path:
    """Compile one C source to a cached object file and return its path (`flags`:
    default `host_flags()`)."""
    flags = host_flags() if flags is None else flags
    cc_path = find_compiler(cc)
    cache = cache or BuildCache()
    key = cache_key([source, "\0".join(flags), compiler_identity(cc_path)])
    hit = cache.lookup_object(key)
    if hit is not None:
        return hit
    stem = _safe_name(name)
    src = atomic_write(cache.build_dir(key) / f"{stem}.c", source)
    obj = cache.object_path(key)
    tmp = temp_path_beside(obj)
    try:
        cmd = [cc_path, *flags, "-c", str(src), "-o", str(tmp)]
        run_logged(cmd, f"gcc compiling {name}", cache.build_dir(key) / f"{stem}.log")
        os.replace(tmp, obj)
    finally:
        tmp.unlink(missing_ok=True)
    return obj


def compile_objects(sources: Mapping[str, str], flags: Optional[Sequence[str]] = None, *,
                    cc: str = "gcc", cache: Optional[BuildCache] = None) -> list[Path]:
    """Compile every source (name -> C text) in parallel; objects in `sources` order."""
    if not sources:
        return []
    flags = host_flags() if flags is None else flags
    find_compiler(cc)
    cache = cache or BuildCache()
    workers = max(1, min(os.cpu_count() or 1, len(sources)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(compile_object, name, text, tuple(flags), cc=cc, cache=cache)
                   for name, text in sources.items()]
        return [f.result() for f in futures]


def link_shared(objects: Sequence[Path], out_path: Union[str, Path],
                flags: Optional[Sequence[str]] = None, *, cc: str = "gcc") -> Path:
    """Link objects into a shared library at `out_path`, replaced atomically."""
    flags = host_flags() if flags is None else flags
    cc_path = find_compiler(cc)
    out = Path(out_path)
    tmp = temp_path_beside(out)
    link_flags = [f for f in flags if f not in ("-c", "-std=c99")]
    cmd = [cc_path, *LINK_FLAGS, *link_flags, *map(str, objects), "-o", str(tmp), *LINK_LIBS]
    try:
        run_logged(cmd, f"gcc linking {out.name}", out.with_name(out.name + ".link.log"))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def build_shared_library(sources: Mapping[str, str], out_path: Union[str, Path], *,
                         opt_flags: Optional[Sequence[str]] = None, cc: str = "gcc",
                         cache: Optional[BuildCache] = None) -> Path:
    """Compile `sources` (cached, in parallel) and link them into `out_path`."""
    objects = compile_objects(sources, opt_flags, cc=cc, cache=cache)
    return link_shared(objects, out_path, opt_flags, cc=cc)
