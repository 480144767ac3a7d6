"""Verification: run ONNX Runtime and an artifact on the same input and compare.

The metric per output is the norm-wise relative error ||out - ref|| / ||ref|| (with
||ref|| = 0 falling back to the absolute error ||out||); the max absolute error is
recorded too. Tolerance (documented in the README): f32 1e-4, per output the documented
bound of the narrowest float type on its path where that is looser (`output_tolerances`:
a model computing in float16 is judged at float16's 1e-2). Integer and bool outputs
must match exactly.

Two engines computing in float16 differ by float16's rounding, and an engine may be the
one that strays: an output beyond its tolerance is judged once more against the exact
reference (hidetc's interpreter with every node in float64, rounded to the declared
types: `reference.run_graph(exact=True)`), and passes when it is within its tolerance of
those values and no farther from them than the reference engine is (`settle`); both
errors are recorded. The reference is ONNX Runtime; where it cannot load or run the model
(an op or type it does not implement: BitCast of bool, float8 arithmetic...),
`reference_outputs` falls back to hidetc's numpy reference interpreter of the imported
graph and says so (`run_onnxruntime` alone raises ReferenceUnavailable, one line).

Sample inputs are seeded random: floats ~ N(0, 1); integer inputs that index a Gather
(directly or through shape-preserving ops) are drawn below that table's size, other
integer inputs from {0, 1}; bools at random.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnxruntime as ort

from hidetc.driver.config import TYPE_TOLERANCES
from hidetc.errors import InputError, ReferenceUnavailable
from hidetc.graph.evaluate import TYPE_VALUED_OPS
from hidetc.graph.ir import Graph
from hidetc.graph.reference import run_graph

# numpy's float types, and bfloat16 (ml_dtypes': not a numpy floating subtype): compared
# norm-wise; every other type element by element
BFLOAT16 = np.dtype("bfloat16")


def is_float(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or dtype == BFLOAT16


PASS_THROUGH = ("Cast", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Expand")


def _index_bound(graph: Graph, value: str) -> int | None:
    """The smallest table size `value` indexes through Gathers (None if it indexes none)."""
    consumers = graph.consumers()
    bound, frontier, seen = None, [value], set()
    while frontier:
        v = frontier.pop()
        seen.add(v)
        for node in consumers.get(v, []):
            if node.op == "Gather" and node.inputs[1] == v:
                data = graph.types[node.inputs[0]]
                size = data.shape[node.attr("axis", 0) % data.rank]
                bound = size if bound is None else min(bound, size)
            elif node.op in PASS_THROUGH and node.inputs[0] == v:
                frontier += [o for o in node.outputs if o and o not in seen]
    return bound


def sample_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        t = graph.types[name]
        if t.dtype.startswith("float"):
            out[name] = rng.standard_normal(t.shape).astype(t.dtype)
        elif t.dtype == "bool":
            out[name] = rng.random(t.shape) < 0.5
        else:
            high = _index_bound(graph, name) or 2
            out[name] = rng.integers(0, high, size=t.shape).astype(t.dtype)
    return out


def load_sample(path: str | Path, input_names: list[str]) -> dict[str, np.ndarray]:
    """A .npy (single-input models) or .npz (one array per input name)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise InputError(f"{path}: not a .npy/.npz file ({exc})") from None
    if isinstance(data, np.ndarray):
        if len(input_names) != 1:
            raise InputError(f"{path}: a .npy holds one array but the model has "
                             f"{len(input_names)} inputs ({', '.join(input_names)}); use .npz")
        return {input_names[0]: data}
    with data:
        return {k: data[k] for k in data.files}


def ort_session(model_path: str | Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])


def ort_errors() -> tuple[type[BaseException], ...]:
    """ONNX Runtime's own exception classes (pybind ones, not RuntimeError subclasses)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state
    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError",
             "RuntimeException", "InvalidProtobuf", "ModelLoaded", "NotImplemented",
             "InvalidGraph", "EPFail")
    return tuple(getattr(state, n) for n in names if isinstance(getattr(state, n, None), type))


def ort_reason(exc: BaseException) -> str:
    """ORT's message on one line, without its '[ONNXRuntimeError] : 9 :' prefix."""
    text = " ".join(str(exc).split())
    if text.startswith("[ONNXRuntimeError]"):
        text = text.split(" : ", 2)[-1]
    return text[:300]


def run_onnxruntime(model_path: str | Path, inputs: Mapping[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
    try:
        session = ort_session(model_path)
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, dict(inputs))))
    except ort_errors() as exc:
        reason = ort_reason(exc)
        raise ReferenceUnavailable(f"{model_path}: ONNX Runtime cannot run this model "
                                   f"({reason})", reason) from None


def reference_outputs(model_path: str | Path, graph: Graph,
                      inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], str]:
    """(outputs, what computed them): ONNX Runtime's, or where it cannot run the model,
    hidetc's numpy reference interpreter of `graph` (the model as imported)."""
    try:
        return run_onnxruntime(model_path, inputs), "onnxruntime"
    except ReferenceUnavailable as exc:
        return (run_graph(graph, inputs),
                f"the numpy reference (onnxruntime cannot run this model: {exc.reason})")


def output_tolerances(graph: Graph, base: float) -> dict[str, float]:
    """Per graph output, the looser of `base` and the tolerance of the narrowest float
    type among the values it is computed from (itself, inputs, weights and every value
    between; `TYPE_TOLERANCES`); a Shape or Size reads only its input's type, so no
    rounding flows through it (`TYPE_VALUED_OPS`)."""
    producer = graph.producers()
    result = {}
    for output in graph.outputs:
        tolerance, seen, stack = base, set(), [output]
        while stack:
            value = stack.pop()
            if value in seen:
                continue
            seen.add(value)
            tolerance = max(tolerance, TYPE_TOLERANCES.get(graph.types[value].dtype, 0.0))
            node = producer.get(value)
            if node is not None and node.op not in TYPE_VALUED_OPS:
                stack.extend(i for i in node.inputs if i)
        result[output] = tolerance
    return result


def _bound(rtol: float | Mapping[str, float], name: str) -> float:
    """`rtol` is one bound for every output or one per output name."""
    return rtol if isinstance(rtol, (int, float)) else rtol[name]


def compare(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
            rtol: float | Mapping[str, float]) -> dict:
    """Per-output errors and an overall status (`passed` or `failed`); `rtol` is one
    bound for every output or one per output name (then recorded per output)."""
    report, ok = {}, True
    for name, ref in reference.items():
        got = outputs[name]
        if got.shape != ref.shape:
            report[name] = {"error": f"shape {list(got.shape)} != {list(ref.shape)}"}
            ok = False
            continue
        if not is_float(ref.dtype):
            mismatches = int(np.count_nonzero(got != ref))
            report[name] = {"mismatches": mismatches}
            ok &= mismatches == 0
            continue
        rel, max_abs = float_errors(got.astype(np.float64), ref.astype(np.float64))
        report[name] = {"rel_error": rel, "max_abs_error": max_abs}
        bound = _bound(rtol, name)
        if not isinstance(rtol, (int, float)):
            report[name]["tolerance"] = bound
        ok &= rel <= bound
    return {"status": "passed" if ok else "failed", "outputs": report}


def failing(report: dict, rtol: float | Mapping[str, float]) -> list[str]:
    """The outputs of a `compare` report beyond their bound (or not comparable), less
    those the exact reference passed (`settle`)."""
    return [name for name, e in report["outputs"].items() if "passed_by" not in e and (
        "error" in e or e.get("mismatches") or e.get("rel_error", 0.0) > _bound(rtol, name))]


def settle(report: dict, rtol: float | Mapping[str, float],
           outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
           exact: Callable[[], Mapping[str, np.ndarray]], reference_name: str) -> dict:
    """`report` (of `compare`) with each float output beyond its bound judged against the
    exact reference (`exact()`, computed only when needed): it passes when hidetc is
    within its bound of the exact values and no farther from them than the reference
    engine; both errors are recorded under the output's `exact`. Returns the report
    with its status recomputed."""
    bad = failing(report, rtol)
    floats = [n for n in bad if "rel_error" in report["outputs"][n]]
    if not floats or len(floats) != len(bad):
        return report
    values = exact()
    for name in floats:
        bound = _bound(rtol, name)
        ours = float_errors(np.asarray(outputs[name], np.float64),
                             np.asarray(values[name], np.float64))[0]
        theirs = float_errors(np.asarray(reference[name], np.float64),
                               np.asarray(values[name], np.float64))[0]
        entry = report["outputs"][name]
        entry["exact"] = {"hidetc": ours, reference_name: theirs}
        if ours <= bound and ours <= theirs:
            entry["passed_by"] = (f"exact reference: {reference_name} strays from it "
                                  f"farther than hidetc does")
    return {**report, "status": "failed" if failing(report, rtol) else "passed"}


def exact_outputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs at its own precision without arithmetic rounding (see
    `reference.run_graph(exact=True)`)."""
    return run_graph(graph, inputs, exact=True)


def float_errors(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """Norm-wise relative and max absolute error. Positions where both sides hold the
    same non-finite value (NaN and NaN, or the same infinity) agree and are left out;
    any other non-finite value makes the error infinite."""
    same = (np.isnan(got) & np.isnan(ref)) | (np.isinf(ref) & (got == ref))
    got, ref = got[~same], ref[~same]
    if not (np.all(np.isfinite(got)) and np.all(np.isfinite(ref))):
        return float("inf"), float("inf")
    diff = got - ref
    denom = float(np.linalg.norm(ref))
    err = float(np.linalg.norm(diff))
    return (err / denom if denom > 0 else err), (float(np.max(np.abs(diff))) if diff.size else 0.0)


def time_call(fn: Callable[[], object], repeat: int = 10, warmup: int = 2) -> dict:
    """Median and min wall time in ms of `fn()` after warm-up."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": float(np.median(times)), "min_ms": float(np.min(times)),
            "repeat": repeat}
