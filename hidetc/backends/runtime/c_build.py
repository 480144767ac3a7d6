"""Build the C runtime (`runtime/c/`) with gcc and put it into an artifact.

`build_runtime()` compiles `libhidetc_runtime.so` (the API of `hidetc.h`) and the
`hidetc-run` program once per content -- the sources, the flags and the compiler's
identity name a directory of the build cache, built in a temp dir and renamed into
place, so concurrent compiles share one build -- and `install_runtime(root)` copies the
three files an artifact carries: `include/hidetc.h`, `lib/libhidetc_runtime.so`,
`bin/hidetc-run` (which finds the library by its rpath `$ORIGIN/../lib`: the artifact
directory may move).

Decisions: generic x86-64 code (no -march: the runtime runs wherever the artifact's
kernels run; the kernels carry the ISA), C11, hidden visibility but for the API.
`sanitize="address"` / `"thread"` builds the ASan+UBSan / TSan variants the tests run
(cached apart). Guarantees: a ToolchainError naming the command and its first error
line when gcc fails (`gcc.run_logged`: the full output kept in a log beside the cache).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from hidetc import __version__
from hidetc.backends.toolchain.cache import BuildCache, cache_key
from hidetc.backends.toolchain.gcc import compiler_identity, find_compiler, run_logged

SOURCE_DIR = Path(__file__).resolve().parent / "c"
HEADER = "hidetc.h"
LIBRARY_SOURCES = ("sha256.c", "plan.c", "runtime.c", "cuda_driver.c", "cuda_model.c", "cuda.c")
RUNNER_SOURCES = ("hidetc_run.c", "run_io.c", "run_threads.c", "npy.c")
LIBRARY = "libhidetc_runtime.so"
RUNNER = "hidetc-run"
# where an artifact carries them (relative to OUT)
INSTALLED = {"header": f"include/{HEADER}", "library": f"lib/{LIBRARY}",
             "runner": f"bin/{RUNNER}"}
FLAGS = ("-std=c11", "-O2", "-g0", "-fPIC", "-pthread", "-Wall", "-Wextra",
         "-fvisibility=hidden", f'-DHX_VERSION="{__version__}"')
SANITIZE = {None: (), "address": ("-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                                  "-g"),
            "thread": ("-fsanitize=thread", "-g")}


def _sources(names: tuple[str, ...]) -> list[Path]:
    return [SOURCE_DIR / n for n in names if (SOURCE_DIR / n).is_file()]


def build_runtime(sanitize: Optional[str] = None, cache: Optional[BuildCache] = None) -> Path:
    """The directory holding include/, lib/ and bin/ of the runtime (built if absent)."""
    if sanitize not in SANITIZE:
        raise ValueError(f"sanitize: expected one of {sorted(filter(None, SANITIZE))}, got "
                         f"{sanitize!r}")
    cc = find_compiler("gcc")
    cache = cache or BuildCache()
    lib_src, run_src = _sources(LIBRARY_SOURCES), _sources(RUNNER_SOURCES)
    headers = sorted(SOURCE_DIR.glob("*.h"))
    flags = [*FLAGS, *SANITIZE[sanitize]]
    key = cache_key([*(p.name + "\0" + p.read_text() for p in (*headers, *lib_src, *run_src)),
                     "\0".join(flags), compiler_identity(cc), "c-runtime"])
    done = cache.root / "c-runtime" / key
    if (done / INSTALLED["runner"]).is_file():
        return done
    done.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=done.parent))
    try:
        for sub in ("include", "lib", "bin"):
            (tmp / sub).mkdir()
        shutil.copy2(SOURCE_DIR / HEADER, tmp / INSTALLED["header"])
        lib = tmp / INSTALLED["library"]
        logs = done.parent / f"{key}.log"      # kept only when gcc fails
        run_logged([cc, *flags, "-shared", f"-Wl,-soname,{LIBRARY}", f"-I{SOURCE_DIR}",
                    *map(str, lib_src), "-o", str(lib), "-ldl"], f"gcc building {LIBRARY}",
                   logs)
        run_logged([cc, *flags, f"-I{SOURCE_DIR}", *map(str, run_src), f"-L{lib.parent}",
                    "-lhidetc_runtime", "-Wl,-rpath,$ORIGIN/../lib", "-o",
                    str(tmp / INSTALLED["runner"])], f"gcc building {RUNNER}", logs)
        try:
            os.rename(tmp, done)
        except OSError:            # another process finished the same build first
            if not (done / INSTALLED["runner"]).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return done


def install_runtime(root: Path, sanitize: Optional[str] = None) -> dict:
    """Copy the runtime into the artifact at `root`; the manifest's `runtime` section."""
    built = build_runtime(sanitize)
    for rel in INSTALLED.values():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built / rel, root / rel)
    return dict(INSTALLED)
