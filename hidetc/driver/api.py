"""The Python API: `compile_model(model, out_dir, ...)` and `load(out_dir)` (a loaded
artifact: `hidetc.driver.model`).

compile_model runs the whole pipeline: import -> graph passes -> precision lowering
(f16: float16 storage, `hidetc.graph.pipeline.lower_precision`) -> plan (kernels,
memory) -> lower + C codegen -> gcc -> artifact (written to a temporary directory) ->
verification against ONNX Runtime (at the precision's tolerance) -> rename into place.
Nothing is left at `out_dir` unless every step succeeded.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from hidetc import __version__
from hidetc.backends.runtime.artifact import (
    FORMAT_VERSION,
    ArtifactWriter,
    check_output_dir,
)
from hidetc.backends.runtime.select import gpu_available, make_executor
from hidetc.backends.runtime.weights import write_weights
from hidetc.driver.backend import BACKENDS
from hidetc.driver.config import CompileConfig, make_config
from hidetc.driver.model import Model, load, profile_rows  # noqa: F401 (the API)
from hidetc.driver.plan import ExecutionPlan, plan_graph, written_values
from hidetc.driver.recover import recover, worst_kernel
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
from hidetc.errors import ConfigError, VerificationError
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.pipeline import lower_precision, optimize
from hidetc.graph.reference import run_graph
from hidetc.target import Target, host_memory_bytes


@dataclass
class CompileResult:
    out_dir: Path
    manifest: dict
    timings: dict[str, float] = field(default_factory=dict)


def _resolve_target(target: str) -> str:
    """auto: cuda when a CUDA GPU and pycuda are usable here, else cpu."""
    if target != "auto":
        return target
    return "cuda" if gpu_available() else "cpu"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def optimized_graph(graph, cfg: CompileConfig, target: str):
    """The graph passes a compile runs on the imported `graph` for `target` (what the
    plan is made from, and what `kernel_check` rebuilds to compare kernels with)."""
    optimized = optimize(graph, verify=cfg.verify_ir, dump_dir=_dump(cfg, "graph"))
    return lower_precision(optimized, cfg.precision, dump_dir=_dump(cfg, "graph"),
                           target=target, layout=cfg.layout)


def compile_model(model_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                  config: CompileConfig | None = None, preset: str | None = None,
                  progress: Callable[[str, int, int], None] | None = None,
                  **overrides: Any) -> CompileResult:
    """Compile an ONNX model into the artifact directory `out_dir` and verify it.
    `progress(label, done, total)` follows the tuning candidates."""
    cfg = config or make_config(preset, overrides)
    if config is not None and overrides:
        cfg = replace(cfg, **overrides)
    target = _resolve_target(cfg.target)
    cfg.check_target(target)
    check_output_dir(out_dir)
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    graph = load_model(model_path, shapes=cfg.shapes)
    optimized = optimized_graph(graph, cfg, target)
    timings["frontend_s"] = time.perf_counter() - clock
    backend = BACKENDS[target]
    machine = backend.machine(cfg)
    _check_memory(optimized, cfg, backend, machine)
    clock = time.perf_counter()
    choices, tuning = _tune(optimized, backend, machine, cfg, progress)
    timings["tune_s"] = time.perf_counter() - clock
    plan = plan_graph(optimized, machine, fuse=cfg.fuse, dump_dir=_dump(cfg, "fusion"),
                      choices=choices)
    with ArtifactWriter(out_dir) as writer:
        clock = time.perf_counter()
        manifest = _write_artifact(writer, plan, cfg, backend, Path(model_path))
        manifest["tuning"] = tuning
        timings["build_s"] = time.perf_counter() - clock
        clock = time.perf_counter()
        cannot = "--no-verify" if not cfg.verify else backend.cannot_verify(machine)
        if cannot:
            manifest["verification"] = {"status": "skipped", "reason": cannot}
        else:
            writer.stage_manifest({**manifest, "verification": {"status": "pending"}})
            yardstick = _Yardstick(model_path, graph, cfg)
            try:
                manifest["verification"] = _verify(writer.path, manifest, yardstick, cfg)
            except VerificationError as failure:
                manifest = _recover(writer, manifest, plan, choices, tuning, machine, cfg,
                                    backend, Path(model_path), graph, optimized, yardstick,
                                    failure)
        timings["verify_s"] = time.perf_counter() - clock
        writer.finish(manifest)
    return CompileResult(Path(out_dir), manifest, timings)


def _check_memory(graph, cfg: CompileConfig, backend, machine: Target) -> None:
    """A one-line ConfigError, before any work, when the compile would run the model on
    this host (tuning or verification) and its tensors cannot fit this host's memory:
    at least the inputs, outputs and weights plus the largest intermediate value."""
    runs_here = cfg.verify and backend.cannot_verify(machine) is None
    if not runs_here and not cfg.tuning(machine.kind, backend.on_this_machine(machine))[0]:
        return
    memory = host_memory_bytes()
    if memory is None:
        return
    io = sum(graph.types[v].nbytes for v in (*graph.inputs, *graph.outputs))
    weights = sum(int(a.nbytes) for a in graph.constants.values())
    inner = [(graph.types[o].nbytes, n.name, o) for n in graph.nodes for o in n.outputs
             if o and o not in graph.outputs]
    largest = max(inner, default=(0, "", ""))
    need = io + weights + largest[0]
    if need <= memory:
        return
    where = f"; the largest: node {largest[1]!r} output {largest[2]!r}, " \
            f"{_gib(largest[0])}" if largest[0] else ""
    raise ConfigError(f"the model's tensors need at least {_gib(need)} (inputs, outputs "
                      f"and weights {_gib(io + weights)}{where}) and this machine has "
                      f"{_gib(memory)}: tuning and verification run the model here; "
                      f"compile with --no-tune --no-verify to build it for a bigger machine")


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:,.1f} GiB"


def _tune(graph, backend, machine: Target, cfg: CompileConfig, progress
          ) -> tuple[dict, dict]:
    """The configs of the anchors (records, tuning or defaults) and the manifest's
    `tuning` record (see hidetc.driver.tune.search). Tuning measures only where `machine` is
    this host (`backend.on_this_machine`): asked for elsewhere, a one-line ConfigError;
    a cross-compile takes records measured on a matching machine, else the defaults."""
    from hidetc.driver.tune.records import RecordStore, toolchain_version
    from hidetc.driver.tune.search import tune_graph
    target = machine.kind
    present = backend.on_this_machine(machine)
    tune, level = cfg.tuning(target, present)
    if tune and not present and cfg.tune:
        raise ConfigError(f"{backend.why_not_here(machine)}, so the candidates cannot be "
                          f"measured as they will run: compile with --no-tune")
    tune = tune and present
    arch, device = backend.record_facts(machine, present)
    with RecordStore(Path(cfg.records) if cfg.records else None) as store:
        choices, summary = tune_graph(graph, machine, tune=tune, level=level, arch=arch,
                                      records=store, device=device,
                                      toolchain=toolchain_version(target),
                                      progress=progress, tolerance=cfg.tolerance)
        record = {"enabled": tune, "space": level, "device": device, "arch": arch,
                  "records": str(store.path), **summary.as_dict()}
    return choices, record


def _dump(cfg: CompileConfig, what: str) -> str | None:
    root = cfg.dump_dir or os.environ.get("HIDETC_DUMP")
    return str(Path(root) / what) if root else None


def _write_artifact(writer: ArtifactWriter, plan: ExecutionPlan, cfg: CompileConfig,
                    backend, model_path: Path) -> dict:
    entries = write_weights(writer.path / "weights.bin", plan.weights)
    built = backend.build(plan, entries, writer.path, cfg, _dump(cfg, "tir"))
    resources = built.pop("resources", {})
    graph = plan.graph
    nodes = {n.name: n for n in graph.nodes}
    inputs = [_spec(graph, v) for v in graph.inputs]
    outputs = [_spec(graph, v) for v in graph.outputs]
    return {
        "format_version": FORMAT_VERSION,
        "hidetc_version": __version__,
        "target": backend.kind,
        "machine": plan.machine.facts(),
        **backend.manifest_facts(plan.machine),
        "precision": cfg.precision,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": {"file": model_path.name, "sha256": _sha256(model_path)},
        "inputs": inputs,
        "outputs": outputs,
        "output_sources": plan.output_sources,
        "kernels": [{"name": s.kernel, "node": s.node, "op": s.op, "args": list(s.values),
                     "writes": list(written_values(s.group, nodes)),
                     "task": plan.tasks[s.kernel].signature(),
                     **plan.choices.get(s.kernel, {}), **plan.facts.get(s.kernel, {}),
                     **resources.get(s.kernel, {}), "group": _group_dict(s.group, graph)}
                    for s in plan.steps],
        "fusion": {"groups": len(plan.steps), "nodes": len(graph.nodes),
                   "fallbacks": plan.fusion_fallbacks},
        "memory": {"arena_bytes": plan.memory.arena_bytes,
                   "total_bytes": plan.memory.total_bytes,
                   "offsets": dict(plan.memory.offsets),
                   "in_place": dict(plan.in_place),
                   # each arena value's size (the kept-zero region's too: `scratch`'s
                   # ZEROED_REGION, split-K's arrival counters)
                   "bytes": dict(plan.value_bytes),
                   # the graph values' element types (the sanitizer's poison check)
                   "dtypes": {v: graph.types[v].dtype for v in plan.value_bytes
                              if v in graph.types},
                   # what each execution context (a pass in flight) holds
                   **backend.context_memory(plan.memory.arena_bytes, inputs, outputs,
                                            resources)},
        "weights": {"file": "weights.bin",
                    "entries": {k: _entry_dict(e) for k, e in entries.items()}},
        **built,
        "config": cfg.as_dict(),
    }


def _group_dict(group, graph) -> dict:
    """The fusion group of a launch: prologue and epilogue nodes as [name, op], and the
    Concat node it writes its slice of (`into`), if any."""
    ops = {n.name: n.op for n in graph.nodes}
    return {"kind": group.kind,
            "prologues": [[n, ops[n]] for n in group.prologues],
            "epilogues": [[n, ops[n]] for n in group.epilogues],
            **({"into": [group.into, ops[group.into]]} if group.into else {})}


def _entry_dict(entry) -> dict:
    return {"offset": int(entry.offset), "nbytes": int(entry.nbytes), "dtype": str(entry.dtype),
            "shape": [int(d) for d in entry.shape]}


def _spec(graph, value: str) -> dict:
    t = graph.types[value]
    return {"name": value, "dtype": t.dtype, "shape": list(t.shape)}


class _Yardstick:
    """What a compile verifies against, computed once (a recovery verifies several
    builds against it): the sample inputs, the reference's outputs on them, each
    output's tolerance (`output_tolerances`: the model's own precision), and the exact
    reference (`exact_outputs`), computed the first time an output misses its bound."""

    def __init__(self, model_path, graph, cfg: CompileConfig):
        names = list(graph.inputs)
        self.inputs = (load_sample(cfg.sample, names) if cfg.sample
                       else sample_inputs(graph, cfg.seed))
        self.reference, self.name = reference_outputs(model_path, graph, self.inputs)
        self.tolerances = ({o: cfg.tolerance for o in graph.outputs} if cfg.rtol is not None
                           else output_tolerances(graph, cfg.tolerance))
        self._graph = graph
        self._exact: Optional[dict] = None

    def exact(self) -> dict:
        if self._exact is None:
            self._exact = exact_outputs(self._graph, self.inputs)
        return self._exact

    @property
    def engine(self) -> str:
        """The reference's short name ("onnxruntime", or "the numpy reference")."""
        return "onnxruntime" if self.name == "onnxruntime" else "the numpy reference"


def _verify(path: Path, manifest: dict, yardstick: _Yardstick, cfg: CompileConfig) -> dict:
    outputs = make_executor(path, manifest, warn_cores=False).run(yardstick.inputs)
    reference_name = yardstick.name
    tolerances = yardstick.tolerances
    report = compare(outputs, yardstick.reference, tolerances)
    if report["status"] != "passed":
        report = settle(report, tolerances, outputs, yardstick.reference, yardstick.exact,
                        yardstick.engine)
    report.update({"reference": reference_name, "metric": "norm-wise relative error",
                   "tolerance": max(tolerances.values(), default=cfg.tolerance),
                   "precision": cfg.precision,
                   "sample": cfg.sample or f"random (seed {cfg.seed})"})
    if report["status"] != "passed":
        bad = failing(report, tolerances)
        worst = max(bad, key=lambda n: report["outputs"][n].get(
            "rel_error", report["outputs"][n].get("mismatches", 1)))
        against = "ONNX Runtime" if reference_name == "onnxruntime" else "the numpy reference"
        entry = report["outputs"][worst]
        raise VerificationError(f"verification failed: output {worst!r} differs from "
                                f"{against} ({_describe(entry)}, tolerance "
                                f"{tolerances[worst]:g}{_exact_note(entry)})")
    return report


def _exact_note(entry: dict) -> str:
    """What the exact reference said of a failing output, if it was asked."""
    exact = entry.get("exact")
    if not exact:
        return ""
    return "; against the exact reference " + ", ".join(
        f"{who} {err:.3g}" for who, err in exact.items())


def _recover(writer: ArtifactWriter, manifest: dict, plan: ExecutionPlan, choices: dict,
             tuning: dict, machine: Target, cfg: CompileConfig, backend, model_path: Path,
             graph, optimized, yardstick: _Yardstick, failure: VerificationError) -> dict:
    """Verification failed: rebuild the diverging kernels with exact-order configs
    (`hidetc.driver.recover`); failing that, with the default layout pass on, the whole
    model once more with the model's own NCHW layout (the layout pass changes the
    kernels and their summation order everywhere); return the manifest that passes,
    else raise the failure naming the kernel that diverges most on exact inputs."""
    executor = make_executor(writer.path, manifest, warn_cores=False)
    run_with_hook = getattr(executor, "run_with_hook", None)
    if run_with_hook is None:
        raise failure
    reference = run_graph(optimized, yardstick.inputs, keep_all=True)

    def rebuild(new_choices: dict, graph_=optimized, tuning_=tuning, cfg_=cfg
                ) -> tuple[dict, Optional[str]]:
        writer.reset()
        new_plan = plan_graph(graph_, machine, fuse=cfg_.fuse,
                              dump_dir=_dump(cfg_, "fusion"), choices=new_choices)
        rebuilt = _write_artifact(writer, new_plan, cfg_, backend, model_path)
        rebuilt["tuning"] = tuning_
        writer.stage_manifest({**rebuilt, "verification": {"status": "pending"}})
        try:
            rebuilt["verification"] = _verify(writer.path, rebuilt, yardstick, cfg_)
        except VerificationError as again:
            return rebuilt, str(again)
        return rebuilt, None

    passed, errors, rebuilds = recover(manifest, run_with_hook, yardstick.inputs, reference,
                                       plan, choices, machine, rebuild, str(failure))
    if passed:
        return passed
    tried = ("exact-order rebuilds did not pass either" if rebuilds
             else "no kernel has an exact-order config to rebuild with")
    if cfg.layout == "auto":
        nchw = replace(cfg, layout="nchw")
        kept = optimized_graph(graph, nchw, backend.kind)
        if [n.op for n in kept.nodes] != [n.op for n in optimized.nodes]:
            tried += ", nor did the model's own NCHW layout"
            kept_choices, kept_tuning = _tune(kept, backend, machine, nchw, None)
            rebuilt, again = rebuild(kept_choices, kept, kept_tuning, nchw)
            if again is None:
                rebuilt["verification"]["recovery"] = {
                    "first_failure": str(failure), "layout": "nchw",
                    "rebuilt": f"every kernel: the model's own NCHW layout ({tried})"}
                return rebuilt
    worst = worst_kernel(errors)
    hint = (f"; the kernel diverging most on exact inputs is {worst.kernel} ({worst.op} "
            f"{worst.node!r}: {worst.describe()})" if worst is not None else "")
    raise VerificationError(f"{failure}; {tried}{hint}") from None


def _describe(entry: dict) -> str:
    if "rel_error" in entry:
        return f"relative error {entry['rel_error']:.3g}, max abs {entry['max_abs_error']:.3g}"
    return ", ".join(f"{k} {v}" for k, v in entry.items())
