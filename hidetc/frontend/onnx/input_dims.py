"""Bind the graph inputs' dimensions: the ONNX file's sizes and symbols, the user's
`--shape` (per input) and `--dim` (per symbol name) sizes or ranges, and the tuning
sizes (`--shape-opt`, `--dim-opt`).

Decides: a dimension the file gives a number stays that number (a binding that
disagrees is an error); a dimension the file names (`dim_param`) is that symbol, shared
by every input that names it, bound by `--dim NAME=...` or by a `--shape` of any input
using it; a dimension the file leaves unknown is bound by `--shape` only, and when that
is a range it becomes a symbol of its own, named `INPUT_K`. A symbol bound to one size
is that number (a static dimension).
Guarantees: `InputDims` holds every declared input with a rank; every problem is a
ModelError with one line naming the input, dimension, symbol and the flag that binds
it, in the syntax the CLI parser takes.
"""
from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from hidetc.errors import ModelError
from hidetc.graph.dims import DimRange

Dims = Sequence["int | str | None"]   # one model input's dims: a size, a symbol, unknown


@dataclass(frozen=True)
class InputDims:
    """Per input its dims (a size or a symbol name); per symbol its range."""
    inputs: dict[str, tuple[int | str, ...]]
    symbols: dict[str, DimRange]

    @property
    def static(self) -> bool:
        return not self.symbols

    def shapes_at(self, sizes: Mapping[str, int]) -> dict[str, list[int]]:
        """Every input's shape with the symbols at `sizes`."""
        return {name: [d if isinstance(d, int) else int(sizes[d]) for d in dims]
                for name, dims in self.inputs.items()}


def symbol_name(text: str) -> str:
    """The symbol a dimension name becomes: itself when a Python identifier (what the
    manifest's size expressions can name), else with every other character as `_`."""
    if text.isidentifier() and not keyword.iskeyword(text):
        return text
    safe = re.sub(r"\W", "_", text)
    return safe if safe.isidentifier() and not keyword.iskeyword(safe) else f"d_{safe}"


def _example(name: str, dims: Dims) -> str:
    """`--shape NAME=...` with the file's sizes and N where a size is missing."""
    return f"--shape {name}=" + "x".join(str(d) if isinstance(d, int) else "N" for d in dims)


def resolve(declared: Mapping[str, Dims | None],
            shapes: Mapping[str, Sequence[DimRange]] | None = None,
            dims: Mapping[str, DimRange] | None = None,
            shape_opts: Mapping[str, Sequence[Sequence[int]]] | None = None,
            dim_opts: Mapping[str, Sequence[int]] | None = None) -> InputDims:
    """Bind `declared` ({input: the file's dims, None when rankless}); see the module
    docstring for the rules."""
    shapes, dims = dict(shapes or {}), dict(dims or {})
    shape_opts, dim_opts = dict(shape_opts or {}), dict(dim_opts or {})
    for flag, given in (("--shape", shapes), ("--shape-opt", shape_opts)):
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise ModelError(f"{flag} names unknown input '{unknown[0]}' (model inputs: "
                             f"{', '.join(declared) or 'none'})")
    named = {d for ds in declared.values() if ds for d in ds if isinstance(d, str)}
    for flag, given in (("--dim", dims), ("--dim-opt", dim_opts)):
        unknown = sorted(set(given) - named)
        if unknown:
            raise ModelError(f"{flag} names '{unknown[0]}', which no input's dimension is "
                             f"called (the model's named dimensions: "
                             f"{', '.join(sorted(named)) or 'none'})")
    ranges: dict[str, DimRange] = dict(dims)
    bound_by: dict[str, str] = {s: f"--dim {s}={r}" for s, r in dims.items()}
    inputs: dict[str, list[int | str]] = {}
    for name, model_dims in declared.items():
        given = shapes.get(name)
        if given is None:
            inputs[name] = _unbound(name, model_dims)
            continue
        if model_dims is not None and len(model_dims) != len(given):
            raise ModelError(f"input '{name}': --shape gives {len(given)} dimensions, the "
                             f"model's input has {len(model_dims)} "
                             f"({'x'.join('?' if d is None else str(d) for d in model_dims)})")
        out: list[int | str] = []
        for k, rng in enumerate(given):
            model = model_dims[k] if model_dims is not None else None
            if isinstance(model, int):
                if not (rng.fixed and rng.lo == model):
                    raise ModelError(f"input '{name}' dim {k}: --shape gives {rng}, which "
                                     f"does not match the model's size {model}")
                out.append(model)
                continue
            symbol = model if isinstance(model, str) else symbol_name(f"{name}_{k}")
            flag = f"--shape {name}=... (dim {k})"
            if symbol in ranges and (ranges[symbol].lo, ranges[symbol].hi) != (rng.lo, rng.hi):
                raise ModelError(f"input '{name}' dim {k} is the model's dimension "
                                 f"'{symbol}': {flag} gives {rng}, {bound_by[symbol]} gave "
                                 f"{ranges[symbol]}")
            ranges.setdefault(symbol, rng)
            bound_by.setdefault(symbol, flag)
            out.append(symbol)
        inputs[name] = out
    for name, dims_ in inputs.items():   # symbols named in the file, bound by any input
        for k, d in enumerate(dims_):
            if isinstance(d, str) and d not in ranges:
                raise ModelError(
                    f"input '{name}' dim {k} is symbolic ('{d}'); bind it with --dim "
                    f"{d}=128 (one size) or --dim {d}=1..512 (a range)")
    ranges = _with_opts(ranges, inputs, shape_opts, dim_opts)
    fixed = {s: r.lo for s, r in ranges.items() if r.fixed}
    resolved = {n: tuple(fixed.get(d, d) if isinstance(d, str) else d for d in ds)
                for n, ds in inputs.items()}
    used = {d for ds in resolved.values() for d in ds if isinstance(d, str)}
    return InputDims(resolved, {s: r for s, r in ranges.items() if s in used})


def _unbound(name: str, model_dims: Dims | None) -> list[int | str]:
    """An input no --shape binds: the file's dims (symbols stay names to bind by --dim)."""
    if model_dims is None:
        raise ModelError(f"input '{name}' has no shape; bind one with --shape "
                         f"{name}=1x3x224x224 (one size or a range like 1..64 per dimension)")
    for k, d in enumerate(model_dims):
        if d is None:
            raise ModelError(f"input '{name}' dim {k} is unknown (no size, or a negative "
                             f"one); bind it with {_example(name, model_dims)} (N one size, "
                             f"or a range like 1..64)")
    return list(model_dims)


def _with_opts(ranges: dict[str, DimRange], inputs: Mapping[str, Sequence[int | str]],
               shape_opts: Mapping[str, Sequence[Sequence[int]]],
               dim_opts: Mapping[str, Sequence[int]]) -> dict[str, DimRange]:
    """The ranges with the tuning sizes given (per symbol, or per input's shape)."""
    sizes: dict[str, set[int]] = {s: set(v) for s, v in dim_opts.items()}
    for name, opt_shapes in shape_opts.items():
        dims = inputs[name]
        for shape in opt_shapes:
            if len(shape) != len(dims):
                raise ModelError(f"--shape-opt {name}={'x'.join(map(str, shape))}: "
                                 f"{len(shape)} dimensions, the input has {len(dims)}")
            for k, (d, size) in enumerate(zip(dims, shape)):
                if isinstance(d, int):
                    if size != d:
                        raise ModelError(f"--shape-opt {name}: dim {k} is {size}, the "
                                         f"input's size there is {d}")
                    continue
                sizes.setdefault(d, set()).add(int(size))
    out = dict(ranges)
    for symbol, picks in sizes.items():
        rng = ranges[symbol]
        bad = sorted(p for p in picks if p not in rng)
        if bad:
            raise ModelError(f"tuning size {bad[0]} of dimension '{symbol}' is outside "
                             f"its range {rng}")
        out[symbol] = rng.with_opts(tuple(picks))
    return out
