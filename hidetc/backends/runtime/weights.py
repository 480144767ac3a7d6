"""The weights file: every constant tensor of a compiled model in one flat binary file.

Format (never pickle): raw array bytes, C-contiguous, little-endian, each array starting
at a multiple of `alignment` bytes from the start of the file, zero padding between,
in the order of the dict given to `write_weights`. The file holds no header: where each
array lives is the `WeightEntry` table that `write_weights` returns and the manifest
stores (`weights.entries`), so the file is only meaningful together with its manifest.

Guarantees: writing is deterministic (same arrays in -> same bytes out). `read_weights`
maps the file once (read-only `np.memmap`, or one `np.fromfile` read) and returns
zero-copy views into that one blob; it checks every entry against the file length, the
dtype and the shape first and raises a one-line `ArtifactError` naming the file and the
weight when the file is too short or an entry is malformed.
Dtypes: numpy's bool/int/uint/float, plus the ml_dtypes types hidetc's graphs use
(`ML_DTYPES`: bfloat16 and the narrow float8/float4/int4/int2 types, one element per
byte), written as their bytes and named by their ml_dtypes name.
Assumes: a little-endian host (x86-64, aarch64), as the executors do.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import ml_dtypes  # noqa: F401  (registers the bfloat16/float8/int4 dtype names with numpy)
import numpy as np

from hidetc.errors import ArtifactError

_ENTRY_KEYS = ("offset", "nbytes", "dtype", "shape")
ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
             "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2", "uint2")


@dataclass(frozen=True, slots=True)
class WeightEntry:
    """Where one array lives in the weights file."""
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict:
        """The manifest form: {offset, nbytes, dtype, shape (a list)}."""
        return {"offset": int(self.offset), "nbytes": int(self.nbytes), "dtype": self.dtype,
                "shape": [int(d) for d in self.shape]}

    @staticmethod
    def from_dict(d: Any, where: str = "weights") -> "WeightEntry":
        """Parse the manifest form; a malformed entry is a one-line ArtifactError."""
        if isinstance(d, WeightEntry):
            return d
        if not isinstance(d, Mapping) or any(k not in d for k in _ENTRY_KEYS):
            raise ArtifactError(f"{where}: malformed weight entry (expected keys "
                                f"{', '.join(_ENTRY_KEYS)})")
        shape, offset, nbytes = d["shape"], d["offset"], d["nbytes"]
        if (not isinstance(shape, (list, tuple)) or not _all_ints([offset, nbytes, *shape])
                or offset < 0 or nbytes < 0 or any(s < 0 for s in shape)):
            raise ArtifactError(f"{where}: malformed weight entry (offset, nbytes and shape "
                                f"must be non-negative integers)")
        return WeightEntry(offset, nbytes, str(d["dtype"]), tuple(shape))


def _all_ints(xs: list) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) for x in xs)


def _as_little_endian(name: str, array: Any) -> np.ndarray:
    a = np.asarray(array)
    if a.dtype.name in ML_DTYPES:
        return np.ascontiguousarray(a)
    if a.dtype.kind not in "biuf":
        raise ValueError(f"weight {name!r} has unsupported dtype {a.dtype}")
    if np.dtype(a.dtype.name) != a.dtype.newbyteorder("="):
        raise ValueError(f"weight {name!r} has dtype {a.dtype} that does not round-trip "
                         f"by name")
    return np.asarray(a.astype(a.dtype.newbyteorder("<"), copy=False), order="C")


def write_weights(path: str | os.PathLike, arrays: Mapping[str, Any],
                  alignment: int = 64) -> dict[str, WeightEntry]:
    """Write `arrays` (in dict order) to `path`; return {name: WeightEntry}."""
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a positive power of two, got {alignment}")
    entries: dict[str, WeightEntry] = {}
    pos = 0
    with open(path, "wb") as f:
        for name, array in arrays.items():
            a = _as_little_endian(name, array)
            offset = (pos + alignment - 1) // alignment * alignment
            f.write(b"\0" * (offset - pos))
            f.write(a.reshape(-1).view(np.uint8).data)
            pos = offset + a.nbytes
            entries[name] = WeightEntry(offset, int(a.nbytes), a.dtype.name,
                                        tuple(int(d) for d in a.shape))
    return entries


def _checked_entry(path: Path, name: str, raw: Any, file_bytes: int) -> tuple[WeightEntry,
                                                                              np.dtype]:
    e = WeightEntry.from_dict(raw, f"{path}: weight {name!r}")
    try:
        dtype = np.dtype(e.dtype).newbyteorder("<")
    except TypeError:
        raise ArtifactError(f"{path}: weight {name!r} has unknown dtype {e.dtype!r}") from None
    expected = int(np.prod(e.shape, dtype=np.int64)) * dtype.itemsize
    if expected != e.nbytes:
        raise ArtifactError(f"{path}: weight {name!r} is {e.dtype}{list(e.shape)} "
                            f"({expected} bytes) but its entry says {e.nbytes} bytes")
    if e.offset + e.nbytes > file_bytes:
        raise ArtifactError(f"{path}: truncated: weight {name!r} needs bytes {e.offset}.."
                            f"{e.offset + e.nbytes} but the file has {file_bytes} bytes")
    return e, dtype


def read_weights(path: str | os.PathLike, entries: Mapping[str, Any], *,
                 mmap: bool = True) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Load the weights file once; return (blob of uint8, {name: zero-copy view}).

    `entries` maps names to `WeightEntry` or its manifest dict form. With `mmap` the
    blob is a read-only memory map (pages load on first touch, views are read-only);
    without it the file is read into memory in one call (views are writable).
    """
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: weights file is missing")
    file_bytes = path.stat().st_size
    checked = {name: _checked_entry(path, name, raw, file_bytes)
               for name, raw in entries.items()}
    if file_bytes == 0:
        blob = np.zeros(0, dtype=np.uint8)
    elif mmap:
        blob = np.memmap(path, dtype=np.uint8, mode="r")
    else:
        blob = np.fromfile(path, dtype=np.uint8)
    views = {name: np.ndarray(e.shape, dtype=dtype, buffer=blob, offset=e.offset)
             for name, (e, dtype) in checked.items()}
    return blob, views
