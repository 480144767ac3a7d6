"""`hidetc farm`: many compiles, one after another, sharing one record store -- on a Ray
cluster (`--cluster ADDRESS`: one `RayFarm`, one connection, for every job) or locally
(the local tuner) -- with progress while they run, one table of results at the end and
a JSON report (`--report`).

The jobs file (YAML)::

    jobs:
      - model: models/bert.onnx        # relative to the jobs file
        out: out/bert-cpu              # relative to the jobs file
        target: cpu                    # any compile option by its CLI name, e.g.
        precision: f32                 # gpu: h100-sxm, space: 2, shape: [...]

Every key but `model` and `out` is a `hidetc compile` option by its long name (dashes or
underscores): each job becomes the compile command's argv (`--key=value`; a list: the
option repeated; a mapping: NAME=VALUE each; a flag: true gives it, `tune: false` gives
`--no-tune`, and `verify: false` / `fuse: false` stand for `--no-verify` / `--no-fuse`)
parsed by the compile command's own parameters (`compile_cmd.make_context`), then
`compile_cli.compile_overrides`: the values are checked as on the command line, with
its messages. `sample` and a `config` file are relative to the jobs file too;
`records` and `cluster` belong to the farm (`--records`, `--cluster`), not to a job.
Every job is checked before the first runs: a malformed file, a missing model file, an
unknown key or a bad value is one line naming the file, the job (1-based) and the key,
exit 2.

A job that fails is reported (its one line) and the farm goes on with the next; the exit
status is 1 when any failed. `hidetc farm resources` prints this machine's custom Ray
resource (`ray_farm.machine_resource`) for `ray start --resources`.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import click
import yaml

from hidetc.backends.runtime.artifact import read_manifest
from hidetc.driver import api
from hidetc.driver.backend import backend_for
from hidetc.driver.config import CPU_ISAS, load_preset, make_config
from hidetc.driver.context import environment_options
from hidetc.driver.tune import ray_farm
from hidetc.errors import ConfigError, HidetcError
from hidetc.tools.cli_errors import debugging, handle_errors
from hidetc.tools.compile_cli import compile_cmd, compile_overrides, farm_line, open_farm

FARM_OPTIONS = {"records": "all jobs share one record store: give --records to `hidetc "
                           "farm run`",
                "cluster": "give --cluster to `hidetc farm run` (one cluster for every job)"}
TUNING_KEYS = ("tasks", "from_records", "tuned", "candidates", "failures", "seconds")
PROGRESS_EVERY_S = 2.0


# ---------------------------------------------------------------- the jobs file


@dataclass
class Job:
    index: int                  # 1-based, as the messages and the table name it
    model: Path
    out: Path
    options: dict[str, Any]     # as the jobs file gives them (model and out too)
    preset: Optional[str]
    overrides: dict[str, Any]   # compile_model's
    target: str                 # the config's (before "auto" is resolved)
    precision: str

    @property
    def name(self) -> str:
        return str(self.options["model"])


def load_jobs(path: Path, records: Optional[str] = None) -> list[Job]:
    """The jobs of the jobs file `path`, every one checked (see the module docstring);
    `records`: the record store every job uses (None: the default)."""
    if not path.is_file():
        raise ConfigError(f"{path}: jobs file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list) \
            or not data["jobs"]:
        raise ConfigError(f"{path}: expected `jobs:` with a list of jobs (each a mapping "
                          f"of model, out and compile options)")
    extra = sorted(str(k) for k in data if k != "jobs")
    if extra:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(extra)} (expected jobs)")
    jobs: list[Job] = []
    outs: dict[Path, int] = {}
    for index, entry in enumerate(data["jobs"], 1):
        job = _job(path, index, entry, records)
        out = job.out.resolve()
        if out in outs:
            raise ConfigError(f"{path}: job {index}: out: {job.options['out']} is job "
                              f"{outs[out]}'s too")
        outs[out] = index
        jobs.append(job)
    return jobs


def _job(path: Path, index: int, entry: Any, records: Optional[str]) -> Job:
    where = f"{path}: job {index}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping of option: value")
    base = path.parent
    located = {}
    for key in ("model", "out"):
        value = entry.get(key)
        if value is None:
            what = "the .onnx file" if key == "model" else "the artifact directory"
            raise ConfigError(f"{where}: {key}: missing ({what}, relative to the jobs file)")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: {key}: expected a path, got {value!r}")
        located[key] = base / str(value)
    if not located["model"].is_file():
        raise ConfigError(f"{where}: model: {located['model']}: no such file")
    argv: list[str] = []
    origin: dict[str, str] = {}          # click parameter name -> the job's key
    for key, value in entry.items():
        if key in ("model", "out"):
            continue
        param, args = _option_args(where, base, key, value)
        if param.name in origin:
            raise ConfigError(f"{where}: {key}: the same option as {origin[param.name]}")
        origin[param.name] = str(key)
        argv += args
    argv += [f"--out={located['out']}", "--", str(located["model"])]
    try:
        ctx = compile_cmd.make_context("compile", argv)
    except click.ClickException as exc:
        param = getattr(exc, "param", None)
        key = origin.get(param.name) if param is not None else None
        raise ConfigError(f"{where}: {key + ': ' if key else ''}{exc.format_message()}") \
            from None
    params = ctx.params
    try:
        if params["preset"] is not None:
            try:
                load_preset(params["preset"])
            except ConfigError as exc:
                raise ConfigError(f"{origin['preset']}: {exc}") from None
        overrides = compile_overrides(params)       # (its messages name the option)
        overrides["records"] = records
        cfg = make_config(params["preset"], {**environment_options(),
                                             **{k: v for k, v in overrides.items()
                                                if v is not None}})
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return Job(index, params["model"], params["out_dir"], dict(entry), params["preset"],
               overrides, cfg.target, cfg.precision)


def _compile_options() -> dict[str, tuple[click.Option, str]]:
    """The compile command's long option names (without the dashes) -> (its parameter,
    the option as written)."""
    found = {}
    for param in compile_cmd.params:
        if isinstance(param, click.Option):
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("--"):
                    found[opt[2:]] = (param, opt)
    return found


def _option_args(where: str, base: Path, key: Any, value: Any
                 ) -> tuple[click.Option, list[str]]:
    """The compile argv of one option of a job (see the module docstring)."""
    if not isinstance(key, str):
        raise ConfigError(f"{where}: {key!r}: expected an option name")
    name = key.replace("_", "-")
    if name in FARM_OPTIONS:
        raise ConfigError(f"{where}: {key}: {FARM_OPTIONS[name]}")
    known = _compile_options()
    negated = False
    if name in known and name not in ("out", "help"):
        param, opt = known[name]
    elif f"no-{name}" in known and known[f"no-{name}"][0].is_flag:
        (param, opt), negated = known[f"no-{name}"], True     # verify: false
    else:
        raise ConfigError(f"{where}: {key}: unknown option (a `hidetc compile` option by "
                          f"its name, e.g. target, precision, space, shape, tune)")
    if value is None:
        raise ConfigError(f"{where}: {key}: no value")
    if param.is_flag:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: {key}: expected true or false, got {value!r}")
        if negated:
            value = not value
        if param.secondary_opts:          # --tune/--no-tune
            on = opt in param.opts
            return param, [param.opts[-1] if value == on else param.secondary_opts[0]]
        return param, [opt] if value else []
    if isinstance(value, dict):
        items = [f"{k}={_text(v, where, key)}" for k, v in value.items()]
    elif isinstance(value, list):
        items = [_text(v, where, key) for v in value]
    else:
        items = [_text(value, where, key)]
    if not param.multiple and len(items) != 1:
        raise ConfigError(f"{where}: {key}: expected one value, got {value!r}")
    if name == "sample" or name == "config" and _is_file(items[0], base):
        items = [str(base / item) for item in items]
    return param, [f"{opt}={item}" for item in items]


def _text(value: Any, where: str, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ConfigError(f"{where}: {key}: expected a value or a list of values, got {value!r}")


def _is_file(preset: str, base: Path) -> bool:
    """A --config value naming a file (resolved against the jobs file), not a preset."""
    return Path(preset).suffix in (".yaml", ".yml") or (base / preset).is_file()


# ---------------------------------------------------------------- running


@dataclass
class Outcome:
    job: Job
    status: str = "not run"     # ok | failed | interrupted | not run
    error: Optional[str] = None
    seconds: float = 0.0
    manifest: Optional[dict] = None
    nodes: dict[str, dict[str, int]] = field(default_factory=dict)  # during this job
    measured_on: list[str] = field(default_factory=list)

    def tuning(self) -> Optional[dict]:
        t = (self.manifest or {}).get("tuning")
        if not t or "tasks" not in t:
            return None
        return {k: t.get(k) for k in TUNING_KEYS}

    def count(self, what: str) -> Optional[int]:
        t = self.tuning()
        return t[what] if t else None


class _Progress:
    """Plain progress lines on stderr (CI logs): job k/N, candidates done/total, and on
    a cluster per node measured/failed; at most one per PROGRESS_EVERY_S but the last."""

    def __init__(self, job: Job, total: int, farm: Optional[ray_farm.RayFarm]):
        self.job, self.total, self.farm = job, total, farm
        self.last = 0.0

    def __call__(self, label: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        nodes = ""
        if self.farm is not None and self.farm.stats.nodes:
            nodes = "; nodes: " + ", ".join(
                f"{node} {row['measured']}/{row['failed']}"
                for node, row in sorted(self.farm.stats.nodes.items())) + " measured/failed"
        click.echo(f"farm: job {self.job.index}/{self.total}: {label}: {done}/{total} "
                   f"candidates{nodes}", err=True)


def run_jobs(jobs: list[Job], farm: Optional[ray_farm.RayFarm]) -> list[Outcome]:
    """Compile every job in order, through `farm` (None: the local tuner); a job's
    HidetcError (any error but with --debug) is its outcome, the next job runs. An
    interrupt marks the running job and raises `_Interrupted` with the outcomes."""
    outcomes = [Outcome(job) for job in jobs]
    for outcome in outcomes:
        job = outcome.job
        click.echo(f"farm: job {job.index}/{len(jobs)}: {job.name} -> {job.options['out']} "
                   f"({job.target}/{job.precision})", err=True)
        where = {key: set(nodes) for key, nodes in farm.stats.where.items()} if farm else {}
        counts = {n: dict(row) for n, row in farm.stats.nodes.items()} if farm else {}
        clock = time.perf_counter()
        try:
            api.compile_model(job.model, job.out, preset=job.preset, measure=farm,
                              progress=_Progress(job, len(jobs), farm), **job.overrides)
            outcome.status = "ok"
            outcome.manifest = read_manifest(job.out)
        except KeyboardInterrupt:
            outcome.status, outcome.error = "interrupted", "interrupted"
            outcome.seconds = time.perf_counter() - clock
            raise _Interrupted(outcomes) from None
        except HidetcError as exc:
            outcome.status, outcome.error = "failed", str(exc)
        except Exception as exc:         # a bug in one job: the others still run
            if debugging():
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            outcome.status = "failed"
            outcome.error = f"internal error: {type(exc).__name__}: {first} (--debug shows " \
                            f"the traceback)"
        outcome.seconds = time.perf_counter() - clock
        if farm is not None:
            outcome.nodes = _grown(counts, farm.stats.nodes)
            outcome.measured_on = sorted(set().union(*(
                nodes - where.get(key, set()) for key, nodes in farm.stats.where.items())))
        elif outcome.count("candidates"):
            outcome.measured_on = ["local"]
        if outcome.error:
            click.echo(f"farm: job {job.index}/{len(jobs)} failed: {outcome.error}", err=True)
    return outcomes


class _Interrupted(Exception):
    def __init__(self, outcomes: list[Outcome]):
        super().__init__("interrupted")
        self.outcomes = outcomes


def _grown(before: dict, after: dict) -> dict[str, dict[str, int]]:
    """The per-node counts added since `before`, for the nodes whose counts grew."""
    grown = {}
    for node, row in after.items():
        diff = {k: v - before.get(node, {}).get(k, 0) for k, v in row.items()}
        if any(diff.values()):
            grown[node] = diff
    return grown


# ---------------------------------------------------------------- results


def format_table(outcomes: list[Outcome], farm: bool) -> str:
    """One row per job: job, model, target/precision, status, seconds, candidates
    measured, failures, nodes (how many measured its candidates; `local` without a
    cluster)."""
    header = ("job", "model", "target/precision", "status", "seconds", "measured",
              "failures", "nodes")
    rows = [header]
    for o in outcomes:
        target = (f"{o.manifest['target']}/{o.manifest.get('precision', 'f32')}"
                  if o.manifest else f"{o.job.target}/{o.job.precision}")
        measured, failures = o.count("candidates"), o.count("failures")
        nodes = str(len(o.measured_on)) if farm else ("local" if o.measured_on else "-")
        rows.append((str(o.job.index), o.job.name, target, o.status,
                     f"{o.seconds:.1f}" if o.status != "not run" else "-",
                     "-" if measured is None else str(measured),
                     "-" if failures is None else str(failures), nodes))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def report(outcomes: list[Outcome], *, jobs_file: Path, address: Optional[str],
           records: Optional[str], farm: Optional[ray_farm.RayFarm], seconds: float) -> dict:
    """The JSON report: per job its options, status, time, tuning record, winners (per
    kernel launch: op, template, config) and the nodes that measured its candidates;
    the farm's totals."""
    from hidetc.driver.tune.records import RecordStore
    jobs = []
    for o in outcomes:
        kernels = (o.manifest or {}).get("kernels", [])
        jobs.append({
            "job": o.job.index, "model": str(o.job.model), "out": str(o.job.out),
            "options": {k: v for k, v in o.job.options.items() if k not in ("model", "out")},
            "target": o.manifest["target"] if o.manifest else o.job.target,
            "precision": o.manifest.get("precision", "f32") if o.manifest
            else o.job.precision,
            "status": o.status, "error": o.error, "seconds": round(o.seconds, 3),
            "tuning": o.tuning(),
            "winners": [{"kernel": k["name"], "node": k.get("node"), "op": k["op"],
                         "template": k.get("template"), "config": k.get("config"),
                         "source": k.get("tuning")} for k in kernels],
            "measured_on": o.measured_on,
            "nodes": o.nodes})
    totals = {"jobs": len(outcomes), "ok": sum(o.status == "ok" for o in outcomes),
              "failed": sum(o.status == "failed" for o in outcomes),
              "seconds": round(seconds, 3),
              "candidates": sum(o.count("candidates") or 0 for o in outcomes),
              "failures": sum(o.count("failures") or 0 for o in outcomes)}
    if farm is not None:
        totals["nodes"] = farm.stats.nodes
        totals["lost"] = farm.stats.lost
        totals["builds"] = farm.stats.builds
    return {"jobs_file": str(jobs_file), "cluster": address,
            "records": str(Path(records) if records else RecordStore.default_path()),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "jobs": jobs, "totals": totals}


# ---------------------------------------------------------------- the commands


class _FarmGroup(click.Group):
    """`hidetc farm JOBS.yaml ...` is `hidetc farm run JOBS.yaml ...`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("farm", cls=_FarmGroup)
def farm_group() -> None:
    """Compile many models for many targets, sharing one record store, on a Ray cluster
    (pip install 'hidetc[ray]') or locally: `hidetc farm [run] JOBS.yaml`, and `hidetc
    farm resources` on each measuring node."""


@farm_group.command("run")
@click.argument("jobs_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--cluster", "address", metavar="ADDRESS", default=None,
              help="Tune on this Ray cluster: ADDRESS as ray.init takes it (HOST:PORT of "
                   "the head node, ray://HOST:PORT through Ray Client, auto inside a Ray "
                   "job); one connection for every job (default: tune locally).")
@click.option("--records", type=click.Path(dir_okay=False), default=None,
              help="The tuning records every job shares (default: records.sqlite in the "
                   "cache dir).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write a JSON report: per job its time, candidates, "
                                 "winners and where they were measured.")
@handle_errors
def farm_run_cmd(jobs_file, address, records, report_path):
    """Compile the jobs of JOBS_FILE (YAML: `jobs:`, a list of `model: FILE.onnx, out:
    DIR` and any compile options by their names, paths relative to JOBS_FILE) one after
    another; print one table of results. A job that fails is reported and the next
    runs; exit status 1 when any failed."""
    jobs = load_jobs(jobs_file, records)
    farm = open_farm(address)
    if farm is not None:
        for job in jobs:                 # on a cluster a job tunes unless it says not
            if job.overrides["tune"] is None:
                job.overrides["tune"] = True
    clock = time.perf_counter()
    try:
        outcomes = run_jobs(jobs, farm)
        interrupted = None
    except _Interrupted as stop:
        outcomes, interrupted = stop.outcomes, stop
    click.echo(format_table(outcomes, farm is not None))
    if farm is not None:
        click.echo(farm_line(farm.stats))
    if report_path is not None:
        doc = report(outcomes, jobs_file=jobs_file, address=address, records=records,
                     farm=farm, seconds=time.perf_counter() - clock)
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(doc, indent=2, default=_jsonable) + "\n")
        click.echo(f"wrote {report_path}")
    if interrupted is not None:
        raise KeyboardInterrupt
    failed = [o for o in outcomes if o.status == "failed"]
    for o in failed:
        click.echo(f"hidetc: error: job {o.job.index}/{len(jobs)} ({o.job.name}): {o.error}",
                   err=True)
    if failed:
        sys.exit(1)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, tuple)):
        return sorted(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


@farm_group.command("resources")
@click.option("--target", "targets", type=click.Choice(["auto", "cpu", "cuda"]),
              multiple=True,
              help="The target(s) this machine measures for (default: auto = cuda when a "
                   "GPU is visible, else cpu); repeatable.")
@click.option("--cpu-isa", type=click.Choice(list(CPU_ISAS)), default=None,
              help="cpu: the ISA of the kernels measured here (default: as for compile).")
@click.option("--cpu-cores", type=click.IntRange(1), default=None,
              help="cpu: the core count of the kernels measured here (default: the cores "
                   "this process may use; must be them).")
@click.option("--gpu", default=None, help="cuda: the GPU kind (default: the visible GPU).")
@click.option("--arch", default=None, help="cuda: the architecture (default: the visible "
                                           "GPU's).")
@handle_errors
def farm_resources_cmd(targets, cpu_isa, cpu_cores, gpu, arch):
    """Print this machine's custom Ray resources, {"hidetc-machine-...": 1}, for `ray
    start --resources "$(hidetc farm resources)"` on a measuring node: the fingerprint
    of the tuning records a farm measures here for."""
    found = {}
    for target in targets or ("auto",):
        options = {"target": target, "cpu_isa": cpu_isa, "cpu_cores": cpu_cores,
                   "gpu": gpu, "arch": arch}
        cfg = make_config(None, {**environment_options(),
                                 **{k: v for k, v in options.items() if v is not None}})
        backend = backend_for(cfg.target)
        machine = backend.machine(cfg)
        if not backend.on_this_machine(machine):
            raise ConfigError(f"{backend.why_not_here(machine)}: this machine cannot "
                              f"measure for it")
        arch_key, _ = backend.record_facts(machine, True)
        found[ray_farm.machine_resource(backend.kind, arch_key)] = 1
    click.echo(json.dumps(found))
