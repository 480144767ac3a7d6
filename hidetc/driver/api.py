"""The Python API: `compile_model(model, out_dir, ...)` and `load(out_dir)` (a loaded
artifact: `hidetc.driver.model`).

`compile_model` is the compile as one pipeline; each stage consumes what the one before
decided and never decides it again (`hidetc.driver.context.CompileContext` holds the
decisions made once: target, machine, whether this host tunes and verifies):

    ctx       = CompileContext.create(cfg)          # target, backend, machine, decisions
    graph     = load_model(model, shapes)           # ONNX -> graph IR
    optimized = ctx.optimize(graph)                 # graph passes, precision, target's
    selection = ctx.select(optimized)               # partition + templates, ONCE
    choices   = ctx.tune(selection, records)        # records -> measure -> defaults
    plan      = ctx.plan(selection, choices)        # launch records, memory, weights
    manifest  = write_artifact(writer, plan, ctx)   # weights, kernels built, manifest
    verify_artifact(...)  [recover_artifact(...)]   # against ONNX Runtime, in a temp dir
    writer.finish(manifest)                         # renamed into place

Nothing is left at `out_dir` unless every stage succeeded. Seams: `measure` times the
tuning candidates (default: the backend's measurer on this machine), `verifier` checks
a staged artifact (default `verification.verify_artifact`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from hidetc.backends.runtime.artifact import ArtifactWriter, check_output_dir
from hidetc.driver.config import CompileConfig, make_config
from hidetc.driver.context import CompileContext, environment_options
from hidetc.driver.dispatch_report import dispatch_table, measure_table
from hidetc.driver.dynamic import plan_variants, verification_sizes
from hidetc.driver.emit import write_artifact
from hidetc.driver.model import Model, load, profile_rows  # noqa: F401 (the API)
from hidetc.driver.tune.records import RecordStore
from hidetc.driver.verification import Verifier, Yardstick, recover_artifact, verify_artifact
from hidetc.errors import ConfigError, VerificationError
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.symbolic import assume, upper_bound
from hidetc.target import host_memory_bytes


@dataclass
class CompileResult:
    out_dir: Path
    manifest: dict
    timings: dict[str, float] = field(default_factory=dict)


def compile_model(model_path: str | os.PathLike, out_dir: str | os.PathLike, *,
                  config: CompileConfig | None = None, preset: str | None = None,
                  progress: Callable[[str, int, int], None] | None = None,
                  measure: Callable | None = None, verifier: Verifier | None = None,
                  **overrides: Any) -> CompileResult:
    """Compile an ONNX model into the artifact directory `out_dir` and verify it (see
    the module docstring). `progress(label, done, total)` follows the tuning
    candidates. Without a `config`, the options are `preset`'s, then the environment's
    (`context.environment_options`), then `overrides`."""
    given = {k: v for k, v in overrides.items() if v is not None}
    cfg = config or make_config(preset, {**environment_options(), **given})
    if config is not None and overrides:
        cfg = replace(cfg, **overrides)
    verifier = verifier or verify_artifact
    ctx = CompileContext.create(cfg, farm=hasattr(measure, "measure_all"))
    check_output_dir(out_dir)
    model_path = Path(model_path)
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    graph = load_model(model_path, **cfg.bindings)
    if graph.symbols:
        return _compile_ranges(model_path, out_dir, ctx, graph, verifier, timings, clock,
                               measure, progress)
    optimized = ctx.optimize(graph)
    selection = ctx.select(optimized)
    timings["frontend_s"] = time.perf_counter() - clock
    _check_memory(optimized, ctx)
    clock = time.perf_counter()
    choices, tuning = _tune(ctx, selection, measure, progress)
    timings["tune_s"] = time.perf_counter() - clock
    plan = ctx.plan(selection, choices)
    def verified(writer: ArtifactWriter, manifest: dict) -> dict:
        yardstick = Yardstick(model_path, graph, cfg, optimized)
        try:
            return {**manifest, "verification": verifier(writer.path, manifest, yardstick,
                                                         cfg)}
        except VerificationError as failure:
            return _recover(writer, manifest, ctx, graph, optimized, selection, choices,
                            tuning, plan, model_path, yardstick, failure, measure, verifier)

    with ArtifactWriter(out_dir) as writer:
        clock = time.perf_counter()
        manifest = _written(writer, ctx, plan, tuning, model_path)
        timings["build_s"] = time.perf_counter() - clock
        manifest = _finish(writer, manifest, ctx, verified, timings)
    return CompileResult(Path(out_dir), manifest, timings)


def _finish(writer: ArtifactWriter, manifest: dict, ctx: CompileContext,
            verified: Callable[[ArtifactWriter, dict], dict], timings: dict) -> dict:
    """The verification stage of a written artifact, then its rename into place:
    skipped where the context says so, else the staged artifact checked by `verified`
    (the manifest with its verification record, or what a recovery rebuilt)."""
    clock = time.perf_counter()
    if ctx.skip_verify:
        manifest = {**manifest, "verification": {"status": "skipped",
                                                 "reason": ctx.skip_verify}}
    else:
        writer.stage_manifest({**manifest, "verification": {"status": "pending"}})
        manifest = verified(writer, manifest)
    timings["verify_s"] = time.perf_counter() - clock
    writer.finish(manifest)
    return manifest


def _tune(ctx: CompileContext, selection, measure: Optional[Callable],
          progress: Optional[Callable] = None, shared: Optional[dict] = None
          ) -> tuple[dict, dict]:
    """(choices, the manifest's tuning record) of a selection, through the records file
    (`shared`: a range compile's configs across its variants, `tune.search.tune`)."""
    with RecordStore(Path(ctx.cfg.records) if ctx.cfg.records else None) as records:
        return ctx.tune(selection, records, progress, measure, shared)


def _written(writer: ArtifactWriter, ctx: CompileContext, plan, tuning: dict,
             model_path: Path) -> dict:
    """The artifact of `plan` written into `writer`'s staging directory: its manifest."""
    return {**write_artifact(writer, plan, ctx, model_path), "tuning": tuning}


def _recover(writer: ArtifactWriter, manifest: dict, ctx: CompileContext, graph,
             optimized, selection, choices: dict, tuning: dict, plan, model_path: Path,
             yardstick: Yardstick, failure: VerificationError, measure: Optional[Callable],
             verifier: Verifier) -> dict:
    """The verification recovery (`verification.recover_artifact`) with this compile's
    rebuilds: the same selection with other configs; and, where the default layout pass
    changed the model, the model once more with its own NCHW layout (its graph passes
    run only if the exact-order rebuilds did not pass); bf16: before that, the model with
    its costliest bf16 nodes in f32 (`hidetc.driver.recover_bf16`)."""
    def build(new_choices: dict) -> tuple[dict, CompileConfig]:
        writer.reset()
        return (_written(writer, ctx, ctx.plan(selection, new_choices), tuning, model_path),
                ctx.cfg)

    def whole(changed: CompileContext, lowered) -> tuple[dict, CompileConfig]:
        """The whole model again, from its lowered graph, under a changed config."""
        again = changed.select(lowered)
        kept_choices, kept_tuning = _tune(changed, again, measure)
        writer.reset()
        return (_written(writer, changed, changed.plan(again, kept_choices), kept_tuning,
                         model_path), changed.cfg)

    def retry() -> Optional[tuple[dict, CompileConfig]]:
        nchw = ctx.with_config(layout="nchw")
        kept = nchw.optimize(graph)
        if [n.op for n in kept.nodes] == [n.op for n in optimized.nodes]:
            return None                     # the layout pass changed nothing
        return whole(nchw, kept)

    def retry_f32(names: tuple[str, ...]) -> tuple[dict, CompileConfig]:
        kept = ctx.with_config(keep_f32=ctx.cfg.keep_f32 + names)
        return whole(kept, kept.optimize(graph))

    return recover_artifact(writer, manifest, plan, choices, failure, build,
                            retry if ctx.cfg.layout == "auto" else None, yardstick,
                            optimized, verifier,
                            retry_f32 if ctx.cfg.precision == "bf16" else None)


def _compile_ranges(model_path: Path, out_dir, ctx: CompileContext, graph,
                    verifier: Verifier, timings: dict, clock: float,
                    measure: Optional[Callable], progress: Optional[Callable]
                    ) -> CompileResult:
    """The compile of a graph with symbolic sizes (`hidetc.driver.dynamic`): the
    dispatch variants covering the ranges, written as one artifact, verified against
    the reference at each of `verification_sizes`. Each variant's anchors are tuned
    (or taken from the records) at its hint sizes -- the static tasks there; their
    configs are valid at every size."""
    cfg = ctx.cfg
    tunings: list[dict] = []
    chosen: list[dict] = []
    shared: dict = {}           # configs chosen so far, measured by later variants too

    def build(g):
        selection = ctx.select(ctx.optimize(g))
        choices, tuning = _tune(ctx, selection, measure, progress, shared)
        tunings.append(tuning)
        chosen.append(choices)
        return ctx.plan(selection, choices)

    with assume(graph.symbols):
        _check_memory(graph, ctx)
        variants = plan_variants(graph, build)
        timings["frontend_s"] = time.perf_counter() - clock
        timings["tune_s"] = sum(t.get("seconds", 0.0) for t in tunings)
        with ArtifactWriter(out_dir) as writer:
            clock = time.perf_counter()
            manifest = write_artifact(writer, variants[0].plan, ctx, model_path, variants,
                                      graph)
            manifest["tuning"] = {**tunings[0], "variants": [
                {k: t.get(k) for k in ("tasks", "from_records", "tuned", "candidates",
                                       "seconds")} for t in tunings]}
            with RecordStore(Path(cfg.records) if cfg.records else None) as records:
                if ctx.tunes:
                    measure_table(variants, chosen, records, measure or ctx.measurer(),
                                  ctx.machine)
                manifest["dynamic"]["dispatch"] = dispatch_table(variants, chosen, records)
            timings["build_s"] = time.perf_counter() - clock
            manifest = _finish(writer, manifest, ctx, lambda w, m: {
                **m, "verification": _verify_sizes(w.path, m, graph, model_path, cfg,
                                                   verifier, variants)}, timings)
    return CompileResult(Path(out_dir), manifest, timings)


def _verify_sizes(path: Path, manifest: dict, graph, model_path: Path, cfg: CompileConfig,
                  verifier: Verifier, variants) -> dict:
    """The artifact verified at each of `verification_sizes` against the imported graph
    at those sizes (`Graph.at`): the record of the first, with every size's result."""
    records = []
    for sizes in verification_sizes(graph.symbols, variants):
        where = ", ".join(f"{k}={v}" for k, v in sizes.items())
        try:
            report = verifier(path, manifest, Yardstick(model_path, graph.at(sizes), cfg),
                              cfg)
        except VerificationError as error:
            raise VerificationError(f"at {where}: {error}") from None
        records.append((sizes, report))
    first = dict(records[0][1])
    first["sizes"] = [{"sizes": dict(sizes), "status": r["status"],
                       "outputs": r.get("outputs", {})} for sizes, r in records]
    return first


def _check_memory(graph, ctx: CompileContext) -> None:
    """A one-line ConfigError, before any work, when the compile would run the model on
    this host (tuning or verification) and its tensors cannot fit this host's memory:
    at least the inputs, outputs and weights plus the largest intermediate value (with
    symbolic sizes: at the largest sizes of their ranges, under `assume`)."""
    if ctx.skip_verify is not None and not ctx.tunes:
        return
    memory = host_memory_bytes()
    if memory is None:
        return
    io = sum(upper_bound(graph.types[v].nbytes) for v in (*graph.inputs, *graph.outputs))
    weights = sum(int(a.nbytes) for a in graph.constants.values())
    inner = [(upper_bound(graph.types[o].nbytes), n.name, o) for n in graph.nodes
             for o in n.outputs if o and o not in graph.outputs]
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
