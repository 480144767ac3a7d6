"""`hidetc compile`: the command, its option parsing (`compile_overrides`: the
`compile_model` overrides of the command's parameters, what `hidetc farm` reuses for
each job) and the lines it prints.

`--cluster ADDRESS` tunes through a `RayFarm` (`hidetc.driver.tune.ray_farm`): the
candidates are built on any node of the Ray cluster and measured on nodes of the
target's machine kind; tuning is then on (`--no-tune` with it is an error) and the
command prints the farm's per-node counts after the compile.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

import click

from hidetc.driver import api
from hidetc.driver.config import CPU_ISAS, LAYOUTS, PRECISIONS
from hidetc.driver.tune import ray_farm
from hidetc.errors import ConfigError
from hidetc.graph.dims import parse_opt_shape, parse_shape, parse_size, parse_sizes
from hidetc.tools.cli_errors import handle_errors


@click.command("compile")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Artifact directory to write.")
@click.option("--target", type=click.Choice(["auto", "cpu", "cuda"]), default=None,
              help="Target device (default: auto = cuda when a GPU is visible, else cpu).")
@click.option("--precision", type=click.Choice(list(PRECISIONS)), default=None,
              help="f32 (default), or f16: float16 storage and tensor cores, float32 "
                   "accumulation (cuda target only; verified at 1e-2); bf16 (verified at "
                   "2e-2): on cuda bfloat16 storage and tensor cores, float32 "
                   "accumulation; on the cpu (needs AVX512_BF16) the GEMMs' operands in "
                   "bf16, float32 tensors.")
@click.option("--arch", default=None,
              help="cuda: architectures, e.g. sm_80,sm_90 (default: the visible GPU, else sm_90).")
@click.option("--gpu", default=None,
              help="cuda: compile for this GPU's limits (a100, a10, l4, l40s, rtx4090, "
                   "h100-pcie, h100-sxm, h200); default: the visible GPU, else --arch's.")
@click.option("--cpu-isa", type=click.Choice(list(CPU_ISAS)), default=None,
              help="cpu: the vector ISA of the kernels (default: $HIDETC_CPU_ISA, else "
                   "AVX-512 where the host has it, else AVX2); avx512_bf16: AVX-512 on a "
                   "CPU with AVX512_BF16 (what --precision bf16 needs); amx_bf16: and "
                   "AMX-BF16 (bf16 GEMMs on AMX tiles); the int8 GEMMs of quantized "
                   "models: avx2_vnni (AVX-VNNI), avx512_vnni, amx_int8 (AMX-INT8 tiles; "
                   "with neither, exact AVX2).")
@click.option("--cpu-cores", type=click.IntRange(1), default=None,
              help="cpu: shape the parallel loops for this many cores (a cross-compile "
                   "for another machine; default: the cores this process may use).")
@click.option("--config", "preset", default=None,
              help="A preset in configs/ (by name) or a YAML file.")
@click.option("--sample", type=click.Path(), default=None,
              help="Verify with this .npy/.npz input instead of a seeded random one.")
@click.option("--no-verify", is_flag=True, help="Skip verification against ONNX Runtime.")
@click.option("--no-fuse", is_flag=True,
              help="One kernel per graph node (no prologue/epilogue fusion).")
@click.option("--tune/--no-tune", default=None,
              help="Measure the anchors' schedule candidates on this machine's device "
                   "(default: when the target's device is here).")
@click.option("--space", type=click.IntRange(0, 2), default=None,
              help="Candidates per anchor: 0 the default config, 1 a short list, 2 the "
                   "whole space (default: 2 on cuda, 1 on cpu).")
@click.option("--records", type=click.Path(dir_okay=False), default=None,
              help="The tuning records file (default: records.sqlite in the cache dir).")
@click.option("--layout", type=click.Choice(list(LAYOUTS)), default=None,
              help="auto (default): the target's layout pass (cpu: NHWC convolutions "
                   "with C/G >= 8); nchw: keep the model's NCHW convolutions.")
@click.option("--seed", type=int, default=None, help="Seed of the random verification input.")
@click.option("--shape", "shape_args", multiple=True, metavar="NAME=1x1..512",
              help="Bind the shape of input NAME: per dimension a size or a range of "
                   "sizes (needed where the model leaves a dim symbolic or unknown); "
                   "repeatable.")
@click.option("--dim", "dim_args", multiple=True, metavar="NAME=1..512",
              help="Bind the model's named dimension NAME (every input using it) to a "
                   "size or a range of sizes; repeatable.")
@click.option("--shape-opt", "shape_opt_args", multiple=True, metavar="NAME=1x128",
              help="A shape of input NAME to tune at; repeatable.")
@click.option("--dim-opt", "dim_opt_args", multiple=True, metavar="NAME=16,64,128",
              help="Sizes of the named dimension NAME to tune at (default: a few sizes "
                   "spread over its range); repeatable.")
@click.option("--cluster", metavar="ADDRESS", default=None,
              help="Tune on this Ray cluster (pip install 'hidetc[ray]'): ADDRESS as "
                   "ray.init takes it (HOST:PORT of the head node, ray://HOST:PORT "
                   "through Ray Client, auto inside a Ray job); candidates are built on "
                   "any node and measured on the nodes of the target's machine kind "
                   "(`hidetc farm resources`). Tuning is on.")
@handle_errors
def compile_cmd(**params):
    """Compile MODEL (.onnx) into the artifact directory OUT."""
    model, out_dir = params["model"], params["out_dir"]
    overrides = compile_overrides(params)
    if params["cluster"] is not None:
        if params["tune"] is False:
            raise ConfigError("--cluster tunes on the cluster: drop --no-tune or --cluster")
        overrides["tune"] = True
    farm = open_farm(params["cluster"])
    with _TuneProgress() as progress:
        result = api.compile_model(model, out_dir, preset=params["preset"], progress=progress,
                                   measure=farm, **overrides)
    m = result.manifest
    t = result.timings
    click.echo(f"compiled {model} -> {out_dir} (target {m['target']}, "
               f"precision {m.get('precision', 'f32')}, "
               f"{len(m['kernels'])} kernel launches, "
               f"{len({k['name'] for k in m['kernels']})} distinct kernels)")
    if m.get("machine"):
        click.echo(f"  for: {_machine_line(m['machine'])}")
    if m.get("dynamic"):
        d = m["dynamic"]
        ranges = ", ".join(f"{k} {r['min']}..{r['max']}" for k, r in d["symbols"].items())
        click.echo(f"  sizes: {ranges} ({len(d['variants'])} dispatch variant"
                   f"{'s' if len(d['variants']) != 1 else ''})")
    click.echo(f"  time: frontend+plan {t['frontend_s']:.1f}s, tune {t.get('tune_s', 0):.1f}s, "
               f"build {t['build_s']:.1f}s, verify {t['verify_s']:.1f}s")
    if m.get("tuning"):
        click.echo(_tuning_line(m["tuning"], t.get("tune_s", 0.0)))
    if farm is not None:
        click.echo("  " + farm_line(farm.stats))
    click.echo("  " + _verification_line(m["verification"]))


def compile_overrides(params: dict[str, Any]) -> dict[str, Any]:
    """The `compile_model` overrides of the compile command's parameters (click's
    `ctx.params`: MODEL, OUT, --config and --cluster are not among them); a malformed
    --shape, --dim, --shape-opt or --dim-opt is a ConfigError."""
    p = params
    return {"target": p["target"], "precision": p["precision"], "arch": p["arch"],
            "sample": p["sample"], "gpu": p["gpu"], "cpu_cores": p["cpu_cores"],
            "cpu_isa": p["cpu_isa"], "seed": p["seed"],
            "verify": False if p["no_verify"] else None,
            "fuse": False if p["no_fuse"] else None, "tune": p["tune"], "space": p["space"],
            "records": p["records"], "layout": p["layout"],
            "shapes": parse_shapes(p["shape_args"]),
            "dims": named_args("--dim", p["dim_args"], "NAME=1..512", parse_size, str),
            "shape_opts": _parse_shape_opts(p["shape_opt_args"]),
            "dim_opts": named_args("--dim-opt", p["dim_opt_args"], "NAME=16,64,128",
                                    parse_sizes, list)}


def open_farm(address: Optional[str], on_event: Optional[Callable[[str], None]] = None
              ) -> Optional[ray_farm.RayFarm]:
    """--cluster ADDRESS: a RayFarm connected to the cluster now (a missing Ray or an
    unreachable cluster is a one-line ConfigError before any compile); None without an
    address."""
    if address is None:
        return None
    ray_farm.connect(address)
    return ray_farm.RayFarm(address, on_event=on_event or _farm_event)


def _farm_event(text: str) -> None:
    click.echo(f"hidetc: farm: {text}", err=True)


def farm_line(stats: ray_farm.FarmStats) -> str:
    """What the farm did, in one line: per node the candidates measured and failed and
    the chunks, and the chunks re-sent after losing their node."""
    if not stats.nodes:
        return "farm: nothing measured on the cluster (every candidate from the records)"
    count = len(stats.nodes)
    nodes = "; ".join(f"{node} {row['measured']} measured, {row['failed']} failed "
                      f"({row['chunks']} chunks)" for node, row in sorted(stats.nodes.items()))
    lost = f"; {stats.lost} chunks re-sent after losing their node" if stats.lost else ""
    return f"farm: {count} measuring node{'s' if count != 1 else ''}: {nodes}{lost}"


def _machine_line(facts: dict) -> str:
    """The manifest's `machine` record in a few words."""
    if facts.get("kind") == "cpu":
        return (f"cpu {facts['isa']}, {facts['cores']} cores, L2 {facts['l2_bytes'] // 1024} "
                f"KiB per core")
    return (f"{facts.get('name')} ({facts.get('arch')}, {facts.get('sms')} SMs, "
            f"{facts.get('shared_optin_bytes', 0) // 1024} KiB shared memory per block)")


def _split(flag: str, arg: str, form: str) -> tuple[str, str]:
    name, sep, value = arg.rpartition("=")
    if not sep or not name or not value:
        raise ConfigError(f"{flag} {arg!r}: expected {form}")
    return name, value


def parse_shapes(args: tuple[str, ...]) -> dict[str, list[int | str]] | None:
    """--shape NAME=1x3x224x224 (or NAME=1,3,224,224; a dim may be a range 1..512),
    repeatable -> {name: dims}."""
    shapes: dict[str, list[int | str]] = {}
    form = "NAME=D0xD1x... with positive dims or ranges, e.g. input=1x3x224x224 or ids=1x1..512"
    for arg in args:
        name, dims = _split("--shape", arg, form)
        try:
            ranges = parse_shape(dims)
        except ValueError:
            raise ConfigError(f"--shape {arg!r}: expected {form}") from None
        if name in shapes:
            raise ConfigError(f"--shape: input {name!r} is given twice")
        shapes[name] = [r.lo if r.fixed else str(r) for r in ranges]
    return shapes or None


def _parse_shape_opts(args: tuple[str, ...]) -> dict[str, list[list[int]]] | None:
    """--shape-opt NAME=1x128, repeatable (several per input) -> {name: [shapes]}."""
    opts: dict[str, list[list[int]]] = {}
    for arg in args:
        name, dims = _split("--shape-opt", arg, "NAME=D0xD1x..., e.g. ids=1x128")
        try:
            opts.setdefault(name, []).append(parse_opt_shape(dims))
        except ValueError as error:
            raise ConfigError(f"--shape-opt {arg!r}: {error}") from None
    return opts or None


def named_args(flag: str, args: tuple[str, ...], form: str, parse, keep) -> dict | None:
    """FLAG NAME=VALUE, repeatable, once per name -> {name: keep(parse(VALUE))}."""
    found: dict = {}
    for arg in args:
        name, value = _split(flag, arg, form)
        try:
            parsed = parse(value)
        except ValueError as error:
            raise ConfigError(f"{flag} {arg!r}: {error}") from None
        if name in found:
            raise ConfigError(f"{flag}: {name!r} is given twice")
        found[name] = keep(parsed)
    return found or None


class _TuneProgress:
    """A click progress bar over the tuning candidates, opened at the first report
    (nothing is drawn when everything comes from the records)."""

    def __init__(self):
        self.bar = None
        self.done = 0

    def __enter__(self):
        return self

    def __call__(self, label: str, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = click.progressbar(length=total, label="tuning", show_eta=True,
                                         show_pos=True, file=sys.stderr)
            self.bar.__enter__()
        self.bar.label = f"tuning {label}"
        self.bar.update(done - self.done)
        self.done = done

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


def _tuning_line(t: dict, seconds: float) -> str:
    if "tasks" not in t:
        return f"  tuning: off ({t.get('reason', 'defaults')})"
    mode = f"space {t['space']}" if t.get("enabled") else "off (defaults and records)"
    failed = f", {t['failures']} dropped" if t.get("failures") else ""
    return (f"  tuning: {mode}; {t['tasks']} anchor signatures, {t['from_records']} from "
            f"records, {t['tuned']} tuned ({t['candidates']} candidates{failed}) in "
            f"{seconds:.1f}s")


def _verification_line(v: dict) -> str:
    if v.get("status") != "passed":
        reason = f" ({v['reason']})" if v.get("reason") else ""
        return f"verification: {v.get('status')}{reason}"
    # the output nearest its own bound (each output's bound follows its path's precision)
    errs = [(o["rel_error"], o.get("tolerance", v["tolerance"]))
            for o in v["outputs"].values() if "rel_error" in o]
    error, bound = max(errs, key=lambda e: e[0] / e[1], default=(None, v["tolerance"]))
    worst = f", max relative error {error:.2e}" if error is not None else ""
    sizes = f" at {len(v['sizes'])} sizes of the ranges" if v.get("sizes") else ""
    return f"verification: passed against {v['reference']}{sizes} ({v['sample']}{worst}, " \
           f"tolerance {bound})"
