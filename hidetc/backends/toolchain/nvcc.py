"""nvcc for the cuda target: CUDA C translation units -> one .cubin per GPU architecture,
plus one PTX of the newest architecture so GPUs newer than every cubin can JIT it.

Assumes: each source is a whole translation unit (it may hold many `extern "C"
__global__` kernels) and includes only the CUDA headers and files under `include_dirs`.

DEFAULT_NVCC_FLAGS, and why:
- `-O3 -std=c++17`: optimized host-independent device code (there is no host code);
- `-lineinfo`: source lines in the cubin for compute-sanitizer and Nsight (no speed cost);
- `--fmad=true` (nvcc's default, spelled out): a*b+c may contract to one fma; an fma
  rounds once, so it is never less accurate than the two-step result, and the f32
  tolerance (1e-4 norm-wise) covers the difference from the step-by-step reference;
- no `--use_fast_math`: correctness first. Fast math would flush denormals to zero
  and use approximate division, sqrt, exp and log (`__expf`); kernels that want an
  intrinsic call it explicitly;
- `-Xptxas=-v`: ptxas reports registers, shared memory and spills per kernel; the
  report is kept beside the cached cubin and parsed by `ptxas_resources`.

A cubin is assembled from the PTX of its arch (`nvcc -ptx` once per source and arch,
cached; then `nvcc -cubin` on that PTX runs only ptxas): the same bytes as a cubin
compiled from the source, without a second front-end run (most of nvcc's time) where
the artifact also keeps that PTX.

Guarantees: `compile_cubins` runs nvcc in parallel, bounded by the CPU cores and by the
free memory (`MemAvailable`, about 1 GiB per nvcc/ptxas job). Every product is cached by
sha256(kind, source, flags, architecture, nvcc identity, contents of the include dirs)
under `<cache>/cuda/<k[:2]>/<k>.cubin|.ptx` (plus `<k>.log`, the compiler output),
written atomically (see `hidetc.backends.toolchain.cache`), then copied into the output
directory. A failure is one-line ToolchainError: the first error, the exact command to
reproduce it and the log path (the source is kept beside the log). A missing nvcc is a
ToolchainError saying how to get one.
"""
from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, Union

from hidetc.backends.toolchain.cache import BuildCache, atomic_write, cache_key, temp_path_beside
from hidetc.errors import ConfigError, ToolchainError

DEFAULT_NVCC_FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-lineinfo", "--fmad=true",
                                       "-Xptxas=-v")
DEFAULT_ARCH = "sm_90"
MIN_ARCH = 80                      # Ampere; older GPUs lack cp.async and bf16 mma
SYSTEM_CUDA_DIRS: tuple[Path, ...] = (Path("/usr/local/cuda/bin"),)
JOB_MEMORY_BYTES = 1 << 30         # what one nvcc + ptxas process may take at its peak
HEADER_SUFFIXES = (".h", ".cuh", ".hpp", ".inc", ".cu")

_ARCH_RE = re.compile(r"^(?:sm_|compute_)?(\d{2,3})([af]?)$")
_DOTTED_RE = re.compile(r"^(\d{1,2})\.(\d)$")


# ---------------------------------------------------------------- finding nvcc


def find_nvcc() -> str:
    """nvcc on PATH, else in $CUDA_HOME/bin, else in /usr/local/cuda/bin."""
    found = shutil.which("nvcc")
    if found:
        return found
    dirs = [Path(os.environ[v]) / "bin" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    for d in (*dirs, *SYSTEM_CUDA_DIRS):
        candidate = d / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ToolchainError("nvcc not found: install the CUDA toolkit (nvcc) to compile for "
                         "the cuda target, or use --target cpu")


@functools.lru_cache(maxsize=None)
def _identity(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"cannot run {nvcc} --version ({exc})") from None
    if out.returncode != 0:
        raise ToolchainError(f"{nvcc} --version failed: {(out.stderr or out.stdout).strip()}")
    return f"{nvcc}\n{out.stdout}"


def nvcc_identity(nvcc: Optional[str] = None) -> str:
    """nvcc's path and full `--version` text (part of every cache key)."""
    return _identity(nvcc or find_nvcc())


@functools.lru_cache(maxsize=None)
def default_arch() -> str:
    """The compute capability of the first visible GPU (nvidia-smi), else DEFAULT_ARCH.
    The result is not validated: an old GPU gives e.g. "sm_75", which parse_archs refuses."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return DEFAULT_ARCH
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return DEFAULT_ARCH
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    match = _DOTTED_RE.match(lines[0]) if out.returncode == 0 and lines else None
    return f"sm_{match.group(1)}{match.group(2)}" if match else DEFAULT_ARCH


# ---------------------------------------------------------------- architectures


def arch_number(arch: str) -> int:
    """70 for sm_70, 90 for sm_90a or compute_90."""
    match = _ARCH_RE.match(arch)
    if match is None:
        raise ValueError(f"not an architecture: {arch!r}")
    return int(match.group(1))


def _parse_one(token: str) -> str:
    text = token.strip().lower()
    dotted = _DOTTED_RE.match(text)
    match = _ARCH_RE.match(text) if dotted is None else None
    if dotted is None and (match is None or text.startswith("compute_")):
        raise ConfigError(f"--arch: {token.strip()!r} is not a GPU architecture "
                          "(expected e.g. sm_80, sm_90, sm_90a or 8.6)")
    number = int(dotted.group(1) + dotted.group(2)) if dotted else int(match.group(1))
    suffix = "" if dotted else match.group(2)
    arch = f"sm_{number}{suffix}"
    if number < MIN_ARCH:
        raise ConfigError(f"--arch: {arch} is not supported: hidetc targets sm_{MIN_ARCH} "
                          "(Ampere) and newer")
    return arch


def parse_archs(spec: Union[str, Iterable[str]]) -> tuple[str, ...]:
    """"sm_80,sm_90" (or a list, or "8.0 9.0") -> ("sm_80", "sm_90"): validated,
    de-duplicated, oldest first. ConfigError for garbage or anything older than sm_80."""
    tokens = re.split(r"[,\s]+", spec) if isinstance(spec, str) else list(spec)
    tokens = [t for t in tokens if str(t).strip()]
    if not tokens:
        raise ConfigError("--arch: no GPU architecture given (expected e.g. sm_80,sm_90)")
    archs = {_parse_one(str(t)) for t in tokens}
    return tuple(sorted(archs, key=lambda a: (arch_number(a), a)))


def ptx_arch(archs: Sequence[str]) -> str:
    """The virtual architecture of the one PTX: that of the newest arch (compute_90 for
    sm_90); an arch-specific newest (sm_90a) gives compute_90a."""
    newest = max(archs, key=lambda a: (arch_number(a), a))
    return "compute_" + newest[len("sm_"):]


# ---------------------------------------------------------------- compiling


def mem_available_bytes() -> Optional[int]:
    """MemAvailable from /proc/meminfo, or None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_jobs(tasks: int) -> int:
    """Parallel nvcc processes: at most one per core and one per JOB_MEMORY_BYTES free."""
    limit = min(os.cpu_count() or 1, max(tasks, 1))
    free = mem_available_bytes()
    if free is not None:
        limit = min(limit, free // JOB_MEMORY_BYTES)
    return max(1, limit)


@dataclass(frozen=True)
class _Task:
    name: str
    source: str
    kind: str       # cubin | ptx
    arch: str       # sm_90 for a cubin, compute_90 for PTX


def _include_digest(include_dirs: Sequence[Union[str, Path]]) -> str:
    """A digest of every header under the include dirs, so editing one misses the cache."""
    parts: list[Union[str, bytes]] = []
    for d in include_dirs:
        root = Path(d)
        parts.append(str(root))
        files = sorted(p for p in root.rglob("*") if p.suffix in HEADER_SUFFIXES and p.is_file())
        for p in files:
            parts += [p.relative_to(root).as_posix(), p.read_bytes()]
    return cache_key(parts)


def _first_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for pattern in (r"\berror\b", r"fatal", r"error"):
        for ln in lines:
            if re.search(pattern, ln, re.IGNORECASE):
                return ln
    return lines[0] if lines else "(no compiler output)"


def _safe_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name) or "source"


def _command(nvcc: str, task: _Task, src: Path, out: Path, flags: Sequence[str],
             include_dirs: Sequence[Union[str, Path]]) -> list[str]:
    """The PTX of a source, or the cubin of a PTX (`src`: only ptxas runs, with the same
    flags: the cubin is byte for byte the one nvcc makes from the source)."""
    includes = [f"-I{d}" for d in include_dirs] if task.kind == "ptx" else []
    if task.kind == "ptx":
        flags = [f for f in flags if not f.startswith("-Xptxas")]
    return [nvcc, f"-{task.kind}", f"-arch={task.arch}", *flags, *includes, str(src),
            "-o", str(out)]


def virtual_arch(arch: str) -> str:
    """The PTX architecture a cubin of `arch` is assembled from (sm_90a -> compute_90a)."""
    return "compute_" + arch[len("sm_"):]


def _run(cmd: list[str], what: str, log: Path) -> str:
    """Run nvcc; return its output, or keep it in `log` and raise a one-line error."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ToolchainError(f"{what} failed: cannot run nvcc ({exc}) | reproduce: "
                             f"{shlex.join(cmd)}") from None
    output = proc.stdout + proc.stderr
    if proc.returncode == 0:
        return output
    atomic_write(log, f"$ {shlex.join(cmd)}\n{output}")
    raise ToolchainError(f"{what} failed: {_first_error(output)} | reproduce: "
                         f"{shlex.join(cmd)} | full log: {log}")


class _Builder:
    """Compiles tasks into the cache; one instance per compile_cubins call."""

    def __init__(self, cache: BuildCache, flags: Sequence[str],
                 include_dirs: Sequence[Union[str, Path]]):
        self.cache, self.flags, self.include_dirs = cache, tuple(flags), tuple(include_dirs)
        self.nvcc = find_nvcc()
        self.identity = nvcc_identity(self.nvcc)
        self.headers = _include_digest(self.include_dirs)

    def product(self, key: str, kind: str) -> Path:
        return self.cache.root / "cuda" / key[:2] / f"{key}.{kind}"

    def build(self, task: _Task, purpose: str = "") -> Path:
        """The cached product of `task` (compiled now on a miss); `purpose` names the
        arch an error speaks of (a cubin's PTX fails "for sm_90")."""
        key = cache_key([task.kind, task.source, "\0".join(self.flags), task.arch,
                         self.identity, self.headers])
        out = self.product(key, task.kind)
        if out.is_file():
            return out
        stem = _safe_name(task.name)
        if task.kind == "ptx":
            src = atomic_write(self.cache.build_dir(key) / f"{stem}.cu", task.source)
        else:       # the front end runs once per source and arch: the PTX, then ptxas
            src = self.build(_Task(task.name, task.source, "ptx", virtual_arch(task.arch)),
                             task.arch)
        tmp = temp_path_beside(out)
        try:
            cmd = _command(self.nvcc, task, src, tmp, self.flags, self.include_dirs)
            log = self.cache.build_dir(key) / f"{stem}.{task.arch}.log"
            output = _run(cmd, f"nvcc compiling {task.name} for {purpose or task.arch}", log)
            atomic_write(out.with_suffix(".log"), output)   # before the product: a hit has both
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out


def _install(cached: Path, dest: Path) -> Path:
    tmp = temp_path_beside(dest)
    try:
        shutil.copyfile(cached, tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _tasks(sources: Mapping[str, str], archs: Sequence[str], ptx: bool) -> list[_Task]:
    tasks = [_Task(name, text, "cubin", arch) for arch in archs for name, text in sources.items()]
    if ptx:
        virtual = ptx_arch(archs)
        tasks += [_Task(name, text, "ptx", virtual) for name, text in sources.items()]
    return tasks


def _destination(out_dir: Path, task: _Task) -> Path:
    if task.kind == "cubin":
        return out_dir / task.arch / f"{_safe_name(task.name)}.cubin"
    return out_dir / f"{_safe_name(task.name)}.{task.arch}.ptx"


def compile_cubins(sources: Mapping[str, str], archs: Union[str, Iterable[str]],
                   out_dir: Union[str, Path], *, include_dirs: Sequence[Union[str, Path]] = (),
                   flags: Sequence[str] = DEFAULT_NVCC_FLAGS, jobs: Optional[int] = None,
                   cache: Optional[BuildCache] = None, ptx: bool = True,
                   keep_logs: bool = False) -> dict[str, dict[str, Path]]:
    """Compile every source (name -> CUDA C) for every arch, in parallel and cached.

    Returns {arch: {name: path}}: `out_dir/sm_XX/NAME.cubin` under each "sm_XX" key and,
    with `ptx`, `out_dir/NAME.compute_XX.ptx` under the "compute_XX" key of the newest
    arch. With `keep_logs`, each cubin gets its ptxas report beside it as
    `NAME.ptxas.log` (what `ptxas_resources(cubin_path)` reads).
    """
    archs = parse_archs(archs)
    out = Path(out_dir)
    if not sources:
        return {arch: {} for arch in archs}
    builder = _Builder(cache or BuildCache(), flags, include_dirs)
    tasks = _tasks(sources, archs, ptx)
    cubins = sum(t.kind == "cubin" for t in tasks)      # (first in `tasks`)
    workers = jobs if jobs and jobs > 0 else default_jobs(len(tasks))
    with ThreadPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        # the cubins first: each builds (and caches) its PTX, so the PTX of the newest
        # arch is a cache hit afterwards, not a second front-end run beside its cubin's
        cached = list(pool.map(builder.build, tasks[:cubins]))
        cached += pool.map(builder.build, tasks[cubins:])
    result: dict[str, dict[str, Path]] = {}
    for task, path in zip(tasks, cached):
        dest = _install(path, _destination(out, task))
        result.setdefault(task.arch, {})[task.name] = dest
        if keep_logs and task.kind == "cubin":
            _install(path.with_suffix(".log"), dest.with_suffix(".ptxas.log"))
    return result


# ---------------------------------------------------------------- ptxas report

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_SPILL_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                       r"(\d+) bytes spill loads")
_USED_RE = re.compile(r"Used (\d+) registers")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def _report_text(source: Union[str, os.PathLike]) -> str:
    if isinstance(source, str) and ("\n" in source or "ptxas" in source):
        return source
    path = Path(source)
    if path.suffix == ".cubin":
        path = path.with_suffix(".ptxas.log")
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ToolchainError(f"{path}: no ptxas report to read ({exc.strerror}); compile "
                             "with keep_logs=True or pass the log text") from None


def ptxas_resources(source: Union[str, os.PathLike]) -> dict[str, dict[str, int]]:
    """{kernel: {registers, shared_bytes, spills, spill_loads, stack_bytes}} from the
    `-Xptxas -v` report: the report text, a log file, or a cubin with its
    `NAME.ptxas.log` beside it. `spills` is the bytes of spill stores per thread."""
    result: dict[str, dict[str, int]] = {}
    entry: Optional[str] = None
    props: Optional[str] = None
    for line in _report_text(source).splitlines():
        if m := _ENTRY_RE.search(line):
            entry = props = m.group(1)
            result[entry] = {"registers": 0, "shared_bytes": 0, "spills": 0,
                             "spill_loads": 0, "stack_bytes": 0}
        elif m := _PROPS_RE.search(line):
            props = m.group(1)
        elif (m := _SPILL_RE.search(line)) and props in result:
            result[props].update(stack_bytes=int(m.group(1)), spills=int(m.group(2)),
                                 spill_loads=int(m.group(3)))
        elif (m := _USED_RE.search(line)) and entry in result:
            result[entry]["registers"] = int(m.group(1))
            if s := _SMEM_RE.search(line):
                result[entry]["shared_bytes"] = int(s.group(1))
    return result
