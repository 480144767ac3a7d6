"""plan.bin: the artifact's plan in the form the C runtime reads (no YAML parser there).

Written at compile time beside the manifest from the manifest itself (so it holds
exactly what the Python runtime executes) and listed in its `files` like every other
file. The C reader is `runtime/c/plan.c`; the layout below is the contract between them
(PLAN_FORMAT: bump it, and the reader's HX_PLAN_FORMAT, on any change).

Layout, little-endian, no padding:

    header   "HIDETCPL", u32 plan format, u32 ABI version needed, u64 body bytes
    body     the fields below, in order
    trailer  sha256 of header + body (a truncated or altered file fails here)

    str: u32 length + bytes (no NUL); list<X>: u32 count + items; expr: list<i64>, a
    stack program over the sizes (OPS); hash: 32 bytes.

    u32 manifest format; str target; str hidetc version
    list<str> cpu flags the kernels need (/proc/cpuinfo names); u32 cores compiled for;
    u32 libgomp spin count (`wait_policy.SPIN_COUNT`, set where the user set none)
    list<file: str path, hash sha256, u64 bytes>   every file the runtime opens
    i32 weights file index; i32 kernel library index (-1: none)
    list<symbol: str name, i64 min, i64 max>      the dynamic sizes, in `order`
    list<tensor> inputs; list<tensor> outputs
        tensor: str name, str dtype, u32 element bytes, list<expr> dims
    u64 arena bytes (the largest variant's)
    list<variant>
        list<guard: expr, u32 op>; str forward; u64 arena bytes;
        i64 kept-zero offset (-1: none); u64 its bytes
        list<source: u32 kind, u64 index (input/output index, weights offset), u64 bytes>
        list<launch: str kernel, u32 module, expr grid x3, u32 block x3, u32 shared
                     bytes, list<arg: u32 kind, i64 value (f32/f64 as their bits)>>
    list<module: str name, list<str arch, u32 file index>, str ptx arch, i32 ptx file>
    u32 graph cache (captured shapes per cuda context)

Guarantees: deterministic (the same manifest and files give the same bytes); every
problem a manifest could hold that the C side would trip on (a rank over
HIDETC_MAX_RANK, more than MAX_IO inputs) is a one-line ArtifactError here, at compile
time.
"""
from __future__ import annotations

import hashlib
import struct
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from hidetc import cpu_isa
from hidetc.backends.runtime import wait_policy
from hidetc.backends.runtime.artifact import sha256_file
from hidetc.backends.runtime.sizes import kept_zero, parse_dims
from hidetc.errors import ArtifactError
from hidetc.graph.guards import Guard
from hidetc.graph.symbolic import Quot, SymDim

PLAN_FILE = "plan.bin"
MAGIC = b"HIDETCPL"
PLAN_FORMAT = 1
ABI_VERSION = 1            # hidetc.h's HIDETC_ABI_VERSION the plan needs
MAX_RANK = 16              # hidetc.h's HIDETC_MAX_RANK
MAX_IO = 64                # internal.h's HX_MAX_IO (inputs, outputs, symbols)
OPS = {"const": 1, "sym": 2, "add": 3, "sub": 4, "mul": 5, "floordiv": 6, "neg": 7}
GUARD_OPS = {"<": 0, "<=": 1, ">": 2, ">=": 3}
SOURCES = {"kernel": 0, "input": 1, "output": 2, "constant": 3}
ARGS = {"input": 0, "output": 1, "arena": 2, "weights": 3, "size": 4, "i32": 10, "u32": 11,
        "i64": 12, "u64": 13, "f32": 14, "f64": 15}


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u32(self, v: int) -> None:
        self.parts.append(struct.pack("<I", int(v)))

    def i32(self, v: int) -> None:
        self.parts.append(struct.pack("<i", int(v)))

    def u64(self, v: int) -> None:
        self.parts.append(struct.pack("<Q", int(v)))

    def i64(self, v: int) -> None:
        self.parts.append(struct.pack("<q", int(v)))

    def str(self, s: str) -> None:
        data = str(s).encode("utf-8")
        self.u32(len(data))
        self.parts.append(data)

    def expr(self, words: Sequence[int]) -> None:
        self.u32(len(words))
        for w in words:
            self.i64(w)

    def bytes(self) -> bytes:
        return b"".join(self.parts)


def program(dim: Any, order: Sequence[str]) -> list[int]:
    """The stack program of a size (an int, or a SymDim over the symbols in `order`); a
    plain symbol is exactly [sym, k] (what the C side binds input dimensions by)."""
    if isinstance(dim, int):
        return [OPS["const"], int(dim)]
    if not isinstance(dim, SymDim):
        raise ArtifactError(f"plan: {dim!r} is not a size")
    words: list[int] = []
    for k, (mono, coef) in enumerate(dim.terms):
        if not mono:
            words += [OPS["const"], int(coef)]
        for j, atom in enumerate(mono):
            words += _atom(atom, order) + ([OPS["mul"]] if j else [])
        if mono and coef != 1:
            words += [OPS["const"], int(coef), OPS["mul"]]
        if k:
            words.append(OPS["add"])
    return words or [OPS["const"], 0]


def _atom(atom: Any, order: Sequence[str]) -> list[int]:
    if isinstance(atom, Quot):
        return program(atom.num, order) + [OPS["floordiv"], int(atom.den)]
    if atom not in order:
        raise ArtifactError(f"plan: size {atom!r} is not one of the artifact's symbols")
    return [OPS["sym"], list(order).index(atom)]


def _tensor(w: _Writer, spec: Mapping, order: Sequence[str], where: str) -> None:
    dims = parse_dims(spec["shape"], where)
    if len(dims) > MAX_RANK:
        raise ArtifactError(f"{where}: rank {len(dims)} is over the C runtime's "
                            f"{MAX_RANK}")
    w.str(spec["name"])
    w.str(spec["dtype"])
    w.u32(np.dtype(spec["dtype"]).itemsize)
    w.u32(len(dims))
    for d in dims:
        w.expr(program(d, order))


def write_plan(root: Path, manifest: Mapping[str, Any], abi: int = ABI_VERSION) -> Path:
    """Write `root`/plan.bin for `manifest` (its files must be in `root` already)."""
    order = list((manifest.get("dynamic") or {}).get("order") or [])
    for what in ("inputs", "outputs"):
        if len(manifest[what]) > MAX_IO:
            raise ArtifactError(f"plan: {len(manifest[what])} {what}, over the C runtime's "
                                f"{MAX_IO}")
    if len(order) > MAX_IO:
        raise ArtifactError(f"plan: {len(order)} symbolic sizes, over the C runtime's {MAX_IO}")
    files = _runtime_files(manifest)
    index = {path: k for k, path in enumerate(files)}
    w = _Writer()
    w.u32(int(manifest["format_version"]))
    w.str(manifest["target"])
    w.str(manifest["hidetc_version"])
    flags = _cpu_flags(manifest)
    w.u32(len(flags))
    for f in flags:
        w.str(f)
    w.u32(int((manifest.get("machine") or {}).get("cores") or 0))
    w.u32(wait_policy.SPIN_COUNT)
    w.u32(len(files))
    for path in files:
        w.str(path)
        w.parts.append(bytes.fromhex(sha256_file(root / path)))
        w.u64((root / path).stat().st_size)
    w.i32(index[manifest["weights"]["file"]])
    w.i32(index[manifest["library"]] if manifest.get("library") else -1)
    _symbols(w, manifest, order)
    for what in ("inputs", "outputs"):
        w.u32(len(manifest[what]))
        for spec in manifest[what]:
            _tensor(w, spec, order, f"{what[:-1]} {spec['name']!r}")
    w.u64(max(int(manifest["memory"]["arena_bytes"]), 64))
    _variants(w, manifest, order)
    _modules(w, manifest, index)
    w.u32(int((manifest.get("dynamic") or {}).get("graph_cache") or 8))
    body = w.bytes()
    head = MAGIC + struct.pack("<IIQ", PLAN_FORMAT, abi, len(body))
    data = head + body
    path = root / PLAN_FILE
    path.write_bytes(data + hashlib.sha256(data).digest())
    return path


def _runtime_files(manifest: Mapping[str, Any]) -> list[str]:
    """The files the runtime opens: the weights, the kernel library, the cuda images."""
    files = [manifest["weights"]["file"]]
    if manifest.get("library"):
        files.append(manifest["library"])
    for module in (manifest.get("cuda") or {}).get("modules") or ():
        files += [p for _, p in sorted(module.get("cubins", {}).items())]
        if module.get("ptx"):
            files.append(module["ptx"]["file"])
    return list(dict.fromkeys(files))


def _cpu_flags(manifest: Mapping[str, Any]) -> list[str]:
    """The /proc/cpuinfo flags a cpu artifact's kernels need (its ISA's and features)."""
    if manifest["target"] != "cpu":
        return []
    isa = cpu_isa.ISAS.get(manifest.get("cpu_isa", ""))
    flags = [isa.host_flag] if isa is not None else []
    return flags + [f for f in manifest.get("cpu_features") or () if f not in flags]


def _symbols(w: _Writer, manifest: Mapping[str, Any], order: Sequence[str]) -> None:
    symbols = (manifest.get("dynamic") or {}).get("symbols") or {}
    w.u32(len(order))
    for name in order:
        w.str(name)
        w.i64(int(symbols[name]["min"]))
        w.i64(int(symbols[name]["max"]))


def _variants(w: _Writer, manifest: Mapping[str, Any], order: Sequence[str]) -> None:
    dynamic = manifest.get("dynamic") or {}
    variants = dynamic.get("variants") or [{"forward": "hidetc_forward", "guards": []}]
    cuda = manifest.get("cuda") or {}
    launches = [cuda.get("launches") or []] + list(cuda.get("variant_launches") or [])
    modules = [m["name"] for m in cuda.get("modules") or ()]
    entries = manifest["weights"]["entries"]
    w.u32(len(variants))
    for k, v in enumerate(variants):
        guards = [Guard.parse(g) for g in v.get("guards") or ()]
        w.u32(len(guards))
        for g in guards:
            w.expr(program(g.expr, order))
            w.u32(GUARD_OPS[g.op])
        w.str(v.get("forward", "hidetc_forward"))
        w.u64(int(v.get("arena_bytes", manifest["memory"]["arena_bytes"])))
        offset, nbytes = kept_zero(manifest, k)
        w.i64(offset)
        w.u64(nbytes)
        sources = v.get("output_sources", manifest.get("output_sources")) or \
            [{"kind": "kernel"}] * len(manifest["outputs"])
        w.u32(len(sources))
        for s in sources:
            w.u32(SOURCES[s["kind"]])
            if s["kind"] == "constant":
                entry = entries[s["name"]]
                w.u64(int(entry["offset"]))
                w.u64(int(entry["nbytes"]))
            else:
                w.u64(int(s.get("index", 0)))
                w.u64(0)
        table = launches[k] if k < len(launches) and manifest["target"] == "cuda" else []
        w.u32(len(table))
        for launch in table:
            _launch(w, launch, modules, order)


def _launch(w: _Writer, launch: Mapping[str, Any], modules: list[str],
            order: Sequence[str]) -> None:
    w.str(launch["kernel"])
    w.u32(modules.index(launch["module"]))
    grid = list(launch["grid"]) + [1] * (3 - len(launch["grid"]))
    for g in grid:
        w.expr(program(parse_dims([g], "grid")[0], order))
    block = list(launch["block"]) + [1] * (3 - len(launch["block"]))
    for b in block:
        w.u32(int(b))
    w.u32(int(launch.get("shared_bytes", 0)))
    args = launch["args"]
    w.u32(len(args))
    for arg in args:
        kind, value = (arg["space"], arg["index"]) if isinstance(arg, Mapping) and \
            "space" in arg else (arg["type"], arg["value"]) if isinstance(arg, Mapping) \
            else arg
        w.u32(ARGS[kind])
        if kind == "f32":
            w.u64(struct.unpack("<I", struct.pack("<f", float(value)))[0])
        elif kind == "f64":
            w.u64(struct.unpack("<Q", struct.pack("<d", float(value)))[0])
        elif kind == "u64":
            w.u64(int(value))
        else:
            w.i64(int(value))


def _modules(w: _Writer, manifest: Mapping[str, Any], index: Mapping[str, int]) -> None:
    modules = (manifest.get("cuda") or {}).get("modules") or ()
    w.u32(len(modules))
    for m in modules:
        w.str(m["name"])
        cubins = sorted((m.get("cubins") or {}).items())
        w.u32(len(cubins))
        for arch, path in cubins:
            w.str(arch)
            w.u32(index[path])
        ptx = m.get("ptx") or {}
        w.str(ptx.get("arch", ""))
        w.i32(index[ptx["file"]] if ptx else -1)

