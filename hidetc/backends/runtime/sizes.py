"""The symbolic sizes of one pass of a dynamic artifact: bound from the inputs' shapes,
checked against their ranges, and the dispatch variant they select.

A dynamic artifact's manifest writes a symbolic dimension as its expression's text
("seq", "2*batch") in `inputs[*].shape` / `outputs[*].shape`, and adds `dynamic`:
`symbols` (name -> {min, max, opt}), `order` (the sizes array's order, what the
kernels' size arguments index) and `variants` (each with its `guards`, the facts its
kernels rely on, as "EXPR OP 0" texts, and its launcher `forward`).

Guarantees: `bind` returns every symbol's size or raises a one-line InputError naming
the input, dimension, value and range (or the input that bound the symbol first);
`choose` picks the first variant whose guards all hold -- deterministic, nothing is
measured or written at run time -- and the compile made sure one does at every size of
the ranges (`hidetc.driver.dynamic`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from hidetc.errors import ArtifactError, InputError
from hidetc.graph.guards import Guard
from hidetc.graph.symbolic import Dim, SymDim, evaluate, parse
from hidetc.tir.scratch import ZEROED_REGION


def parse_dims(dims: list, where: str) -> tuple[Dim, ...]:
    """A manifest shape (ints, and expression texts for symbolic sizes)."""
    out = []
    for d in dims:
        if isinstance(d, int) and not isinstance(d, bool):
            out.append(d)
            continue
        try:
            out.append(parse(str(d)))
        except (ValueError, SyntaxError):
            raise ArtifactError(f"{where}: dimension {d!r} is not a size") from None
    return tuple(out)


@dataclass(frozen=True)
class Variant:
    guards: tuple[Guard, ...]
    forward: str               # its launcher function
    index: int


@dataclass(frozen=True)
class Dynamic:
    """A dynamic artifact's sizes: symbols with ranges, the inputs' and outputs' dims."""
    order: tuple[str, ...]
    ranges: Mapping[str, tuple[int, int]]
    inputs: tuple[tuple[str, tuple[Dim, ...]], ...]
    outputs: tuple[tuple[str, tuple[Dim, ...]], ...]
    variants: tuple[Variant, ...]

    def bind(self, arrays: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Each symbol's size in this pass (see the module docstring)."""
        sizes: dict[str, int] = {}
        bound_at: dict[str, str] = {}
        for name, dims in self.inputs:
            if name not in arrays:
                raise InputError(f"missing input {name!r} ({_text(dims)})")
            shape = np.shape(arrays[name])
            if len(shape) != len(dims):
                raise InputError(f"input {name!r}: expected {len(dims)} dimensions "
                                 f"({_text(dims)}), got shape {list(shape)}")
            for k, (dim, got) in enumerate(zip(dims, shape)):
                symbol = _plain_symbol(dim)
                if symbol is None:
                    continue
                lo, hi = self.ranges[symbol]
                if symbol in sizes:
                    if got != sizes[symbol]:
                        raise InputError(f"input {name!r} dim {k} is {got}, but '{symbol}' is "
                                         f"{sizes[symbol]} ({bound_at[symbol]})")
                    continue
                if not lo <= got <= hi:
                    raise InputError(f"input {name!r} dim {k} ('{symbol}') is {got}, outside "
                                     f"its range {lo}..{hi}")
                sizes[symbol] = int(got)
                bound_at[symbol] = f"input {name!r} dim {k}"
        missing = [s for s in self.order if s not in sizes]
        if missing:     # (every symbol is some input's dimension: a malformed artifact)
            raise ArtifactError(f"no input gives the size '{missing[0]}'")
        return sizes

    def shapes(self, sizes: Mapping[str, int]) -> dict[str, list[int]]:
        """Every input's and output's shape at `sizes`."""
        return {name: [evaluate(d, sizes) for d in dims]
                for name, dims in (*self.inputs, *self.outputs)}

    def choose(self, sizes: Mapping[str, int]) -> Variant:
        for variant in self.variants:
            if all(g.holds(sizes) for g in variant.guards):
                return variant
        text = ", ".join(f"{k}={v}" for k, v in sizes.items())
        raise ArtifactError(f"no dispatch variant of this artifact covers {text} "
                            f"(the compile checked every size of the ranges: the artifact "
                            f"was changed)")

    def array(self, sizes: Mapping[str, int]) -> np.ndarray:
        """The sizes array the kernels read (the manifest's symbol order)."""
        return np.array([sizes[s] for s in self.order] or [0], dtype=np.int64)


@dataclass(frozen=True)
class Pass:
    """What one pass on given inputs runs: the input and output specs at its sizes (the
    manifest's own for a static artifact), its dispatch variant and its sizes (empty
    when static)."""
    inputs: list[dict]
    outputs: list[dict]
    variant: int
    sizes: Mapping[str, int]


def pass_for(manifest: dict, dynamic: Optional[Dynamic],
             inputs: Mapping[str, np.ndarray]) -> Pass:
    """The `Pass` of `inputs` (one-line InputError where they are outside the ranges)."""
    if dynamic is None:
        return Pass(manifest["inputs"], manifest["outputs"], 0, {})
    return pass_at(manifest, dynamic, dynamic.bind(inputs))


def pass_at(manifest: dict, dynamic: Dynamic, sizes: Mapping[str, int]) -> Pass:
    """The `Pass` at `sizes` (every symbol's, inside the ranges)."""
    shapes = dynamic.shapes(sizes)
    return Pass([{**s, "shape": shapes[s["name"]]} for s in manifest["inputs"]],
                [{**s, "shape": shapes[s["name"]]} for s in manifest["outputs"]],
                dynamic.choose(sizes).index, sizes)


def read_dynamic(manifest: dict) -> Optional[Dynamic]:
    """The manifest's `dynamic` section read, or None for a static artifact."""
    section = manifest.get("dynamic")
    if not section:
        return None
    try:
        ranges = {name: (int(r["min"]), int(r["max"]))
                  for name, r in section["symbols"].items()}
        variants = tuple(Variant(tuple(Guard.parse(g) for g in v.get("guards", [])),
                                 str(v["forward"]), k)
                         for k, v in enumerate(section["variants"]))
        order = tuple(section["order"])
    except (KeyError, TypeError, ValueError) as error:
        raise ArtifactError(f"manifest: the dynamic section is malformed ({error})") from None
    inputs = tuple((s["name"], parse_dims(s["shape"], f"input {s['name']!r}"))
                   for s in manifest["inputs"])
    outputs = tuple((s["name"], parse_dims(s["shape"], f"output {s['name']!r}"))
                    for s in manifest["outputs"])
    return Dynamic(order, ranges, inputs, outputs, variants)


def _plain_symbol(dim: Dim) -> Optional[str]:
    """The symbol a dimension is exactly (`seq`), else None (a number, an expression)."""
    if isinstance(dim, SymDim) and len(dim.terms) == 1:
        mono, coef = dim.terms[0]
        if coef == 1 and len(mono) == 1 and isinstance(mono[0], str):
            return mono[0]
    return None


def _text(dims: tuple[Dim, ...]) -> str:
    return "x".join(str(d) for d in dims)


def variant_view(manifest: dict, variant: int) -> Optional[dict]:
    """The manifest as it reads for dispatch `variant`: its kernels (`launch_kernels`:
    names, the values of their arguments, what they write) and its arena layout
    (`memory`: offsets and bytes) in place of the first variant's; the manifest itself
    for the first (or a static artifact); None where the manifest holds no layout of
    the variant (an older hidetc's)."""
    if not variant:
        return manifest
    v = manifest["dynamic"]["variants"][variant]
    if "launch_kernels" not in v or "memory" not in v:
        return None
    return {**manifest, "kernels": v["launch_kernels"],
            "memory": {**v["memory"], "dtypes": manifest["memory"].get("dtypes", {})}}


def kept_zero(manifest: dict, variant: int) -> tuple[int, int]:
    """(offset, bytes) in the arena of the region dispatch `variant`'s kernels keep zero
    between passes (`tir.scratch.ZEROED_REGION`: split-K's arrival counters, zero before
    a pass and left zero by every completed one); (-1, 0) where it has none. Each
    variant lays out its own arena, so where another variant's values sat a context
    must zero this region before a pass that changes the variant (every runtime does:
    the cuda context, the emulator and the C runtime, `plan.bin`)."""
    memory = (manifest.get("memory") if not variant
              else manifest["dynamic"]["variants"][variant].get("memory")) or {}
    offsets = memory.get("offsets") or {}
    if ZEROED_REGION not in offsets:
        return -1, 0
    return int(offsets[ZEROED_REGION]), int(memory["bytes"][ZEROED_REGION])


def zero_inputs(manifest: dict, dynamic: Optional[Dynamic]) -> dict[str, np.ndarray]:
    """Zero inputs of the manifest's specs (a dynamic artifact's at each range's
    minimum)."""
    if dynamic is None:
        return {s["name"]: np.zeros(s["shape"], s["dtype"]) for s in manifest["inputs"]}
    shapes = dynamic.shapes({name: lo for name, (lo, _) in dynamic.ranges.items()})
    return {s["name"]: np.zeros(shapes[s["name"]], s["dtype"]) for s in manifest["inputs"]}
