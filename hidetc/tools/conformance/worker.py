"""Run node test cases in this process: one case (`run_case`), or as the isolated worker
the pool starts (`python -m hidetc.tools.conformance.worker`).

What: prepare the case's model with a backend, run every data set, compare with the
expected outputs through the official runner's own `Runner.assert_similar_outputs`
(same shape, dtype and `assert_allclose(rtol, atol)` checks; sequences element-wise);
outputs it refuses pass when they are within its tolerances of the exact reference and
closer to it than the expected values are (`closer_to_exact`: verification's rule).
Worker protocol: one JSON request per stdin line ({"path", "backend", "device"}); the
worker answers with JSON lines on its protocol channel: `{"phase": ...}` before each
stage (so a crash is located) and finally `{"result": {...}}`. The protocol channel is
the original stdout; fd 1 itself is pointed at stderr, so whatever a kernel, gcc or a
library prints cannot corrupt it. `faulthandler` writes the Python stack of a fatal
signal to stderr, which the pool keeps in its log.
Guarantees: a result is {"status": "pass"|"fail"|"error", "stage", "reason",
"internal", "seconds"}: "fail" = the outputs differ (values, shape, dtype, count);
"error" = prepare or run raised; `internal` marks exceptions that are not a
`HidetcError` (compiler bugs or a backend's own exception types), so "clean error"
is checkable; a pass the exact reference decided carries a "note" naming the outputs.
Crashes and hangs are the pool's to record: this process just dies.
"""
from __future__ import annotations

import faulthandler
import importlib
import json
import os
import sys
import time
from typing import Any, Callable

import numpy as np
import onnx
from onnx.backend.test.runner import Runner

from hidetc.driver.verify import float_errors
from hidetc.errors import HidetcError
from hidetc.tools.conformance.cases import Case, load_data

BACKENDS = {"hidetc": "hidetc.tools.onnx_backend:HidetcBackend",
            "onnxruntime": "onnxruntime.backend.backend:OnnxRuntimeBackend"}
MAX_REASON = 400


def load_backend(spec: str) -> Any:
    """"hidetc", "onnxruntime" (the reference, to check the harness) or "module:attr"."""
    module, _, attr = BACKENDS.get(spec, spec).partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attr) if attr else loaded


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = " | ".join(lines)
    return line if len(line) <= MAX_REASON else line[:MAX_REASON - 3] + "..."


def _mismatch(error: AssertionError) -> str:
    """A one-line summary of numpy's assertion message (shape, dtype or values)."""
    text = str(error)
    keep = [ln.strip() for ln in text.splitlines()
            if ln.strip().startswith(("Output", "Mismatched", "Max absolute", "Max relative",
                                      "(shapes", "ACTUAL", "DESIRED", "x and y nan",
                                      "Arrays are not equal", "Items are not equal",
                                      "Unexpected type", "Not equal to tolerance"))]
    return _one_line(" ".join(keep) if keep else text)


def _is_clean(error: BaseException) -> bool:
    return isinstance(error, HidetcError)


def _error(stage: str, error: BaseException) -> dict:
    text = str(error).splitlines()[0] if str(error).strip() else ""
    reason = f"{type(error).__name__}: {text}" if not _is_clean(error) or not text else text
    return {"status": "error", "stage": stage, "reason": _one_line(reason),
            "internal": not _is_clean(error)}


def run_case(case: Case, backend: Any, device: str = "CPU",
             phase: Callable[[str], None] = lambda _: None) -> dict:
    """Prepare, run and compare one case; never raises for the case's own problems."""
    start = time.perf_counter()
    result = _run(case, backend, device, phase)
    result["seconds"] = round(time.perf_counter() - start, 3)
    return result


def _run(case: Case, backend: Any, device: str, phase: Callable[[str], None]) -> dict:
    phase("load")
    data_sets = load_data(case)
    model = onnx.load(os.path.join(case.path, "model.onnx"))
    phase("compile")
    try:
        rep = backend.prepare(model, device)
    except Exception as error:  # noqa: BLE001 - every failure is a recorded result
        return _error("compile", error)
    notes: list[str] = []
    try:
        for k, (inputs, expected) in enumerate(data_sets):
            phase(f"run data set {k}")
            try:
                outputs = list(rep.run(inputs))
            except Exception as error:  # noqa: BLE001
                return _error(f"run {k}", error)
            phase(f"compare data set {k}")
            try:
                Runner.assert_similar_outputs(expected, outputs, rtol=case.rtol,
                                              atol=case.atol, model_dir=case.name)
            except (AssertionError, TypeError, ValueError) as error:
                settled = closer_to_exact(case, rep, inputs, expected, outputs)
                if not settled:
                    return {"status": "fail", "stage": f"compare {k}",
                            "reason": _mismatch(error), "internal": False}
                notes += [f"data set {k} output {i}: passed by the exact reference "
                          f"(the expected values stray farther)" for i in settled]
    finally:
        close = getattr(rep, "close", None)
        if callable(close):
            close()
    return {"status": "pass", "stage": "done", "reason": "", "internal": False,
            **({"note": "; ".join(notes)} if notes else {})}


def _similar(case: Case, want: Any, got: Any) -> bool:
    """Whether the runner's own check takes this one output."""
    try:
        Runner.assert_similar_outputs([want], [got], rtol=case.rtol, atol=case.atol,
                                      model_dir=case.name)
    except (AssertionError, TypeError, ValueError):
        return False
    return True


def closer_to_exact(case: Case, rep: Any, inputs: list, expected: list,
                    outputs: list) -> list[int]:
    """The rule verification uses (`hidetc.driver.verify.settle`), for the outputs the
    runner's tolerances refuse: each such output a float tensor within the case's
    rtol/atol of the exact reference (the backend's `exact_outputs`: hidetc's
    interpreter of the model in float64, rounded to its declared types) and no farther
    from it, norm-wise, than the expected output is (the suite's expected values carry
    numpy's own rounding). Returns the indices of the outputs so passed; empty (the
    failure stands) when any refused output is not passed this way, for a backend
    without an exact reference, or a model the reference cannot take."""
    exact_of = getattr(rep, "exact_outputs", None)
    if exact_of is None or len(outputs) != len(expected):
        return []
    refused = [i for i, (want, got) in enumerate(zip(expected, outputs))
               if not _similar(case, want, got)]
    try:
        exact = exact_of(inputs)
    except Exception:  # noqa: BLE001  (no exact reference: the failure stands)
        return []
    for i in refused:
        want, got, ref = (np.asarray(a) for a in (expected[i], outputs[i], exact[i]))
        if not (np.issubdtype(ref.dtype, np.floating) and got.shape == ref.shape ==
                want.shape and got.dtype == want.dtype):
            return []
        with np.errstate(all="ignore"):
            if not np.allclose(got, ref, rtol=case.rtol, atol=case.atol, equal_nan=True):
                return []
        wide = [a.astype(np.float64) for a in (got, want, ref)]
        if float_errors(wide[0], wide[2])[0] > float_errors(wide[1], wide[2])[0]:
            return []
    return refused


def main() -> int:
    """The worker loop (see the module docstring)."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    faulthandler.enable(file=sys.stderr, all_threads=True)
    backends: dict[str, Any] = {}

    def send(message: dict) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        case = Case(**{**request["case"], "ops": tuple(request["case"]["ops"]),
                       "domains": tuple(request["case"]["domains"])})
        print(f"--- {case.name}", file=sys.stderr, flush=True)
        spec = request.get("backend", "hidetc")
        try:
            if spec not in backends:
                backends[spec] = load_backend(spec)
        except Exception as error:  # noqa: BLE001 - reported as the case's result
            send({"result": {**_error("backend", error), "seconds": 0.0}})
            continue
        result = run_case(case, backends[spec], request.get("device", "CPU"),
                          lambda stage: send({"phase": stage}))
        send({"result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
