"""The artifact directory: what `hidetc compile` writes and `hidetc run` loads.

Layout: `OUT/manifest.yaml` (the table of contents, below) plus the files it lists
(typically `weights.bin` and the kernel library, e.g. `kernels.so`). The manifest is a
plain dict (YAML mapping; no custom classes), written with `yaml.safe_dump`, keys in
this order:

    format_version: 1                 # int; readers refuse newer versions
    hidetc_version: 0.1.0
    target: cpu                       # cpu | cuda
    created: '2025-01-01T12:00:00Z'   # UTC ISO time (utc_now())
    model: {file: model.onnx, sha256: <hex>}    # provenance of the source model
    inputs:  [{name, dtype, shape: [..]}, ...]
    outputs: [{name, dtype, shape: [..]}, ...]
    kernels: [{name, op, node, args: [value names], ...free-form extras}, ...]
                                      # the execution order IS this list
    memory: {arena_bytes, total_bytes, alignment, offsets: {value: offset},
             context_bytes, ...}      # context_bytes: what each pass in flight holds
    weights: {file: weights.bin, entries: {name: {offset, nbytes, dtype, shape}}}
    library: kernels.so               # file name in OUT, or null when there is none
    files: {relative/path: sha256}    # every file but the manifest; filled in by the writer
    verification: {status, reference, sample, metric, tolerance,
                   outputs: {name: {rel_error, max_abs_error}}, ...}   # free-form
    config: {...}                     # free-form: the CompileConfig used

Guarantees: `ArtifactWriter` never leaves a half-written OUT: it builds the artifact in
a sibling temp dir and renames it into place only in `finish()`; an existing artifact
(or empty dir) at OUT is replaced, anything else there is refused before any work.
The temp dir holds an `.owner` record (host, pid, the process's start time); a later
writer into the same OUT removes the temp dirs (and half-swapped `.old-` dirs) whose
owner process is gone -- a compile killed mid-way leaves nothing for long.
`read_manifest` turns every problem (missing, not an artifact, bad YAML, missing keys,
newer format, a listed file missing or modified) into a one-line `ArtifactError`.
Assumes: OUT's parent is on one filesystem with OUT (renames are atomic), POSIX rename
semantics. Files are hashed in 1 MiB chunks, so large weights never load at once.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import secrets
import shutil
import socket
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

import numpy as np
import yaml

from hidetc.errors import ArtifactError

FORMAT_VERSION = 1
MANIFEST = "manifest.yaml"

_CHUNK = 1 << 20
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DumperBase = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# Required top-level keys: the type of the value and, for mappings, required sub-keys;
# for lists, the required keys of every item.
SCHEMA: dict[str, tuple[type | tuple[type, ...], tuple[str, ...]]] = {
    "format_version": (int, ()),
    "hidetc_version": (str, ()),
    "target": (str, ()),
    "created": (object, ()),
    "model": (dict, ("file", "sha256")),
    "inputs": (list, ("name", "dtype", "shape")),
    "outputs": (list, ("name", "dtype", "shape")),
    "kernels": (list, ("name", "op", "args")),
    "memory": (dict, ("arena_bytes", "total_bytes", "offsets")),
    "weights": (dict, ("file", "entries")),
    "library": ((str, type(None)), ()),
    "files": (dict, ()),
    "verification": (dict, ()),
    "config": (dict, ()),
}
REQUIRED_KEYS = tuple(SCHEMA)


# ---------------------------------------------------------------- helpers


def utc_now() -> str:
    """The current UTC time as ISO 8601 with a 'Z' suffix, to the second."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return now.isoformat().replace("+00:00", "Z")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def file_checksums(root: str | os.PathLike) -> dict[str, str]:
    """{relative posix path: sha256} of every regular file under `root` except the
    manifest (and its temp file), sorted by path."""
    root = Path(root)
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            rel = p.relative_to(root).as_posix()
            if rel in (MANIFEST, MANIFEST + ".tmp") or not p.is_file() or p.is_symlink():
                continue
            found[rel] = sha256_file(p)
    return dict(sorted(found.items()))


def to_plain(obj: Any, where: str = "manifest") -> Any:
    """A deep copy of `obj` made of dict/list/str/int/float/bool/None only (tuples ->
    lists, numpy scalars/arrays -> Python, Path -> str, objects with to_dict() -> dict)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, (np.generic, np.ndarray)):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "to_dict"):
        return to_plain(obj.to_dict(), where)
    raise TypeError(f"{where}: cannot store a {type(obj).__name__} in the manifest")


class _Dumper(_DumperBase):
    """safe_dump with short lists of scalars (shapes, args) in flow style: [1, 3, 224]."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(x is None or isinstance(x, (bool, int, float, str)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _represent_list)


def dump_manifest(manifest: Mapping[str, Any]) -> str:
    """The YAML text of a manifest (safe types only, keys in the given order)."""
    return yaml.dump(to_plain(manifest), Dumper=_Dumper, sort_keys=False,
                     default_flow_style=False, allow_unicode=True, width=100)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- validation


def _check_items(key: str, items: list, subkeys: tuple[str, ...], where: str) -> None:
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ArtifactError(f"{where}: {key}[{i}] must be a mapping")
        missing = [k for k in subkeys if k not in item]
        if missing:
            raise ArtifactError(f"{where}: {key}[{i}] is missing {', '.join(missing)}")


def validate_manifest(m: Any, where: str) -> None:
    """One-line ArtifactError (prefixed by `where`, the manifest's path) unless `m` has
    every required key with the right type, at a format version this hidetc reads."""
    if not isinstance(m, dict):
        raise ArtifactError(f"{where}: expected a mapping at the top level")
    version = m.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise ArtifactError(f"{where}: format version {version} is newer than this hidetc "
                            f"supports ({FORMAT_VERSION}); upgrade hidetc")
    missing = [k for k in REQUIRED_KEYS if k not in m]
    if missing:
        raise ArtifactError(f"{where}: missing required key(s): {', '.join(missing)}")
    for key, (kind, subkeys) in SCHEMA.items():
        value = m[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ArtifactError(f"{where}: {key} has the wrong type "
                                f"({type(value).__name__})")
        if isinstance(value, list):
            _check_items(key, value, subkeys, where)
        elif subkeys:
            absent = [k for k in subkeys if k not in value]
            if absent:
                raise ArtifactError(f"{where}: {key} is missing {', '.join(absent)}")
    if version < 1:
        raise ArtifactError(f"{where}: invalid format version {version}")


def _safe_relpath(rel: Any, where: str) -> str:
    p = PurePosixPath(str(rel))
    if not isinstance(rel, str) or p.is_absolute() or ".." in p.parts or not p.parts:
        raise ArtifactError(f"{where}: file path {rel!r} is not inside the artifact")
    return rel


def _check_files(out: Path, m: dict, verify_checksums: bool, where: str) -> None:
    files = m["files"]
    for ref in (m["weights"].get("file"), m["library"]):
        if ref is not None and ref not in files:
            raise ArtifactError(f"{where}: {ref!r} is referenced but not listed in files")
    for rel, digest in files.items():
        _safe_relpath(rel, where)
        shown = os.path.join(str(out), rel)
        path = out / rel
        if not path.is_file():
            raise ArtifactError(f"{shown}: listed in the manifest but missing")
        if verify_checksums and sha256_file(path) != digest:
            raise ArtifactError(f"{shown}: checksum mismatch (file modified or corrupted)")


def _yaml_error(where: str, e: yaml.YAMLError) -> ArtifactError:
    problem = getattr(e, "problem", None) or type(e).__name__
    mark = getattr(e, "problem_mark", None)
    at = f" at line {mark.line + 1}" if mark is not None else ""
    return ArtifactError(f"{where}: not valid YAML ({problem}{at})")


def read_manifest(out_dir: str | os.PathLike, *, verify_checksums: bool = True) -> dict:
    """Load and check OUT/manifest.yaml; also check that every file it lists exists and
    (with `verify_checksums`) has the recorded sha256. Files it does not list are
    ignored. Returns the manifest dict."""
    out = Path(out_dir)
    where = os.path.join(str(out), MANIFEST)
    if not out.exists():
        raise ArtifactError(f"{out}: no such artifact directory")
    if not out.is_dir() or not (out / MANIFEST).is_file():
        raise ArtifactError(f"{out}: not a hidetc artifact (no {MANIFEST})")
    try:
        m = yaml.load((out / MANIFEST).read_text(encoding="utf-8"), Loader=_Loader)
    except yaml.YAMLError as e:
        raise _yaml_error(where, e) from None
    except (UnicodeDecodeError, OSError) as e:
        raise ArtifactError(f"{where}: cannot read ({type(e).__name__})") from None
    validate_manifest(m, where)
    _check_files(out, m, verify_checksums, where)
    return m


# ---------------------------------------------------------------- writing


def profile_rows(manifest: dict, times: list[float], variant: int = 0) -> list[dict]:
    """Per launch (manifest order; a dynamic artifact's dispatch `variant`'s) with its
    time `times[i]` in ms: kernel, op, node, template and config (None for a rule
    kernel) and, on cuda, grid and block (a variant's grid as its expression of the
    sizes) and the cost model's `estimate_us`, `blocks` and `waves` (the first
    variant's: measured beside estimated, what fits the model's constants)."""
    kernels = manifest["kernels"]
    launches = (manifest.get("cuda") or {}).get("launches")
    if variant:
        kernels = manifest["dynamic"]["variants"][variant]["launch_kernels"]
        launches = ((manifest.get("cuda") or {}).get("variant_launches") or [None] * variant
                    )[variant - 1]
    launches = launches or [{}] * len(kernels)
    return [{"kernel": k["name"], "op": k["op"], "node": k.get("node"), "ms": t,
             "template": k.get("template"), "config": k.get("config"),
             **{key: launch[key] for key in ("grid", "block") if key in launch},
             **{key: k[key] for key in ("estimate_us", "blocks", "waves") if key in k}}
            for k, launch, t in zip(kernels, launches, times)]


def check_output_dir(out_dir: str | os.PathLike) -> None:
    """ArtifactError unless OUT may be (re)written: it does not exist, or it is a hidetc
    artifact (has manifest.yaml), or it is an empty directory. Call it before a long
    compile to fail fast; `ArtifactWriter` calls it on entry and again in finish()."""
    out = Path(out_dir)
    if not os.path.lexists(out):
        return
    if out.is_dir() and not out.is_symlink():
        if (out / MANIFEST).is_file() or not any(out.iterdir()):
            return
    raise ArtifactError(f"{out}: exists and is not a hidetc artifact; remove it or "
                        f"choose another -o")


def _swap_into_place(new: Path, out: Path) -> None:
    """Rename `new` to `out`, replacing an existing artifact/empty dir at `out`."""
    if not os.path.lexists(out):
        os.rename(new, out)
        return
    old = out.with_name(f".{out.name}.old-{secrets.token_hex(4)}")
    os.rename(out, old)
    try:
        os.rename(new, out)
    except OSError:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)


OWNER_FILE = ".owner"
# a temp dir without an owner record (a writer killed between mkdtemp and writing it,
# or an older hidetc) is left alone this long (seconds), then taken as stale
UNOWNED_GRACE_S = 600.0


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), which tells a
    reused pid from the original; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19] if ")" in stat else None


def _owner_record() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "start": _process_start(pid)}


def _owner_alive(owner: Mapping[str, Any]) -> bool:
    """Whether the process that wrote `owner` may still be running (another host's
    process is taken as alive: its liveness cannot be seen from here)."""
    if owner.get("host") != socket.gethostname():
        return True
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass                                  # alive, another user's
    start = owner.get("start")
    return start is None or _process_start(pid) in (None, start)


def remove_stale_temporaries(out_dir: str | os.PathLike) -> list[Path]:
    """Remove the `.OUT.tmp-*` and `.OUT.old-*` dirs next to `out_dir` left by writers
    that died (their owner process gone; an unowned one after UNOWNED_GRACE_S).
    Returns what was removed; never raises for a dir it cannot read or remove."""
    out = Path(out_dir)
    parent, removed = out.absolute().parent, []
    try:
        candidates = [p for p in parent.iterdir()
                      if p.name.startswith((f".{out.name}.tmp-", f".{out.name}.old-"))]
    except OSError:
        return removed
    for path in candidates:
        try:
            if not path.is_dir() or path.is_symlink():
                continue
            owner_file = path / OWNER_FILE
            if owner_file.is_file():
                try:
                    owner = json.loads(owner_file.read_text())
                except (OSError, ValueError):
                    owner = {}
                if isinstance(owner, dict) and _owner_alive(owner):
                    continue
            elif time.time() - path.stat().st_mtime < UNOWNED_GRACE_S:
                continue
            shutil.rmtree(path)
            removed.append(path)
        except OSError:
            continue
    return removed


class ArtifactWriter:
    """Build an artifact in a temp dir next to OUT; move it into place on `finish()`.

        with ArtifactWriter(out) as w:
            entries = write_weights(w.path / "weights.bin", arrays)
            ...                               # write the library etc. under w.path
            w.stage_manifest(manifest)        # w.path is now loadable (for verification)
            manifest["verification"] = ...    # run it, record the result
            w.finish(manifest)                # OUT now holds the new artifact

    Leaving the block by an exception, or without `finish()`, removes the temp dir and
    leaves OUT untouched. A bad OUT is an ArtifactError on entry, before any work.
    """

    def __init__(self, out_dir: str | os.PathLike):
        self.out_dir = Path(out_dir)
        self._tmp: Path | None = None
        self._finished = False

    def __enter__(self) -> "ArtifactWriter":
        check_output_dir(self.out_dir)
        parent = self.out_dir.absolute().parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.out_dir)
            tmp = Path(tempfile.mkdtemp(prefix=f".{self.out_dir.name}.tmp-", dir=parent))
            (tmp / OWNER_FILE).write_text(json.dumps(_owner_record()))
        except OSError as e:
            raise ArtifactError(f"{self.out_dir}: cannot create the artifact directory "
                                f"({e.strerror or e})") from None
        tmp.chmod(0o755)
        self._tmp = tmp
        return self

    @property
    def path(self) -> Path:
        """The temp dir where the artifact's files are written."""
        if self._tmp is None or self._finished:
            raise RuntimeError("ArtifactWriter.path is only valid inside the with-block "
                               "before finish()")
        return self._tmp

    def reset(self) -> None:
        """Empty the temp dir (its owner record kept) for a rebuild from scratch (the
        verification recovery builds the artifact again)."""
        for child in self.path.iterdir():
            if child.name == OWNER_FILE:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()

    def _complete(self, manifest: Mapping[str, Any]) -> dict:
        m = to_plain(manifest)
        m.setdefault("format_version", FORMAT_VERSION)
        m.setdefault("created", utc_now())
        m["files"] = file_checksums(self.path)
        validate_manifest(m, os.path.join(str(self.out_dir), MANIFEST))
        return m

    def stage_manifest(self, manifest: Mapping[str, Any]) -> dict:
        """Write manifest.yaml (with `files` computed) into the temp dir without moving
        it, so `read_manifest(w.path)` and the executors can load it. Returns it."""
        m = self._complete(manifest)
        _write_text_atomic(self.path / MANIFEST, dump_manifest(m))
        return m

    def finish(self, manifest: Mapping[str, Any]) -> dict:
        """Write the final manifest (`files` recomputed) and move the artifact to OUT.
        Returns the manifest as written."""
        (self.path / OWNER_FILE).unlink(missing_ok=True)
        m = self._complete(manifest)
        _write_text_atomic(self.path / MANIFEST, dump_manifest(m))
        check_output_dir(self.out_dir)
        try:
            _swap_into_place(self.path, self.out_dir)
        except OSError as e:
            raise ArtifactError(f"{self.out_dir}: cannot move the new artifact into place "
                                f"({e.strerror or e})") from None
        self._finished = True
        return m

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self._finished and self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None
        return False
