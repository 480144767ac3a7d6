"""The compile's verification stage: the yardstick a compile verifies against, the check
of a staged artifact, and the recovery when it misses.

`Yardstick` is computed once per compile (a recovery verifies several builds against
it): the sample inputs, the reference's outputs on them (ONNX Runtime, or hidetc's
numpy interpreter where ORT cannot run the model), each output's bound
(`verify.output_tolerances`: the model's own precision) and the exact reference,
computed the first time an output misses its bound (`verify.settle`).
`verify_artifact(path, manifest, yardstick, cfg)` runs the staged artifact and returns
the manifest's verification record, or raises a one-line VerificationError.
`recover_artifact` is what a compile does then (`hidetc.driver.recover`): the diverging
kernels rebuilt with exact-order configs on the same selection, and failing that the
model once more with its own NCHW layout.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from hidetc.backends.runtime.artifact import ArtifactWriter
from hidetc.backends.runtime.select import make_executor
from hidetc.driver.config import CompileConfig
from hidetc.driver.launch import ExecutionPlan
from hidetc.driver.recover import recover, worst_kernel
from hidetc.driver.recover_bf16 import bf16_errors, recover_bf16
from hidetc.driver.verify import (
    compare,
    exact_outputs,
    failing,
    load_sample,
    output_tolerances,
    reference_outputs,
    sample_inputs,
    settle,
)
from hidetc.driver.verify_quantized import (
    kernel_verdict,
    quantized_outputs,
    settle_quantized,
)
from hidetc.errors import VerificationError
from hidetc.graph.reference import run_graph

# verifier(artifact path, manifest, yardstick, cfg) -> the verification record
Verifier = Callable[[Path, dict, "Yardstick", CompileConfig], dict]


class Yardstick:
    """What a compile verifies against (see the module docstring)."""

    def __init__(self, model_path, graph, cfg: CompileConfig, optimized=None):
        names = list(graph.inputs)
        self.inputs = (load_sample(cfg.sample, names) if cfg.sample
                       else sample_inputs(graph, cfg.seed))
        self.reference, self.name = reference_outputs(model_path, graph, self.inputs)
        self.tolerances = ({o: cfg.tolerance for o in graph.outputs} if cfg.rtol is not None
                           else output_tolerances(graph, cfg.tolerance))
        self._graph = graph
        self._exact: Optional[dict] = None
        # a quantized model's outputs and the graph its kernels were planned from (the
        # per-kernel check of `verify_quantized`; None: a dynamic artifact's variants)
        self.quantized = quantized_outputs(graph)
        self.optimized = optimized

    def exact(self) -> dict:
        if self._exact is None:
            self._exact = exact_outputs(self._graph, self.inputs)
        return self._exact

    @property
    def engine(self) -> str:
        """The reference's short name ("onnxruntime", or "the numpy reference")."""
        return "onnxruntime" if self.name == "onnxruntime" else "the numpy reference"

    @property
    def display(self) -> str:
        """The reference as a message names it."""
        return "ONNX Runtime" if self.name == "onnxruntime" else "the numpy reference"


def verify_artifact(path: Path, manifest: dict, yardstick: Yardstick,
                    cfg: CompileConfig) -> dict:
    """Run the staged artifact at `path` on the yardstick's inputs: its verification
    record, or a one-line VerificationError naming the output that misses most."""
    executor = make_executor(path, manifest, warn_cores=False)
    outputs = executor.run(yardstick.inputs)
    tolerances = yardstick.tolerances
    report = compare(outputs, yardstick.reference, tolerances)
    if report["status"] != "passed":
        report = settle(report, tolerances, outputs, yardstick.reference, yardstick.exact,
                        yardstick.engine)
    if report["status"] != "passed" and yardstick.quantized:
        report = _settle_quantized(report, executor, manifest, outputs, yardstick)
    report.update({"reference": yardstick.name, "metric": "norm-wise relative error",
                   "tolerance": cfg.tolerance,     # the base; per output: its own
                   "precision": cfg.precision,
                   "sample": cfg.sample or f"random (seed {cfg.seed})"})
    if report["status"] != "passed":
        bad = failing(report, tolerances)
        worst = max(bad, key=lambda n: report["outputs"][n].get(
            "rel_error", report["outputs"][n].get("mismatches", 1)))
        entry = report["outputs"][worst]
        raise VerificationError(f"verification failed: output {worst!r} differs from "
                                f"{yardstick.display} ({describe(entry)}, tolerance "
                                f"{tolerances[worst]:g}{_exact_note(entry)})")
    return report


def _settle_quantized(report: dict, executor, manifest: dict, outputs: dict,
                      yardstick: Yardstick) -> dict:
    """A quantized model's outputs judged by `verify_quantized`'s criterion: the model's
    own sensitivity, and every kernel on exact inputs (where the executor can run them
    one by one and the planned graph is known; the record says when it was not)."""
    tolerances = yardstick.tolerances
    passed = settle_quantized(report, tolerances, outputs, yardstick.reference,
                              yardstick.exact, yardstick.engine, yardstick.quantized)
    if not passed:
        return report
    run_with_hook = getattr(executor, "run_with_hook", None)
    if run_with_hook is None or yardstick.optimized is None:
        report["kernels"] = "not checked one by one (a dynamic artifact's variants)"
    else:
        count, worst, reason = kernel_verdict(manifest, run_with_hook, yardstick.optimized,
                                              yardstick.inputs, min(tolerances.values()))
        report["kernels"] = {"checked": count, "worst": None if worst is None else {
            "kernel": worst.kernel, "node": worst.node, "error": worst.describe()}}
        for name in passed:
            entry = report["outputs"][name]
            if reason is None:
                entry["passed_by"] += ", and every kernel matches on exact inputs"
            else:
                entry.pop("passed_by")
                entry["kernel"] = reason
    return {**report, "status": "failed" if failing(report, tolerances) else "passed"}


def describe(entry: dict) -> str:
    if "rel_error" in entry:
        return f"relative error {entry['rel_error']:.3g}, max abs {entry['max_abs_error']:.3g}"
    return ", ".join(f"{k} {v}" for k, v in entry.items())


def _exact_note(entry: dict) -> str:
    """What the exact reference said of a failing output, if it was asked."""
    exact = entry.get("exact")
    if not exact:
        return ""
    kernel = f"; {entry['kernel']}" if "kernel" in entry else ""
    return "; against the exact reference " + ", ".join(
        f"{who} {err:.3g}" for who, err in exact.items()) + kernel


def recover_artifact(writer: ArtifactWriter, manifest: dict, plan: ExecutionPlan,
                     choices: dict, failure: VerificationError, build: Callable,
                     retry_nchw: Optional[Callable], yardstick: Yardstick,
                     optimized, verifier: Verifier,
                     retry_f32: Optional[Callable] = None) -> dict:
    """Verification failed: rebuild the diverging kernels with exact-order configs
    (`hidetc.driver.recover`) -- `build(choices)` plans the same selection with them and
    writes the artifact, returning (manifest, the config it was built with: what its
    verifier is given) --; failing that, `retry_nchw()` (where the layout was left to
    the compiler) builds the whole model once more with the model's own NCHW layout (the
    layout pass changes the kernels and their summation order everywhere) the same way,
    or returns None where the layout pass changed nothing. A bf16 compile first tries
    `retry_f32(names)` (those nodes recompiled in f32: `hidetc.driver.recover_bf16`).
    Returns the manifest that passes, else raises the failure naming the kernel that
    diverges most on exact inputs."""
    executor = make_executor(writer.path, manifest, warn_cores=False)
    run_with_hook = getattr(executor, "run_with_hook", None)
    if run_with_hook is None:
        raise failure
    reference = run_graph(optimized, yardstick.inputs, keep_all=True)

    def checked(rebuilt: tuple[dict, CompileConfig]) -> tuple[dict, Optional[str]]:
        manifest_, cfg_ = rebuilt
        writer.stage_manifest({**manifest_, "verification": {"status": "pending"}})
        try:
            manifest_["verification"] = verifier(writer.path, manifest_, yardstick, cfg_)
        except VerificationError as again:
            return manifest_, str(again)
        return manifest_, None

    passed, errors, rebuilds = recover(plan, run_with_hook, yardstick.inputs, reference,
                                       choices, lambda new: checked(build(new)),
                                       str(failure))
    if passed:
        return passed
    tried = ("exact-order rebuilds did not pass either" if rebuilds
             else "no kernel has an exact-order config to rebuild with")
    if retry_f32 is not None:
        ranked = bf16_errors(optimized, reference, yardstick.inputs)
        passed = recover_bf16(ranked, min(yardstick.tolerances.values()),
                              lambda names: checked(retry_f32(names)), str(failure))
        if passed:
            return passed
        if ranked:
            tried += ", nor did computing its bf16 GEMMs in f32"
    nchw = retry_nchw() if retry_nchw is not None else None
    if nchw is not None:
        tried += ", nor did the model's own NCHW layout"
        rebuilt, again = checked(nchw)
        if again is None:
            rebuilt["verification"]["recovery"] = {
                "first_failure": str(failure), "layout": "nchw",
                "rebuilt": f"every kernel: the model's own NCHW layout ({tried})"}
            return rebuilt
    worst = worst_kernel(errors)
    hint = (f"; the kernel diverging most on exact inputs is {worst.kernel} ({worst.op} "
            f"{worst.node!r}: {worst.describe()})" if worst is not None else "")
    raise VerificationError(f"{failure}; {tried}{hint}") from None
