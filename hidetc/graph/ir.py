"""Graph IR: typed values with static shapes, nodes, and an immutable graph.

Assumes: every value has a dtype (a numpy dtype name such as "float32") and a shape
whose dimensions are ints or symbolic sizes (`hidetc.graph.symbolic.SymDim`, ranged by
`Graph.symbols`; a static graph has none). Guarantees: `Graph` is immutable; passes
build new graphs with `Graph.replace(...)`. Node attributes are normalized to hashable Python values
(int, float, str, tuples of those); tensors never live in attributes: constant
tensors live in `Graph.constants` keyed by value name.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import ml_dtypes  # noqa: F401  (registers the bfloat16 and narrow dtype names with numpy)
import numpy as np

from hidetc.graph.dims import DimRange
from hidetc.graph.symbolic import Dim, SymDim, evaluate

# the narrow ONNX types, named as ml_dtypes names them and stored one element per byte;
# only Cast and data-movement ops take them (see hidetc.compute.narrow_types)
NARROW_DTYPES = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                 "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2", "uint2")
DTYPES = ("float32", "float16", "float64", "bfloat16", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64", "bool") + NARROW_DTYPES
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True, slots=True)
class TensorType:
    """A dtype and a shape; a dimension is a non-negative int or a `SymDim` (a symbolic
    size: `hidetc.graph.symbolic`), and `size`/`nbytes` are then SymDims too."""
    dtype: str
    shape: tuple[Dim, ...]

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")
        if any(not (isinstance(d, SymDim) or (isinstance(d, int) and d >= 0))
               for d in self.shape):
            raise ValueError(f"shape must be non-negative ints or symbolic sizes, "
                             f"got {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def symbolic(self) -> bool:
        return any(isinstance(d, SymDim) for d in self.shape)

    @property
    def size(self) -> Dim:
        if self.symbolic:
            return math.prod(self.shape)
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> Dim:
        return self.size * np.dtype(self.dtype).itemsize

    def at(self, sizes: Mapping[str, int]) -> "TensorType":
        """The static type with the symbols at `sizes`."""
        if not self.symbolic:
            return self
        return TensorType(self.dtype, tuple(evaluate(d, sizes) for d in self.shape))

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    @staticmethod
    def of(array: np.ndarray) -> "TensorType":
        """The type of a value; an object array is a shape value holding symbolic
        sizes, int64 (`hidetc.graph.ops.misc.shape_value`)."""
        dtype = "int64" if array.dtype == object else str(array.dtype)
        return TensorType(dtype, tuple(int(d) for d in array.shape))


def freeze_attr(value: Any) -> Any:
    """Normalize an attribute value to a hashable Python value."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr(v) for v in value)
    if isinstance(value, np.ndarray):
        return tuple(freeze_attr(v) for v in value.tolist()) if value.ndim else value.item()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (int, float, str, bool, SymDim)) or value is None:
        return value     # (a SymDim: a symbolic size in a shape parameter, immutable)
    raise TypeError(f"attribute value of type {type(value).__name__} is not supported")


@dataclass(frozen=True, slots=True)
class Node:
    """One operator application. An empty string in `inputs` is an omitted optional input."""
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    name: str = ""

    @staticmethod
    def make(op: str, inputs: Iterable[str], outputs: Iterable[str], name: str = "",
             **attrs: Any) -> "Node":
        frozen = tuple(sorted((k, freeze_attr(v)) for k, v in attrs.items()))
        return Node(op, tuple(inputs), tuple(outputs), frozen, name)

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def with_(self, **changes: Any) -> "Node":
        if "attrs" in changes and isinstance(changes["attrs"], Mapping):
            attrs = changes["attrs"].items()
            changes["attrs"] = tuple(sorted((k, freeze_attr(v)) for k, v in attrs))
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, eq=False)
class Graph:
    """A whole model. `types` covers every value (inputs, constants, node outputs)."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]
    types: Mapping[str, TensorType]
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)
    name: str = "graph"
    symbols: Mapping[str, DimRange] = field(default_factory=dict)   # the symbolic sizes
                                      # the types use, each with its range (static: none)

    def __post_init__(self):
        object.__setattr__(self, "types", MappingProxyType(dict(self.types)))
        object.__setattr__(self, "constants", MappingProxyType(dict(self.constants)))
        object.__setattr__(self, "symbols", MappingProxyType(dict(self.symbols)))

    def replace(self, **changes: Any) -> "Graph":
        return dataclasses.replace(self, **changes)

    def at(self, sizes: Mapping[str, int]) -> "Graph":
        """The static graph with every symbolic size at `sizes`: types, and the shape
        values (object arrays) among the constants."""
        if not self.symbols:
            return self
        constants = {k: (np.array([evaluate(v, sizes) for v in a.ravel()], np.int64)
                         .reshape(a.shape) if a.dtype == object else a)
                     for k, a in self.constants.items()}
        return dataclasses.replace(self, types={k: t.at(sizes) for k, t in self.types.items()},
                                   constants=constants, symbols={})

    def type_of(self, value: str) -> TensorType:
        return self.types[value]

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for value in node.inputs:
                if value:
                    users.setdefault(value, []).append(node)
        return users

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return counts

    def __str__(self) -> str:
        return format_graph(self)


def format_graph(graph: Graph) -> str:
    """A readable listing: one line per input, constant summary and node."""
    lines = [f"graph {graph.name}("]
    lines += [f"  {name}: {graph.types[name]}" for name in graph.inputs]
    lines.append(f") constants={len(graph.constants)} nodes={len(graph.nodes)} {{")
    for node in graph.nodes:
        outs = ", ".join(f"{o}: {graph.types[o]}" if o in graph.types else o for o in node.outputs)
        attrs = "".join(f" {k}={v}" for k, v in node.attrs)
        lines.append(f"  {outs} = {node.op}({', '.join(node.inputs)}){attrs}")
    lines.append(f"  return {', '.join(graph.outputs)}")
    lines.append("}")
    return "\n".join(lines)
