"""A tiny ONNX graph-building helper that mimics PyTorch's TorchScript exporter.

Node names follow the exporter's scheme: one path component per *called* module
(``/layer1/layer1.0/conv1/Conv``), a ``_N`` suffix for repeated op types in the
same scope (``Relu_1``) and ``<node>_output_<i>`` value names.  Parameters are
named after the module's qualified name (``layer1.0.conv1.weight``).
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
FLOAT_MIN = float(np.finfo(np.float32).min)  # -3.4028234663852886e38, torch.finfo(float32).min


def unqualified(qualified: str) -> str:
    """The exporter's per-scope name: last non-numeric atom plus trailing numeric atoms."""
    atoms = qualified.split(".")
    for i in range(len(atoms) - 1, -1, -1):
        if not atoms[i].isnumeric():
            return ".".join(atoms[i:])
    return qualified


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class GraphBuilder:
    """Accumulates nodes/initializers; weights are drawn from ``default_rng(seed)``."""

    def __init__(self, name: str, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        # Built in place (make_graph/make_model would copy hundreds of MB of weights).
        self.model = onnx.ModelProto()
        self.graph = self.model.graph
        self.graph.name = name
        self._scopes: list[str] = []
        self._used_names: set[str] = set()
        self._init_names: set[str] = set()

    # ------------------------------------------------------------------ scopes
    @contextlib.contextmanager
    def scope(self, attr: str) -> Iterator[None]:
        """Enter a (called) sub-module ``attr`` of the current module."""
        parent = self.qualname
        self._scopes.append(f"{parent}.{attr}" if parent else attr)
        try:
            yield
        finally:
            self._scopes.pop()

    @property
    def qualname(self) -> str:
        return self._scopes[-1] if self._scopes else ""

    def _node_name(self, op_type: str) -> str:
        base = "".join("/" + unqualified(q) for q in self._scopes) + "/" + op_type
        name, i = base, 0
        while name in self._used_names:
            i += 1
            name = f"{base}_{i}"
        self._used_names.add(name)
        return name

    # ------------------------------------------------------------ graph parts
    def input(self, name: str, elem_type: int, shape: Sequence[int]) -> str:
        self.graph.input.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, name: str, elem_type: int, shape: Sequence[int]) -> str:
        self.graph.output.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def initializer(self, name: str, array: np.ndarray) -> str:
        if name in self._init_names:
            raise ValueError(f"duplicate initializer {name}")
        self._init_names.add(name)
        array = np.asarray(array)
        if array.dtype == np.float32:  # fast path: one copy straight into the graph
            t = self.graph.initializer.add()
            t.name, t.data_type = name, FLOAT
            t.dims.extend(array.shape)
            t.raw_data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        else:
            self.graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    def param(self, local: str, array: np.ndarray) -> str:
        """Initializer named ``<current module>.<local>``."""
        q = self.qualname
        return self.initializer(f"{q}.{local}" if q else local, array)

    def op(self, op_type: str, inputs: Sequence[str], *, n_out: int = 1,
           outputs: Sequence[str] | None = None, **attrs) -> str | list[str]:
        """Append a node; returns its output name (list of names if n_out > 1)."""
        name = self._node_name(op_type)
        if outputs is None:
            outputs = [f"{name}_output_{i}" for i in range(n_out)]
        node = helper.make_node(op_type, list(inputs), list(outputs), name=name, **attrs)
        self.graph.node.append(node)
        return outputs[0] if len(outputs) == 1 else list(outputs)

    def const(self, value, dtype=None) -> str:
        """A ``Constant`` node in the current scope (like the exporter's prim::Constant)."""
        arr = np.asarray(value, dtype=dtype)
        return self.op("Constant", [], value=numpy_helper.from_array(arr))

    def i64(self, *values: int) -> str:
        """1-D int64 Constant, e.g. Unsqueeze axes or Slice starts."""
        return self.const(np.array(values, dtype=np.int64))

    def f32(self, value: float) -> str:
        """Scalar float32 Constant."""
        return self.const(np.float32(value))

    # ------------------------------------------------------------- weights
    def randn(self, shape, std: float = 1.0, mean: float = 0.0) -> np.ndarray:
        a = self.rng.standard_normal(shape, dtype=np.float32)
        if std != 1.0:
            a *= np.float32(std)
        if mean != 0.0:
            a += np.float32(mean)
        return a

    def bn_stats(self, c: int, var: float = 1.0) -> tuple[np.ndarray, ...]:
        """(gamma, beta, running_mean, running_var) for an input of variance ~``var``,
        so that the normalized output has variance ~1."""
        gamma = self.randn(c, 0.1, 1.0)
        beta = self.randn(c, 0.1)
        mean = self.randn(c, 0.1)
        var = (self.rng.uniform(0.75, 1.25, c) * var).astype(np.float32)
        return gamma, beta, mean, var

    # ------------------------------------------------------------- modules
    def conv(self, x: str, w: np.ndarray, b: np.ndarray | None = None, stride=1, pad=0,
             groups: int = 1) -> str:
        """nn.Conv2d in the current scope with given weight [O, I/g, kh, kw]."""
        ph, pw = _pair(pad)
        sh, sw = _pair(stride)
        inputs = [x, self.param("weight", w)]
        if b is not None:
            inputs.append(self.param("bias", b))
        return self.op("Conv", inputs, dilations=[1, 1], group=groups,
                       kernel_shape=list(w.shape[2:]), pads=[ph, pw, ph, pw], strides=[sh, sw])

    def batchnorm(self, x: str, stats: tuple[np.ndarray, ...], eps: float) -> str:
        gamma, beta, mean, var = stats
        inputs = [x, self.param("weight", gamma), self.param("bias", beta),
                  self.param("running_mean", mean), self.param("running_var", var)]
        return self.op("BatchNormalization", inputs, epsilon=eps, momentum=0.9)

    def conv_bn(self, x: str, cin: int, cout: int, k, stride=1, pad=0, groups: int = 1, *,
                names: tuple[str, str] = ("conv", "bn"), eps: float = 1e-5,
                fold: bool = False, in_m2: float = 0.5) -> str:
        """Bias-less Conv + BatchNormalization, or (fold=True) one Conv with folded bias.

        ``in_m2`` is the expected second moment E[x^2] of the input (0.5 after a ReLU
        of a unit-variance tensor); the He-initialized conv then has output variance
        ~2*in_m2, which the BN running_var matches so the BN output has variance ~1.
        Both styles draw the same random numbers, so they compute the same function.
        """
        kh, kw = _pair(k)
        fan_in = (cin // groups) * kh * kw
        w = self.randn((cout, cin // groups, kh, kw), math.sqrt(2.0 / fan_in))
        stats = self.bn_stats(cout, 2.0 * in_m2)
        if fold:
            gamma, beta, mean, var = stats
            s = gamma / np.sqrt(var + np.float32(eps))
            w, bias = w * s[:, None, None, None], beta - mean * s
            with self.scope(names[0]):
                return self.conv(x, w, bias, stride, pad, groups)
        with self.scope(names[0]):
            y = self.conv(x, w, None, stride, pad, groups)
        with self.scope(names[1]):
            return self.batchnorm(y, stats, eps)

    def gemm(self, x: str, cin: int, cout: int, outputs: Sequence[str] | None = None) -> str:
        """nn.Linear on a 2-D input as exported: Gemm(transB=1)."""
        w = self.randn((cout, cin), 1.0 / math.sqrt(cin))
        b = self.randn(cout, 0.02)
        return self.op("Gemm", [x, self.param("weight", w), self.param("bias", b)],
                       outputs=outputs, alpha=1.0, beta=1.0, transB=1)

    def linear(self, x: str, cin: int, cout: int, *, std: float | None = None,
               bias_first: bool = True) -> str:
        """nn.Linear / Conv1D on an N-D input as exported: MatMul(x, W[in,out]) + Add bias."""
        w = self.randn((cin, cout), std if std is not None else 1.0 / math.sqrt(cin))
        b = self.randn(cout, 0.02)
        y = self.op("MatMul", [x, self.param("weight", w)])
        bias = self.param("bias", b)
        return self.op("Add", [bias, y] if bias_first else [y, bias])

    def layer_norm(self, x: str, dim: int, eps: float, outputs: Sequence[str] | None = None) -> str:
        gamma = self.randn(dim, 0.05, 1.0)
        beta = self.randn(dim, 0.02)
        inputs = [x, self.param("weight", gamma), self.param("bias", beta)]
        return self.op("LayerNormalization", inputs, outputs=outputs, axis=-1, epsilon=eps)

    def view(self, x: str, spec: Sequence[int | str]) -> str:
        """``x.view(spec)`` where ``"dN"`` entries mean ``x.size(N)``.

        Emitted like the exporter: Shape->Gather->Unsqueeze per traced size,
        a Constant per literal, Concat, Reshape.
        """
        dims = []
        for item in spec:
            if isinstance(item, str):
                shape = self.op("Shape", [x])
                d = self.op("Gather", [shape, self.const(np.int64(int(item[1:])))], axis=0)
                dims.append(self.op("Unsqueeze", [d, self.i64(0)]))
            else:
                dims.append(self.i64(int(item)))
        new_shape = self.op("Concat", dims, axis=0)
        return self.op("Reshape", [x, new_shape], allowzero=0)

    # --------------------------------------------------------------- model
    def make_model(self, metadata: dict[str, str] | None = None, doc: str = "") -> onnx.ModelProto:
        """Finish and return the model (the builder must not be used afterwards)."""
        model = self.model
        model.ir_version = IR_VERSION
        model.opset_import.append(helper.make_opsetid("", OPSET))
        model.producer_name, model.producer_version = "hidetc.models", "0.1"
        model.doc_string = doc
        if metadata:
            helper.set_model_props(model, {k: str(v) for k, v in metadata.items()})
        return model
