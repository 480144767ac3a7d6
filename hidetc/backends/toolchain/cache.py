"""A content-addressed build cache on disk.

Root: `$HIDETC_CACHE_DIR`, else `~/.cache/hidetc` (read when a cache is created, not at
import). Layout:

    <root>/objects/<k[:2]>/<k>.o     compiled objects, k = sha256 of the inputs
    <root>/build/<k>/<name>.c        the source of every compile (kept for reproduction)
    <root>/build/<k>/<name>.log      the compiler's output when the compile failed

A key is the sha256 of its parts (source text, flags, compiler identity), each
length-prefixed so no two part lists collide. Entries are written atomically: a unique
temporary file in the destination directory, then `os.replace`, so concurrent builders
(threads or processes) never see a partial file; when two race on one key both produce
identical bytes and the last rename wins.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Iterable, Optional, Union

ENV_CACHE_DIR = "HIDETC_CACHE_DIR"


def default_cache_dir() -> Path:
    env = os.environ.get(ENV_CACHE_DIR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hidetc"


def cache_key(parts: Iterable[Union[str, bytes]]) -> str:
    h = hashlib.sha256()
    for p in parts:
        data = p.encode() if isinstance(p, str) else p
        h.update(f"{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()


def atomic_write(path: Path, data: Union[str, bytes]) -> Path:
    """Write `data` to `path` via a temporary file in the same directory + os.replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def temp_path_beside(path: Path) -> Path:
    """A fresh, unique file name in `path`'s directory (for a tool to write, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    return Path(tmp)


class BuildCache:
    """Paths of cached build products; see the module docstring for the layout."""

    def __init__(self, root: Optional[Union[str, Path]] = None):
        self.root = Path(root) if root is not None else default_cache_dir()

    def object_path(self, key: str) -> Path:
        return self.root / "objects" / key[:2] / f"{key}.o"

    def build_dir(self, key: str) -> Path:
        return self.root / "build" / key

    def lookup_object(self, key: str) -> Optional[Path]:
        path = self.object_path(key)
        return path if path.is_file() else None
