"""ONNX model -> graph IR with static shapes, or symbolic sizes where a range binds a
dimension (`input_dims.resolve`: `shapes` per input, `dims` per named dimension).

Assumes: default-domain opsets `OPSET_RANGE` (1..28), each op in a schema version the
handlers read (`versions.py`: the forms in force from opset 7 on); other domains and
unknown ops are unsupported; every graph input has a static shape, or one is bound
through `shapes` / `dims`. Symbolic sizes (`hidetc.graph.symbolic`) are decided over
their ranges while importing (`assume`); shape values holding them fold as object
arrays, and what cannot be one expression over the range is a ShapeError naming the
node.
Guarantees: every user-caused problem is a `ModelError` (or `UnsupportedOpError`, or a
`ShapeError` from inference) with a one-line message starting with "<file>: ". The graph
keeps ONNX value names, graph input/output order, and every node (Constant nodes and
initializers become `Graph.constants`; nothing is folded). Types come from our own
`infer_node`, run in topological order while propagating known VALUES: constants,
Shape/Size of static types, and any node whose inputs are all known and small, so that
exporter Shape->Gather->Concat->Reshape chains resolve to static shapes.
"""
from __future__ import annotations

import math
import os
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np
import onnx
import onnx.inliner
from google.protobuf.message import DecodeError

from hidetc.errors import HidetcError, ModelError, ShapeError, UnsupportedOpError
from hidetc.frontend.onnx import control_flow, functions
from hidetc.frontend.onnx.base import label as label_of
from hidetc.frontend.onnx.functions import has_function
from hidetc.frontend.onnx.fuse_qdq import fuse_qdq
from hidetc.frontend.onnx.handlers import Context, OnnxNode, convert, supported_extra_ops
from hidetc.frontend.onnx.input_dims import resolve, symbol_name
from hidetc.frontend.onnx.tensors import attribute_value, tensor_array, value_info_dims
from hidetc.frontend.onnx.versions import (
    DEFAULT_DOMAINS,
    OPSET_RANGE,
    check_opset,
    check_versions,
    is_onnx_op,
)
from hidetc.graph.dims import DimRange, parse_size
from hidetc.graph.evaluate import evaluate_node, infer_node, type_values
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.graph.ops.registry import REGISTRY
from hidetc.graph.symbolic import SymbolicError, SymDim, assume, evaluate

__all__ = ["OPSET_RANGE", "import_model", "load_model"]
DimText = "int | str | DimRange"   # a size, its range, or the range's text "1..512"
FOLD_LIMIT = 1 << 20  # elements: larger values are not computed just to know them


def load_model(path: str | os.PathLike, shapes: Mapping[str, Sequence] | None = None,
               dims: Mapping[str, DimText] | None = None,
               shape_opts: Mapping[str, Sequence[Sequence[int]]] | None = None,
               dim_opts: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Read an ONNX file (external data next to it) and import it."""
    path = os.fspath(path)
    source = os.path.basename(path) or path
    if not os.path.exists(path):
        raise ModelError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise ModelError(f"{path}: not a file")
    try:
        proto = onnx.load(path, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ModelError(f"{source}: not a valid ONNX model ({reason})") from None
    except OSError as error:
        raise ModelError(f"{source}: cannot read file ({error.strerror or error})") from None
    return import_model(proto, base_dir=os.path.dirname(os.path.abspath(path)), shapes=shapes,
                        dims=dims, shape_opts=shape_opts, dim_opts=dim_opts, source=source)


def import_model(proto: onnx.ModelProto, base_dir: str | None = None,
                 shapes: Mapping[str, Sequence] | None = None,
                 dims: Mapping[str, DimText] | None = None,
                 shape_opts: Mapping[str, Sequence[Sequence[int]]] | None = None,
                 dim_opts: Mapping[str, Sequence[int]] | None = None,
                 source: str | None = None) -> Graph:
    """Convert an in-memory ModelProto; `base_dir` locates external data files.
    `shapes` binds inputs (per dimension a size, a DimRange or its text "1..512"),
    `dims` the file's named dimensions, `shape_opts` / `dim_opts` the sizes to tune at
    (`input_dims.resolve`). A quantized model's QDQ patterns (DequantizeLinear ->
    Conv / MatMul / Gemm -> QuantizeLinear) are read as the integer ops ONNX Runtime
    fuses them into (`fuse_qdq`)."""
    source = source or (proto.graph.name or "model")
    try:
        # ONNX Runtime's QDQ patterns as the integer ops it runs them as (`fuse_qdq`)
        proto, _ = fuse_qdq(proto, base_dir or os.getcwd())
        return _Importer(proto, base_dir or os.getcwd(), dict(shapes or {}),
                         dict(dims or {}), dict(shape_opts or {}), dict(dim_opts or {})).run()
    except HidetcError as error:
        raise type(error)(f"{source}: {error}") from None


def _node_names(graph: onnx.GraphProto) -> list[str]:
    return [n.name or f"{n.op_type}_{i}" for i, n in enumerate(graph.node)]


def _with_subgraphs(graph: onnx.GraphProto, names: list[str]
                    ) -> list[tuple[onnx.NodeProto, str]]:
    """(node, name) of the graph's nodes and of every node of their subgraphs."""
    pairs = []
    for node, name in zip(graph.node, names):
        pairs.append((node, name))
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                pairs += [(inner, f"{name}/{inner.name or inner.op_type}")
                          for inner in control_flow.subgraph_nodes(attr.g)]
    return pairs


@lru_cache(maxsize=1)
def _known_ops() -> frozenset[str]:
    """ONNX ops read by a handler or the catalogue (fixed once the modules are imported)."""
    return frozenset(op for op in set(REGISTRY) | set(supported_extra_ops()) if is_onnx_op(op))


def _opsets(proto: onnx.ModelProto) -> dict[str, int]:
    """Imported opset per domain ("" for ai.onnx)."""
    return {("" if o.domain in DEFAULT_DOMAINS else o.domain): o.version
            for o in proto.opset_import}


def _has_function(node: onnx.NodeProto, opsets: Mapping[str, int]) -> bool:
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    return has_function(node.op_type, opsets.get(domain, 0), domain)


def _check_supported(graph: onnx.GraphProto, names: list[str], opsets: Mapping[str, int],
                     pairs: list[tuple[onnx.NodeProto, str]] | None = None,
                     inside: str = "") -> None:
    """UnsupportedOpError naming the unsupported ops (those with an ONNX function body
    are read through it: `functions.py`) or an unread schema version."""
    known = _known_ops()
    missing: dict[str, str] = {}
    pairs = _with_subgraphs(graph, names) if pairs is None else pairs
    for node, name in pairs:
        default = node.domain in DEFAULT_DOMAINS
        key = node.op_type if default else f"{node.domain}.{node.op_type}"
        readable = (default and node.op_type in known) or _has_function(node, opsets)
        if not readable and key not in missing:
            missing[key] = name
    if missing:
        listing = ", ".join(f"{op} (node '{name}')" for op, name in missing.items())
        raise UnsupportedOpError(f"unsupported ops: {listing}{inside}")
    check_versions(((node.op_type, name) for node, name in pairs
                    if node.domain in DEFAULT_DOMAINS), opsets[""])


# the most elements a tensor may have: byte offsets stay inside int64 (the kernels
# index in int64 past int32's range: `hidetc.tir.ir`), so any machine's memory is
# smaller; what a target indexes or holds is checked when the model is planned for it
MAX_ELEMENTS = 2 ** 60


def _check_extent(what: str, shape: Sequence, symbols: Mapping[str, DimRange] = {}
                  ) -> None:
    """ModelError unless every dim of `shape` is >= 0 and it has at most MAX_ELEMENTS; a
    symbolic shape is checked with its symbols at the ends of their ranges."""
    if any(isinstance(d, SymDim) for d in shape):
        for end in ("lo", "hi"):
            sizes = {name: getattr(r, end) for name, r in symbols.items()}
            _check_extent(f"{what} (at {', '.join(f'{k}={v}' for k, v in sizes.items())})",
                          [evaluate(d, sizes) for d in shape])
        return
    for i, d in enumerate(shape):
        if d < 0:
            raise ModelError(f"{what} dim {i} is {d}; dimensions must be >= 0")
    size = math.prod(shape)
    if size > MAX_ELEMENTS:
        raise ModelError(f"{what} has {size} elements (shape {list(shape)}), more than "
                         f"any machine can hold (2^60)")


def _declared_dims(info: onnx.ValueInfoProto) -> tuple[str, list[int | str | None] | None]:
    described = value_info_dims(info)
    if described is None:
        raise ModelError(f"input '{info.name}' is not a tensor")
    return described


def _bound_ranges(name: str, dims: Sequence) -> list[DimRange]:
    """One input's --shape (ints, DimRanges or their text) as DimRanges."""
    if any(isinstance(d, int) and not isinstance(d, bool) and d < 0 for d in dims):
        raise ModelError(f"input '{name}': bound shape {list(dims)} is negative")
    return [_dim_range(f"input '{name}'", d) for d in dims]


def _dim_range(what: str, value: DimText) -> DimRange:
    if isinstance(value, DimRange):
        return value
    try:
        return parse_size(str(int(value)) if isinstance(value, int) else str(value))
    except (ValueError, TypeError) as error:
        raise ModelError(f"{what}: {error}") from None


def _topological(nodes: list[OnnxNode], available: set[str]) -> list[OnnxNode]:
    """Nodes in a dependency-respecting order (stable: ONNX order when already valid)."""
    ready, pending = set(available) | {""}, list(nodes)
    ordered: list[OnnxNode] = []
    while pending:
        waiting = []
        for node in pending:
            if all(i in ready for i in node.inputs + node.implicit):
                ordered.append(node)
                ready.update(node.outputs)
            else:
                waiting.append(node)
        if len(waiting) == len(pending):
            node = waiting[0]
            value = next(i for i in node.inputs + node.implicit if i not in ready)
            raise ModelError(f"node '{node.name}' ({node.op}): input '{value}' is not produced "
                             f"by any node, initializer or graph input (or there is a cycle)")
        pending = waiting
    return ordered


class _Importer:
    """One import: mutable bookkeeping in one place, used once by `import_model`."""

    def __init__(self, proto: onnx.ModelProto, base_dir: str, shapes: dict, dims: dict,
                 shape_opts: dict, dim_opts: dict):
        self.proto, self.base_dir, self.shapes, self.dims = proto, base_dir, shapes, dims
        self.shape_opts, self.dim_opts = shape_opts, dim_opts
        self.types: dict[str, TensorType] = {}
        self.values: dict[str, np.ndarray] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        self.node_names: set[str] = set()
        self.symbols: dict[str, DimRange] = {}
        self.opsets = _opsets(proto)

    def run(self) -> Graph:
        opset = check_opset(self.proto)
        proto = self.proto
        if proto.functions:
            proto = onnx.inliner.inline_local_functions(proto)
        graph = proto.graph
        names = _node_names(graph)
        _check_supported(graph, names, self.opsets)
        inputs = self._read_inputs(graph)
        with assume(self.symbols):   # shape decisions hold over the symbols' ranges
            return self._convert(opset, graph, names, inputs)

    def _convert(self, opset: int, graph: onnx.GraphProto, names: list[str],
                 inputs: tuple[str, ...]) -> Graph:
        decoded = [self._decode(n, name) for n, name in zip(graph.node, names)]
        used = {i for n in decoded for i in n.inputs + n.implicit}
        used |= {o.name for o in graph.output}
        every = {v for n in decoded for v in n.inputs + n.outputs} | set(self.types)
        ctx = Context(opset, self.types, used, set(every), self.values)
        work = _topological(decoded, set(self.types))[::-1]   # a stack: next node last
        known = _known_ops()
        while work:
            node = work.pop()
            expand = control_flow.EXPANDERS.get(node.op)
            if expand is not None:   # control flow: splice the subgraph copies in
                spliced = expand(node, ctx, self._decode)
                work.extend(_topological(spliced, set(self.types))[::-1])
                continue
            if node.source is not None and (node.op not in known or node.source.domain
                                            not in DEFAULT_DOMAINS):   # a function body
                domain = "" if node.source.domain in DEFAULT_DOMAINS else node.source.domain
                spliced = functions.expand(
                    node, self.opsets.get(domain, 0),
                    [self.types.get(i) if i else None for i in node.inputs],
                    ctx.fresh(f"{node.name}/{node.op}"), ctx.fresh, self._decode)
                _check_supported(graph, [], self.opsets, [(n.source, n.name) for n in spliced],
                                 f" (in the function body of {label_of(node)})")
                ctx.used.update(i for n in spliced for i in n.inputs + n.implicit)
                work.extend(_topological(spliced, set(self.types))[::-1])
                continue
            try:
                converted = convert(node, ctx)
            except SymbolicError as error:   # a decomposition that needs a number
                raise ShapeError(f"{label_of(node)}: {error} (its decomposition needs the "
                                 f"number at compile time: bind that size to one value)"
                                 ) from None
            for name, array in converted.constants.items():
                self._add_constant(name, array)
            for made in converted.nodes:
                self._add_node(made)
        outputs = tuple(o.name for o in graph.output)
        for name in outputs:
            if name not in self.types:
                raise ModelError(f"graph output '{name}' is not produced by any node")
        return Graph(inputs, outputs, tuple(self.nodes), self.types, self.constants,
                     graph.name or "graph", self.symbols)

    def _read_inputs(self, graph: onnx.GraphProto) -> tuple[str, ...]:
        if graph.sparse_initializer:
            raise ModelError("sparse initializers are not supported")
        for tensor in graph.initializer:
            self._add_constant(tensor.name, tensor_array(tensor, self.base_dir,
                                                         f"initializer '{tensor.name}'"))
        declared = {i.name: _declared_dims(i) for i in graph.input
                    if i.name not in self.constants}
        bound = resolve({n: d for n, (_, d) in declared.items()},
                        {n: _bound_ranges(n, d) for n, d in self.shapes.items()},
                        {s: _dim_range(f"--dim {s}", r) for s, r in self.dims.items()},
                        self.shape_opts, self.dim_opts)
        self.symbols = {symbol_name(s): r for s, r in bound.symbols.items()}
        for name, (dtype, _) in declared.items():
            shape = tuple(SymDim.symbol(symbol_name(d)) if isinstance(d, str) else d
                          for d in bound.inputs[name])
            _check_extent(f"input '{name}'", shape, self.symbols)
            self.types[name] = TensorType(dtype, shape)
        return tuple(declared)

    def _decode(self, node: onnx.NodeProto, name: str) -> OnnxNode:
        label = f"node '{name}' ({node.op_type})"
        attrs, implicit = {}, set()
        keep_graphs = node.op_type in control_flow.GRAPH_OPS and node.domain in DEFAULT_DOMAINS
        keep_graphs |= _has_function(node, self.opsets)   # (its body builder reads them)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH and keep_graphs:
                attrs[a.name] = control_flow.Subgraph(a.g)
                implicit |= control_flow.free_values(a.g)
            else:
                attrs[a.name] = attribute_value(a, self.base_dir, label)
        return OnnxNode(node.op_type, tuple(node.input), tuple(node.output), name, attrs,
                        tuple(sorted(implicit)), node)

    def _add_constant(self, name: str, array: np.ndarray) -> None:
        self.constants[name] = array
        self.values[name] = array
        self.types[name] = TensorType.of(array)

    def _add_node(self, node: Node) -> None:
        types = [self.types[i] if i else None for i in node.inputs]
        values = [self.values.get(i) if i else None for i in node.inputs]
        out_types = infer_node(node, types, values)
        for name, t in zip(node.outputs, out_types):
            if name and t is not None:
                _check_extent(f"node '{node.name}' ({node.op}) output '{name}'", t.shape,
                              self.symbols)
        known = type_values(node, types)
        if known is None and self._foldable(node, out_types):
            try:
                known = evaluate_node(node, values)
            except ShapeError:
                if not any(v is not None and v.dtype == object for v in values):
                    raise
                known = None   # symbolic sizes it cannot compute with: left to run time
        for i, name in enumerate(node.outputs):
            if not name:
                continue
            self.types[name] = out_types[i]
            if known is not None:
                self.values[name] = known[i]
        if node.name in self.node_names:   # ONNX allows repeats; the passes key nodes by name
            base, count = node.name, 1
            while f"{base}_{count}" in self.node_names:
                count += 1
            node = node.with_(name=f"{base}_{count}")
        self.node_names.add(node.name)
        self.nodes.append(node)

    def _foldable(self, node: Node, out_types: list[TensorType | None]) -> bool:
        present = [i for i in node.inputs if i]
        if not present or any(i not in self.values for i in present):
            return False
        sizes = [self.types[i].size for i in present]
        sizes += [t.size for t in out_types if t is not None]
        if any(isinstance(n, SymDim) for n in sizes):
            return False                   # a tensor of symbolic size: computed at run time
        return sum(sizes) <= FOLD_LIMIT
