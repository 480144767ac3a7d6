"""hidetc as an ONNX backend (`onnx.backend.base.Backend`), so the official backend test
suite and any ONNX tooling can drive it:

    import hidetc.onnx_backend as backend
    rep = backend.prepare(model_proto, "CPU")      # compiles an artifact
    outputs = rep.run([x, y])                       # graph outputs, in graph order

What: `prepare` writes the ModelProto to a private temporary directory, compiles it with
`hidetc.compile_model(..., target="cpu"|"cuda", verify=False, tune=False)` (the caller
has its own expected outputs; verifying against ONNX Runtime would only double the
work) and loads the artifact. `run_model` is prepare + run; `run_node` wraps one
NodeProto in a one-node model (opset `opset_version`, default the newest hidetc imports)
typed from its inputs.

Assumes: the model's graph inputs (initializers excluded) have static shapes, as in the
ONNX node tests; inputs are given positionally in that order (or as a name -> array
mapping, or one array for a one-input model).
Guarantees: every problem hidetc reports (unsupported op, opset, dtype, shape, a
toolchain failure, a bad input) surfaces as `BackendError` (a `HidetcError`, so also a
one-line message) naming the stage, never a process crash caused by the backend itself;
outputs come back as a `namedtupledict` in graph output order (index or name access).
The temporary directory lives as long as the rep and is removed by `close()`, by
leaving a `with` block, on garbage collection, or at interpreter exit.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from hidetc.config import CompileConfig
from hidetc.errors import HidetcError

# Runner-side keywords the official suite passes to `prepare` (tolerances of ITS
# comparison); they are not compile options.
_RUNNER_KWARGS = ("rtol", "atol")
_FIXED = ("target", "verify", "tune")


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


class HidetcRep(BackendRep):
    """A compiled model: `run(inputs)` -> outputs in graph order. Owns its directory."""

    def __init__(self, model, workdir: Path, input_names: Sequence[str],
                 output_names: Sequence[str]):
        self.model = model
        self.workdir = workdir
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self._cleanup = weakref.finalize(self, shutil.rmtree, str(workdir), True)

    @property
    def artifact(self) -> Path:
        return self.workdir / "artifact"

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

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if self._cleanup is None or not self._cleanup.alive:
            raise BackendError("run: this rep was closed")
        feeds = self._feeds(inputs)
        try:
            results = self.model.run(feeds)
        except HidetcError as error:
            raise BackendError(f"run failed: {error}") from error
        values = [results[name] for name in self.output_names]
        return namedtupledict("Outputs", self.output_names)(*values)

    def close(self) -> None:
        """Remove the temporary directory (the loaded library stays mapped)."""
        self._cleanup()

    def __enter__(self) -> HidetcRep:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class HidetcBackend(Backend):
    """ONNX backend compiling with hidetc; "CPU" always, "CUDA" with a usable GPU."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str | bytes, device: str = "CPU",
                **kwargs: Any) -> HidetcRep:
        """Compile `model` (a ModelProto, a path, or serialized bytes) for `device`.
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
            return cls._compile(model, workdir, target, options)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise

    @classmethod
    def _compile(cls, model: onnx.ModelProto, workdir: Path, target: str,
                 options: dict[str, Any]) -> HidetcRep:
        from hidetc.api import compile_model, load
        path = workdir / "model.onnx"
        try:
            onnx.save_model(model, str(path))
        except (ValueError, onnx.checker.ValidationError) as error:
            raise BackendError(f"cannot serialize the model ({error})") from None
        try:
            compile_model(path, workdir / "artifact", target=target, verify=False,
                          tune=False, **options)
            loaded = load(workdir / "artifact")
        except HidetcError as error:
            raise BackendError(f"compile failed: {error}") from error
        initializers = {t.name for t in model.graph.initializer}
        inputs = [i.name for i in model.graph.input if i.name not in initializers]
        outputs = [o.name for o in model.graph.output]
        return HidetcRep(loaded, workdir, inputs, outputs)

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
        from hidetc.runtime.select import gpu_available
        return gpu_available()


prepare = HidetcBackend.prepare
run_model = HidetcBackend.run_model
run_node = HidetcBackend.run_node
supports_device = HidetcBackend.supports_device
