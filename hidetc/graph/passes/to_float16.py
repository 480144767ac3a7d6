"""Lower a float32 graph to half-precision storage: float16 (`--precision f16`) or
bfloat16 (`--precision bf16` on cuda), the target type `dtype` of `run(graph, dtype)`.
Every float32 tensor inside the graph becomes `dtype`, the graph's interface stays
float32.

  - constants: float32 weights become `dtype` arrays (round to nearest even). Finite
    values beyond the type's range saturate to its largest finite value (float16:
    +-65504; bfloat16: +-3.39e38, since float32's largest, 3.4028e38, rounds up to
    bfloat16's infinity) instead of overflowing to infinity (exporters spell "minus
    infinity" as float32's lowest, -3.4e38, and multiply it by 0 or 1; an infinity
    would turn that into NaN); true infinities and NaNs are kept.
  - parameter inputs (an op's `value_inputs`: Reshape's shape, Slice's starts, ...) are
    read at compile time and keep their dtype: a constant used both as a parameter
    and as data (or a constant that is also a graph output) gets a `dtype` copy under
    a fresh name for the data uses.
  - graph inputs: each float32 input used by a node gets `Cast(to=dtype)` first and
    its uses read the cast; graph outputs: a node's float32 output that is a graph
    output is computed into a fresh `dtype` value and `Cast(to=float32)` right after
    the node writes the output name. The artifact's inputs and outputs (names, dtypes,
    shapes) are unchanged; an input or constant passed through as an output stays as is.
  - nodes: `Cast(to=float32)` becomes `Cast(to=dtype)`; a Cast that becomes a no-op
    (`dtype` to `dtype`) is dropped and its output renamed to its input. Output types
    come from the op's own inference rule; an op that still produces float32 from
    half inputs (a dtype attribute, such as ConstantOfShape's) gets its output cast
    to `dtype` under the original name.
Integer, bool and float64 tensors are untouched, and so are the values of the other
half type (a Cast to float16 in a bf16 compile stays one: the model asks for it).

How the kernels compute on the half type is the schedules' business: elementwise and
pooling kernels load it, compute in float32 and round once at the store; MatMul runs on
tensor cores with float32 accumulation; reductions accumulate in float32.

Guarantees: the same graph object when there is no float32 value to lower; otherwise
a graph that passes `verify_graph`, with the same inputs and outputs (names and types).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.graph.ops.registry import get_op
from hidetc.graph.passes.common import Rewriter, resolve

F32, F16, BF16 = "float32", "float16", "bfloat16"
# the half types and their largest finite values
HALF_MAX = {F16: float(np.finfo(np.float16).max),
            BF16: float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)}
SUFFIX = {F16: "f16", BF16: "bf16"}     # of the fresh names the pass makes


def to_half(array: np.ndarray, dtype: str = F16) -> np.ndarray:
    """float32 -> the half `dtype` (nearest even), finite values saturated to its range."""
    top = HALF_MAX[dtype]
    a = np.asarray(array, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        saturated = np.where(np.isfinite(a), np.clip(a, -top, top), a)
    return saturated.astype(dtype)


def to_float16(array: np.ndarray) -> np.ndarray:
    """float32 -> float16, finite values saturated to float16's range."""
    return to_half(array, F16)


def _uses(graph: Graph) -> tuple[set[str], set[str]]:
    """(values read as data, values read as parameters) by the graph's nodes."""
    data, params = set(), set()
    for node in graph.nodes:
        value_inputs = get_op(node.op).value_inputs
        for i, v in enumerate(node.inputs):
            if v:
                (params if i in value_inputs else data).add(v)
    return data, params


def run(graph: Graph, dtype: str = F16) -> Graph:
    """`graph` with float32 storage lowered to `dtype` (float16 or bfloat16; see the
    module docstring)."""
    if dtype not in HALF_MAX:
        raise ValueError(f"the half-storage lowering takes {' or '.join(HALF_MAX)}, "
                         f"got {dtype!r}")
    if not any(t.dtype == F32 for t in graph.types.values()):
        return graph
    return _Lowering(graph, dtype).run()


class _Lowering:
    def __init__(self, graph: Graph, dtype: str):
        self.graph = graph
        self.dtype, self.suffix = dtype, SUFFIX[dtype]
        self.rw = Rewriter(graph)
        self.data_subst: dict[str, str] = {}   # f32 input/constant -> its half copy (data uses)
        self.rename: dict[str, str] = {}       # every use: a graph output -> its half value,
        #                                        a dropped no-op Cast's output -> its input
        self.outputs = set(graph.outputs)

    def run(self) -> Graph:
        data, params = _uses(self.graph)
        self.lower_constants(data, params)
        self.cast_inputs(data)
        for node in self.graph.nodes:
            self.lower_node(node)
        return self.rw.finish()

    # the interface and the weights ----------------------------------------------------
    def lower_constants(self, data: set[str], params: set[str]) -> None:
        rw = self.rw
        for name, array in self.graph.constants.items():
            if array.dtype != np.float32 or name not in data:
                continue
            if name in params or name in self.outputs:
                self.data_subst[name] = rw.const(f"{name}_{self.suffix}",
                                                 to_half(array, self.dtype))
            else:
                rw.constants[name] = to_half(array, self.dtype)
                rw.types[name] = TensorType.of(rw.constants[name])
                rw.changed = True

    def cast_inputs(self, data: set[str]) -> None:
        for name in self.graph.inputs:
            if self.graph.types[name].dtype == F32 and name in data:
                self.data_subst[name] = self.rw.add("Cast", (name,), f"{name}_{self.suffix}",
                                                    to=self.dtype)

    # nodes -------------------------------------------------------------------------
    def lower_node(self, node: Node) -> None:
        rw = self.rw
        value_inputs = get_op(node.op).value_inputs
        inputs = []
        for i, v in enumerate(node.inputs):
            v = resolve(self.rename, v) if v else v
            if v and i not in value_inputs:
                v = self.data_subst.get(v, v)
            inputs.append(v)
        attrs = node.attr_dict
        if node.op == "Cast" and attrs.get("to") == F32:
            attrs["to"] = self.dtype
            if rw.types[inputs[0]].dtype == self.dtype:
                self.drop_cast(node.outputs[0], inputs[0])
                return
        new = node.with_(inputs=tuple(inputs), attrs=attrs)
        types = [rw.types[v] if v else None for v in new.inputs]
        values = [rw.constants.get(v) if v else None for v in new.inputs]
        inferred = infer_node(new, types, values)
        outs, after = [], []
        for out, t in zip(new.outputs, inferred):
            was_f32 = bool(out) and self.graph.types[out].dtype == F32
            if was_f32 and t.dtype == self.dtype and out in self.outputs:
                tmp = rw.values.fresh(f"{out}_{self.suffix}")   # half inside, f32 outside
                after.append((tmp, out, F32))
                self.rename[out] = tmp
                out = tmp
            elif was_f32 and t.dtype == F32 and out not in self.outputs:
                tmp = rw.values.fresh(f"{out}_f32")       # the op insists on f32
                after.append((tmp, out, self.dtype))
                out = tmp
            outs.append(out)
        new = new.with_(outputs=tuple(outs))
        rw.emit_typed(new)
        for src, dst, dtype in after:
            rw.add("Cast", (src,), f"{dst}_cast", out=dst, to=dtype)

    def drop_cast(self, out: str, source: str) -> None:
        """A Cast that became a half -> the same half: its output is its input (a graph
        output is cast back to float32 instead)."""
        self.rename[out] = source
        self.rw.changed = True
        if out in self.outputs:
            self.rw.add("Cast", (source,), f"{out}_cast", out=out, to=F32)
