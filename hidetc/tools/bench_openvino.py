"""OpenVINO peers for `hidetc bench --vs openvino`: the subject's own ONNX file read by
OpenVINO (`Core().read_model`) and compiled for its CPU plugin twice -- at the plugin's
defaults ("openvino": on a CPU with bf16 support, AVX512_BF16 or AMX, OpenVINO then
computes in bf16 by its INFERENCE_PRECISION_HINT default) and with
INFERENCE_PRECISION_HINT f32 ("openvino_f32"). Each peer records the inference
precision the compiled model reports it uses (`precision`: "bf16", "f32", ...).

The bench times them as it times ONNX Runtime (`hidetc.tools.bench.alternate`: the same
inputs, warm-up, rounds, median) and measures their outputs against ONNX Runtime's.
Assumes: the model file is the one hidetc compiled (same weights, same inputs by name);
the cpu target (OpenVINO's CPU plugin beside a GPU artifact says nothing, so the cuda
target gets a note instead). openvino is an optional extra (`pip install
'hidetc[openvino]'`): without it `require` raises a one-line InputError. A model
OpenVINO cannot read, compile or run gives a one-line note (`reason`), never a
traceback, and hidetc and ONNX Runtime are timed without it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

import numpy as np

from hidetc.errors import InputError

INSTALL = "pip install 'hidetc[openvino]', or pip install 'openvino>=2024.0,<2027'"

# peer name -> compile_model config (the CPU plugin's defaults, then f32 forced)
CONFIGS: dict[str, dict[str, str]] = {
    "openvino": {},
    "openvino_f32": {"INFERENCE_PRECISION_HINT": "f32"},
}


def require():
    """The openvino module; a one-line InputError saying how to install it when missing
    (or broken: an ImportError from inside its import says the same)."""
    try:
        import openvino
    except ImportError:
        raise InputError(f"--vs openvino needs OpenVINO ({INSTALL})") from None
    return openvino


def reason(exc: BaseException, limit: int = 200) -> str:
    """OpenVINO's error on one line: its last non-empty line (its messages lead with the
    C++ source locations of the check that failed), at most `limit` characters."""
    lines = [line.strip().lstrip("-").strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line]
    text = lines[-1] if lines else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Peer:
    """One compiled model and its infer request. `run(inputs)` feeds `inputs` (name ->
    array, the model's input names) and returns {ONNX output name: array} (copies: the
    request's buffers are reused by the next call)."""

    def __init__(self, compiled, output_names: set[str]):
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.precision = _type_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
        self.outputs = []           # (port, the ONNX graph output name it carries)
        for port in compiled.outputs:
            names = sorted(set(port.get_names()) & output_names)
            self.outputs.append((port, names[0] if names else port.get_any_name()))

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self.request.infer(dict(inputs))
        return {name: np.asarray(result[port]) for port, name in self.outputs}


def _type_name(value) -> str:
    """An element type as OpenVINO names it ("bf16", "f32"), whatever the binding gives."""
    if hasattr(value, "get_type_name"):
        return str(value.get_type_name())
    return str(value)


def openvino_peers(onnx_path: Optional[Path], target: str, output_names: Sequence[str] = ()
                   ) -> tuple[dict[str, Peer], Optional[str]]:
    """({peer name: Peer} in `CONFIGS` order, None), or ({}, why) where they cannot run:
    no model file, a target other than cpu, or OpenVINO failing to read or compile the
    model (its reason, one line). `output_names`: the ONNX graph's outputs, the names
    `Peer.run` gives its outputs (else the name OpenVINO picks of each output tensor's).
    Raises InputError only when openvino is not installed."""
    ov = require()
    if onnx_path is None:
        return {}, "no model file beside the artifact"
    if target != "cpu":
        return {}, f"OpenVINO's CPU plugin is timed beside the cpu target only, not {target}"
    core = ov.Core()
    try:
        model = core.read_model(str(onnx_path))
        return {peer: Peer(core.compile_model(model, "CPU", config), set(output_names))
                for peer, config in CONFIGS.items()}, None
    except RuntimeError as exc:
        return {}, f"openvino cannot compile this model: {reason(exc)}"
