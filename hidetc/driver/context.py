"""The compile context: what a compile decided once, before any work, and the stages
that read it.

`CompileContext.create(cfg)` resolves the target (`auto` once, by
`backend.backend_for`), checks the precision against it, makes the machine the kernels
are for (`backend.machine`), and decides whether this host tunes (the target's device
is here, or tuning was forced -- a one-line error where candidates cannot be measured
as they will run), which space level, and whether the artifact can be verified here.
No stage decides any of these again; each reads them from the context. The stages:

    graph     = ctx.optimize(imported)              # graph passes, precision, target's
    selection = ctx.select(graph)                   # partition + templates, ONCE
    choices   = ctx.tune(selection, records)        # records -> measure -> defaults
    plan      = ctx.plan(selection, choices)        # launch records + memory + weights

`CompileContext.for_machine(machine, ...)` is a context for a given Target that
decides nothing about this host (it never tunes or verifies): what tests and the
benchmark scripts plan with.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from hidetc import cpu_isa
from hidetc.compute.task import Task
from hidetc.driver.backend import Backend, backend_for, backend_of
from hidetc.driver.config import CompileConfig
from hidetc.driver.launch import ExecutionPlan
from hidetc.driver.plan import plan
from hidetc.driver.select import Selection, select
from hidetc.driver.tune.records import RecordStore
from hidetc.driver.tune.search import Choice, LocalMeasurer, tune
from hidetc.errors import ConfigError
from hidetc.graph.ir import Graph
from hidetc.graph.pipeline import lower_precision, optimize
from hidetc.target import Target

NOT_HERE = "planned for another machine (no verification)"


@dataclass(frozen=True)
class CompileContext:
    cfg: CompileConfig
    backend: Backend
    machine: Target             # what the kernels are built for
    present: bool               # the target's device is this host
    tunes: bool                 # candidates are measured here
    level: int                  # the tuning space level (0, 1, 2)
    skip_verify: Optional[str]  # why the artifact is not verified here (None: it is)

    @classmethod
    def create(cls, cfg: CompileConfig, farm: bool = False) -> "CompileContext":
        """The decisions of a compile (see the module docstring); `farm`: candidates are
        measured elsewhere (a farm measurer, `tune.ray_farm`), so tuning needs no device
        here."""
        backend = backend_for(cfg.target)
        machine = backend.machine(cfg)
        backend.check_precision(cfg.precision, named=cfg.target != "auto", machine=machine)
        present = backend.on_this_machine(machine)
        level = cfg.space if cfg.space is not None else backend.default_space
        if cfg.tune and not present and not farm:
            raise ConfigError(f"{backend.why_not_here(machine)}, so the candidates cannot "
                              f"be measured as they will run: compile with --no-tune")
        tunes = (present or farm) if cfg.tune is None else bool(cfg.tune)
        skip = "--no-verify" if not cfg.verify else backend.cannot_verify(machine)
        return cls(cfg, backend, machine, present, tunes, level, skip)

    @classmethod
    def for_machine(cls, machine: Target, **options: Any) -> "CompileContext":
        """A context planning for `machine` with `options` (CompileConfig fields), which
        never tunes or verifies on this host."""
        cfg = CompileConfig(target=machine.kind, **{"tune": False, "verify": False,
                                                    **options})
        backend = backend_of(machine)
        return cls(cfg, backend, machine, False, False,
                   cfg.space if cfg.space is not None else backend.default_space, NOT_HERE)

    def with_config(self, **changes: Any) -> "CompileContext":
        """The same decisions with some config fields changed (a recovery's layout)."""
        return replace(self, cfg=replace(self.cfg, **changes))

    def dump(self, what: str) -> Optional[str]:
        """Where `HIDETC_DUMP` output of a stage goes (None: not dumped)."""
        root = self.cfg.dump_dir
        return str(Path(root) / what) if root else None

    # -------------------------------------------------------------- the stages

    def optimize(self, graph: Graph) -> Graph:
        """The graph passes, the precision lowering and the target's passes (its layout
        policy unless `layout: nchw`)."""
        optimized = optimize(graph, verify=self.cfg.verify_ir, dump_dir=self.dump("graph"))
        return lower_precision(optimized, self.cfg.precision, dump_dir=self.dump("graph"),
                               passes=self.backend.graph_passes(self.cfg.precision,
                                                                self.cfg.keep_f32),
                               layout=self.cfg.layout)

    def select(self, graph: Graph) -> Selection:
        return select(graph, self.backend, self.machine, self.cfg.fuse)

    def tune(self, selection: Selection, records: RecordStore,
             progress: Callable[[str, int, int], None] | None = None,
             measure: Callable | None = None, shared: Optional[dict] = None
             ) -> tuple[dict[Task, Choice], dict]:
        """The configs of the selection's templated tasks (records, tuning here or
        defaults) and the manifest's `tuning` record (`hidetc.driver.tune.search`)."""
        # a farm keys the records by its measuring nodes' machine, not this host's
        facts = getattr(measure, "record_facts", None) if self.tunes else None
        arch, device = (facts or self.backend.record_facts)(self.machine, self.present)
        choices, summary = tune(selection, self.backend, self.machine, tune=self.tunes,
                                level=self.level, arch=arch, records=records, device=device,
                                toolchain=self.backend.toolchain(), progress=progress,
                                measure=measure, tolerance=self.cfg.tolerance,
                                shared=shared)
        record = {"enabled": self.tunes, "space": self.level, "device": device,
                  "arch": arch, "records": str(records.path), **summary.as_dict()}
        return choices, record

    def measurer(self) -> LocalMeasurer:
        """The measurer tuning uses on this machine (no numerics budget: for timing
        configs that were already candidates)."""
        arch, _ = self.backend.record_facts(self.machine, self.present)
        return LocalMeasurer(self.backend, arch)

    def plan(self, selection: Selection, choices: Optional[Mapping[Task, Any]] = None
             ) -> ExecutionPlan:
        return plan(selection, self.backend, self.machine, choices, self.dump("fusion"))


def plan_graph(graph: Graph, machine: Target, fuse: bool = True,
               choices: Optional[Mapping[Task, Any]] = None,
               dump_dir: Optional[str] = None) -> ExecutionPlan:
    """The plan of an optimized `graph` for `machine` (select, then plan, without
    tuning: `choices` or the defaults); what tests and benchmark scripts call."""
    ctx = CompileContext.for_machine(machine, fuse=fuse, dump_dir=dump_dir)
    return ctx.plan(ctx.select(graph), choices)


def environment_options(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The compile options the environment sets, for the API boundary (the CLI and
    `compile_model` build their config with these under the caller's own): HIDETC_TUNE=0
    turns automatic tuning off (the test suite does: only the tuner's own tests pay for
    it), HIDETC_CPU_ISA picks the cpu kernels' ISA (avx2 | avx512: `cpu_isa.env_choice`,
    the parser `cpu_isa.current` -- the ISA of the code a process builds to run itself --
    shares), HIDETC_DUMP a dump directory. A compile reads nothing else from the
    environment; a caller's own CompileConfig is taken as given."""
    found: dict[str, Any] = {}
    if environ.get("HIDETC_TUNE", "").strip() == "0":
        found["tune"] = False
    isa = cpu_isa.env_choice(environ)
    if isa is not None:
        found["cpu_isa"] = isa
    if environ.get("HIDETC_DUMP"):
        found["dump_dir"] = environ["HIDETC_DUMP"]
    return found
