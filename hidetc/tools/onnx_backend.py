"""hidetc as an ONNX backend (`onnx.backend.base.Backend`), so the official backend test
suite and any ONNX tooling can drive it:

    import hidetc.tools.onnx_backend as backend
    rep = backend.prepare(model_proto, "CPU")      # compiles an artifact
    outputs = rep.run([x, y])                       # graph outputs, in graph order

What: `prepare` writes the ModelProto to a private temporary directory, compiles it with
`hidetc.compile_model(..., target="cpu"|"cuda", verify=False, tune=False)` (the caller
has its own expected outputs; verifying against ONNX Runtime would only double the
work) and loads the artifact. `run_model` is prepare + run; `run_node` wraps one
NodeProto in a one-node model (opset `opset_version`, default the newest hidetc imports)
typed from its inputs.

Run-time specialization: hidetc compiles static programs, so two kinds of graph input
cannot be compiled before their run-time values are seen:
- *compile-time inputs*: graph inputs whose VALUE an op needs at compile time, i.e. that
  feed a `value_inputs` slot of the op registry (Reshape's shape, Reduce* axes, Slice
  starts/ends, Pad pads, Range, Expand shape, Tile repeats...) directly or through the
  nodes computing that slot (traced back through every node except Shape/Size, whose
  outputs depend on their input's type only; the importer folds such chains);
- *dynamic inputs*: graph inputs whose shape the file leaves open (no shape, or a
  symbolic/unknown dim) and that the `shapes` option does not bind.
A model with either kind is not compiled by `prepare`; each `run` computes a key (a
sha256 over the compile-time inputs' dtype, shape and bytes and the dynamic inputs'
shapes) and compiles, on a miss, a *variant*: the ModelProto with the compile-time
inputs moved from graph.input to initializers holding this run's values, and the
dynamic inputs' shapes passed as the `shapes` compile option. Later runs with the same
key reuse the variant; the `MAX_VARIANTS` most recently used variants are kept per
rep (older ones are dropped with their directory). `rep.compiles` counts the compiles;
`rep.compile_time_inputs` and `rep.dynamic_inputs` name the inputs of each kind. Every
other input stays a run-time input of the compiled artifact. A model with neither kind
compiles once, in `prepare`, as before.

Assumes: inputs are given positionally in the order of the graph inputs that are not
initializers (or as a name -> array mapping, or one array for a one-input model); one
thread uses a rep at a time.
Guarantees: every problem hidetc reports (unsupported op, opset, dtype, shape, a
toolchain failure, a bad input) surfaces as `BackendError` (a `HidetcError`, so also a
one-line message) naming the stage, never a process crash caused by the backend itself;
for a specialized model, `prepare` reports unsupported ops (a trial import without the
values) and other compile errors ("compile failed: ...") surface at the first `run`
with the offending values. Outputs come back as a `namedtupledict` in graph output
order (index or name access). The temporary directory lives as long as the rep and is
removed by `close()`, by leaving a `with` block, on garbage collection, or at
interpreter exit.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnx.inliner
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from hidetc.driver.config import CompileConfig
from hidetc.driver.verify import exact_outputs
from hidetc.errors import HidetcError
from hidetc.frontend.onnx.importer import load_model

# Runner-side keywords the official suite passes to `prepare` (tolerances of ITS
# comparison); they are not compile options.
_RUNNER_KWARGS = ("rtol", "atol")
_FIXED = ("target", "verify", "tune")
MAX_VARIANTS = 8          # compiled specializations kept per rep (least recently used go)


class BackendError(HidetcError):
    """A model hidetc cannot compile or run; the message is one line and says which."""


def _target(device: str) -> str:
    try:
        kind = Device(device).type
    except (AttributeError, ValueError):
        raise BackendError(f"unknown device {device!r} (hidetc supports CPU and CUDA)") from None
    return "cuda" if kind == DeviceType.CUDA else "cpu"


def _compile_options(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The CompileConfig overrides among `kwargs` (runner tolerances dropped); others are
    refused so a typo is not silently ignored."""
    known = {f.name for f in dataclasses.fields(CompileConfig)} - set(_FIXED)
    options = {k: v for k, v in kwargs.items() if k not in _RUNNER_KWARGS}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"hidetc backend: unknown option(s) {', '.join(unknown)} "
                        f"(compile options: {', '.join(sorted(known))})")
    return options


def _runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are not initializers, in graph order."""
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def compile_time_inputs(model: onnx.ModelProto) -> tuple[str, ...]:
    """The run-time graph inputs whose values hidetc needs at compile time: those feeding
    a registry `value_inputs` slot, directly or through the nodes that compute it (every
    input of such a node is needed, except for Shape/Size), in graph input order. Ops the
    importer reads as decompositions name their slots in their module's VALUE_INPUTS.
    Nodes inside If/Loop/Scan subgraphs count, and a needed value computed by such a node
    needs what its subgraphs read from the enclosing scopes."""
    from hidetc.frontend.onnx.handlers import DECOMPOSERS
    from hidetc.graph.ops import REGISTRY
    decomposed = {op: slots for module in DECOMPOSERS
                  for op, slots in getattr(module, "VALUE_INPUTS", {}).items()}
    proto = model
    if model.functions:
        try:
            proto = onnx.inliner.inline_local_functions(model)
        except Exception:  # noqa: BLE001 - the import reports a broken model properly
            proto = model
    from hidetc.frontend.onnx.control_flow import needed_values, subgraph_nodes
    from hidetc.frontend.onnx.functions import value_slots
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    nodes = list(subgraph_nodes(proto.graph))     # subgraphs' nodes too (If/Loop/Scan)
    seeds: list[str] = []
    for node in nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        opdef = REGISTRY.get(node.op_type)
        slots = tuple(opdef.value_inputs if opdef else ()) + decomposed.get(node.op_type, ())
        if opdef is None and node.op_type not in decomposed:   # read through its function
            slots += value_slots(node.op_type, opset)
        seeds += [node.input[k] for k in slots if k < len(node.input) and node.input[k]]
    needed = needed_values(nodes, seeds)
    return tuple(i.name for i in _runtime_inputs(model) if i.name in needed)


def _declared_dims(info: onnx.ValueInfoProto) -> list[int | None] | None:
    """The declared dims (None where symbolic/unknown), None without a shape or type."""
    if info.type.WhichOneof("value") != "tensor_type" or \
            not info.type.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.WhichOneof("value") == "dim_value" else None
            for d in info.type.tensor_type.shape.dim]


def dynamic_inputs(model: onnx.ModelProto) -> tuple[str, ...]:
    """The run-time tensor inputs whose shape the file leaves open (no shape, or a
    symbolic or unknown dim)."""
    found = []
    for info in _runtime_inputs(model):
        dims = _declared_dims(info)
        if info.type.WhichOneof("value") == "tensor_type" and (dims is None or None in dims):
            found.append(info.name)
    return tuple(found)


@dataclasses.dataclass
class _Variant:
    model: Any          # the loaded artifact (hidetc.driver.api.Model)
    directory: Path     # model.onnx and artifact/
    graph: Any = None   # model.onnx imported, once an exact reference asked for it

    def imported(self) -> Any:
        """The variant's model as hidetc imports it (the exact reference's input)."""
        if self.graph is None:
            self.graph = load_model(self.directory / "model.onnx",
                                    {s["name"]: s["shape"] for s in self.model.inputs})
        return self.graph


class HidetcRep(BackendRep):
    """A model compiled once, or once per run-time specialization (see the module
    docstring): `run(inputs)` -> outputs in graph order. Owns its directory."""

    def __init__(self, proto: onnx.ModelProto, workdir: Path, target: str,
                 options: dict[str, Any]):
        self.proto = proto
        self.workdir = workdir
        self.target = target
        self.options = dict(options)
        self.input_names = tuple(i.name for i in _runtime_inputs(proto))
        self.output_names = tuple(o.name for o in proto.graph.output)
        self.compile_time_inputs = compile_time_inputs(proto)
        given = set(self.options.get("shapes") or ())
        self.dynamic_inputs = tuple(n for n in dynamic_inputs(proto)
                                    if n not in given and n not in self.compile_time_inputs)
        self.compiles = 0
        self._variants: OrderedDict[str, _Variant] = OrderedDict()
        self._latest: _Variant | None = None
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(workdir), True)

    @property
    def specialized(self) -> bool:
        """True when compiling waits for the run-time values or shapes."""
        return bool(self.compile_time_inputs or self.dynamic_inputs)

    @property
    def model(self) -> Any:
        """The loaded artifact of the latest run (of `prepare` when not specialized)."""
        return self._latest.model if self._latest else None

    @property
    def artifact(self) -> Path | None:
        return self._latest.directory / "artifact" if self._latest else None

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        names = self.input_names
        if isinstance(inputs, Mapping):
            return {k: np.asarray(v) for k, v in inputs.items()}
        if isinstance(inputs, np.ndarray) or np.isscalar(inputs):
            inputs = [inputs]
        inputs = list(inputs)
        if len(inputs) != len(names):
            raise BackendError(f"run: expected {len(names)} input(s) ({', '.join(names)}), "
                               f"got {len(inputs)}")
        feeds = {}
        for name, value in zip(names, inputs):
            if isinstance(value, onnx.TensorProto):
                value = numpy_helper.to_array(value)
            if not isinstance(value, (np.ndarray, np.generic, int, float, bool)):
                raise BackendError(f"run: input {name!r} is a {type(value).__name__}; hidetc "
                                   f"takes tensors only (no sequences, maps or optionals)")
            feeds[name] = np.asarray(value)
        return feeds

    def _key(self, feeds: Mapping[str, np.ndarray]) -> str:
        digest = hashlib.sha256()
        for name in self.compile_time_inputs:
            array = np.ascontiguousarray(feeds[name])
            digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(array.tobytes())
        for name in self.dynamic_inputs:
            digest.update(f"{name}|{feeds[name].shape}|".encode())
        return digest.hexdigest()

    def _bound_model(self, feeds: Mapping[str, np.ndarray]) -> onnx.ModelProto:
        """The ModelProto with the compile-time inputs turned into initializers."""
        if not self.compile_time_inputs:
            return self.proto
        model = onnx.ModelProto()
        model.CopyFrom(self.proto)
        declared = {i.name: i for i in model.graph.input}
        for name in self.compile_time_inputs:
            _check_bound(declared[name], feeds[name])
            try:
                tensor = numpy_helper.from_array(feeds[name], name)
            except (TypeError, ValueError) as error:
                raise BackendError(f"run: input {name!r} cannot be bound as a constant "
                                   f"({error})") from None
            model.graph.initializer.append(tensor)
        keep = [i for i in model.graph.input if i.name not in self.compile_time_inputs]
        del model.graph.input[:]
        model.graph.input.extend(keep)
        return model

    def _variant(self, feeds: Mapping[str, np.ndarray]) -> _Variant:
        """The compiled variant for these feeds: cached, or compiled now."""
        key = self._key(feeds)
        if key in self._variants:
            self._variants.move_to_end(key)
            return self._variants[key]
        directory = self.workdir / f"v{self.compiles}"
        shapes = {k: v for k, v in (self.options.get("shapes") or {}).items()
                  if k not in self.compile_time_inputs}
        shapes.update({n: [int(d) for d in feeds[n].shape] for n in self.dynamic_inputs})
        options = {**self.options, "shapes": shapes or None}
        directory.mkdir()
        try:
            loaded = _compile(self._bound_model(feeds), directory, self.target, options)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self.compiles += 1
        variant = self._variants[key] = _Variant(loaded, directory)
        while len(self._variants) > MAX_VARIANTS:
            _, dropped = self._variants.popitem(last=False)
            shutil.rmtree(dropped.directory, ignore_errors=True)
        return variant

    def _check_open(self, what: str) -> None:
        if self._cleanup is None or not self._cleanup.alive:
            raise BackendError(f"{what}: this rep was closed")

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        self._check_open("run")
        feeds = self._feeds(inputs)
        missing = [n for n in self.compile_time_inputs + self.dynamic_inputs if n not in feeds]
        if missing:
            raise BackendError(f"run: input {missing[0]!r} is missing (inputs: "
                               f"{', '.join(self.input_names)})")
        self._latest = self._variant(feeds)
        runtime = {k: v for k, v in feeds.items() if k not in self.compile_time_inputs}
        try:
            results = self._latest.model.run(runtime)
        except HidetcError as error:
            raise BackendError(f"run failed: {error}") from error
        values = [results[name] for name in self.output_names]
        return namedtupledict("Outputs", self.output_names)(*values)

    def exact_outputs(self, inputs: Any) -> tuple[np.ndarray, ...]:
        """The exact reference of these inputs (`hidetc.driver.verify.exact_outputs`: the
        model at its own precision, every node in float64) for the variant the inputs
        select, in graph-output order: what a runner judges outputs against when its
        expected values and hidetc's disagree (the conformance runner does)."""
        self._check_open("exact_outputs")
        feeds = self._feeds(inputs)
        variant = self._variant(feeds)
        runtime = {k: v for k, v in feeds.items() if k not in self.compile_time_inputs}
        try:
            exact = exact_outputs(variant.imported(), runtime)
        except HidetcError as error:
            raise BackendError(f"exact reference failed: {error}") from error
        return tuple(exact[name] for name in self.output_names)

    def close(self) -> None:
        """Remove the temporary directory (the loaded libraries stay mapped)."""
        self._cleanup()

    def __enter__(self) -> HidetcRep:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _check_bound(info: onnx.ValueInfoProto, array: np.ndarray) -> None:
    """BackendError when a compile-time input's value contradicts its declared type."""
    name, elem = info.name, info.type.tensor_type.elem_type
    if info.type.WhichOneof("value") == "tensor_type" and elem:
        try:
            expected = np.dtype(helper.tensor_dtype_to_np_dtype(elem))
        except (KeyError, ValueError, TypeError):
            expected = None
        if expected is not None and array.dtype != expected:
            raise BackendError(f"run: input {name!r} has dtype {array.dtype}, the model "
                               f"declares {expected}")
    dims = _declared_dims(info)
    if dims is not None and (len(dims) != array.ndim or any(
            d is not None and d != n for d, n in zip(dims, array.shape))):
        shown = ["?" if d is None else d for d in dims]
        raise BackendError(f"run: input {name!r} has shape {list(array.shape)}, the model "
                           f"declares {shown}")


def _compile(model: onnx.ModelProto, directory: Path, target: str,
             options: dict[str, Any]) -> Any:
    """Save `model` under `directory`, compile it to directory/artifact and load it."""
    from hidetc.driver.api import compile_model, load
    path = directory / "model.onnx"
    try:
        onnx.save_model(model, str(path))
    except (ValueError, onnx.checker.ValidationError) as error:
        raise BackendError(f"cannot serialize the model ({error})") from None
    try:
        compile_model(path, directory / "artifact", target=target, verify=False,
                      tune=False, **options)
        return load(directory / "artifact")
    except HidetcError as error:
        # paths inside the (temporary) directory are shown relative to it: stable text
        message = str(error).replace(f"{directory}{os.sep}", "")
        raise BackendError(f"compile failed: {message}") from error


def _precheck(model: onnx.ModelProto) -> None:
    """For a model compiled at its first run: report in `prepare` what no run-time value
    can fix (unsupported ops), by a trial import without the values."""
    from hidetc.errors import UnsupportedOpError
    from hidetc.frontend.onnx.importer import import_model
    try:
        import_model(model, source="model.onnx")
    except UnsupportedOpError as error:
        raise BackendError(f"compile failed: {error}") from error
    except HidetcError:
        pass            # the values or shapes bound at run time may resolve it


class HidetcBackend(Backend):
    """ONNX backend compiling with hidetc; "CPU" always, "CUDA" with a usable GPU."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str | bytes, device: str = "CPU",
                **kwargs: Any) -> HidetcRep:
        """Compile `model` (a ModelProto, a path, or serialized bytes) for `device`, or
        defer compiling to the first run when it needs run-time values or shapes.
        kwargs: CompileConfig options (e.g. fuse=False); `rtol`/`atol` are ignored."""
        target = _target(device)
        if not cls.supports_device(device):
            raise BackendError(f"device {device!r} is not usable here (no CUDA GPU with "
                               f"pycuda)")
        options = _compile_options(kwargs)
        if isinstance(model, (str, Path)):
            model = onnx.load(str(model))
        elif isinstance(model, bytes):
            model = onnx.load_from_string(model)
        workdir = Path(tempfile.mkdtemp(prefix="hidetc-onnx-"))
        try:
            rep = HidetcRep(model, workdir, target, options)
            if rep.specialized:
                _precheck(model)
            else:
                rep._latest = rep._variant({})
            return rep
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        with cls.prepare(model, device, **kwargs) as rep:
            return rep.run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node: a one-node model typed from `inputs` (positional, one per
        non-empty node input, or a name -> array mapping)."""
        from hidetc.frontend.onnx.importer import OPSET_RANGE
        opset = int(kwargs.pop("opset_version", OPSET_RANGE[1]))
        names = [n for n in node.input if n]
        if isinstance(inputs, Mapping):
            arrays = [np.asarray(inputs[n]) for n in names]
        else:
            arrays = [np.asarray(a) for a in inputs]
        if len(arrays) != len(names):
            raise BackendError(f"run_node: {node.op_type} has {len(names)} input(s), got "
                               f"{len(arrays)}")
        graph_inputs = [helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in zip(names, arrays)]
        graph_outputs = []
        for k, name in enumerate(o for o in node.output if o):
            if outputs_info and k < len(outputs_info):
                dtype, shape = outputs_info[k]
                graph_outputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
            else:
                graph_outputs.append(helper.make_empty_tensor_value_info(name))
        graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return cls.run_model(model, arrays, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            target = _target(device)
        except BackendError:
            return False
        if target == "cpu":
            return True
        from hidetc.backends.runtime.select import gpu_available
        return gpu_available()


prepare = HidetcBackend.prepare
run_model = HidetcBackend.run_model
run_node = HidetcBackend.run_node
supports_device = HidetcBackend.supports_device
