"""One frozen `CompileConfig`: defaults, overlaid by a YAML preset (configs/NAME.yaml or a
path), overlaid by explicit overrides (the CLI's options). Unknown keys and bad values
are `ConfigError`s naming the file and key.

Precision: "f32" computes everything in float32; "f16" stores the model's float32
tensors as float16 (weights and activations; tensor cores for MatMul) with float32
accumulation and float32 for the numerically sensitive reductions, cuda target only;
"bf16" on cuda does the same in bfloat16, on the cpu it computes the GEMM anchors with
bfloat16 operands (the tensors stay float32).
The verification tolerance (`rtol`) defaults per precision (`TOLERANCES`); an explicit
`rtol` wins. `CompileConfig.tolerance` is the effective bound.

The tolerance is spent as a budget: the tuner drops a candidate whose own error (vs
the op's reference in float64, on the task's real shapes) is over its kernel's share,
tolerance / (2 sqrt(kernels)) (`hidetc.driver.tune.search.numerics_budget`: errors
taken to add in quadrature, half the tolerance left for their growth through the
layers; ResNet-50 f32: 1e-4 / (2 sqrt(73)) = 5.9e-6 per kernel); and when the compiled
model still misses the tolerance, the kernels that diverge are rebuilt with
exact-order configs before the compile gives up (`hidetc.driver.recover`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from numbers import Integral
from pathlib import Path
from typing import Any, Mapping

import yaml

from hidetc.errors import ConfigError
from hidetc.graph.dims import parse_size

TARGETS = ("auto", "cpu", "cuda")
PRECISIONS = ("f32", "f16", "bf16")
LAYOUTS = ("auto", "nchw")
CPU_ISAS = ("avx2", "avx512", "avx512_bf16", "amx_bf16", "avx2_vnni", "avx512_vnni",
            "amx_int8")    # cpu_isa.NAMED: ISAs, and with features
# norm-wise relative error bound vs ONNX Runtime (f32), per precision, when `rtol` is
# unset; each kernel gets a share of it (the module docstring)
TOLERANCES = {"f32": 1e-4, "f16": 1e-2, "bf16": 2e-2}   # bf16: 8 mantissa bits
# the bound of an output computed from a value of a narrower float type (the model's own
# precision: a Cast to float16 inside an f32 model, float16 inputs, weights or outputs;
# `hidetc.driver.verify.output_tolerances`): float16 and bfloat16 the f16 precision's
# bound, the 8- and 4-bit floats twice their unit roundoff (2^-mantissa bits), and the
# exponent-only float8_e8m0fnu 0.5 (a bound of 1 would pass an output of zeros)
TYPE_TOLERANCES = {"float16": TOLERANCES["f16"], "bfloat16": TOLERANCES["f16"],
                   "float8_e4m3fn": 2.0 ** -3, "float8_e4m3fnuz": 2.0 ** -3,
                   "float8_e5m2": 2.0 ** -2, "float8_e5m2fnuz": 2.0 ** -2,
                   "float4_e2m1fn": 2.0 ** -1, "float8_e8m0fnu": 2.0 ** -1}
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


@dataclass(frozen=True)
class CompileConfig:
    target: str = "auto"
    precision: str = "f32"
    verify: bool = True
    rtol: float | None = None     # norm-wise relative error bound; None: TOLERANCES[precision]
    seed: int = 0                 # seed of the random verification input
    sample: str | None = None     # a .npy/.npz input to verify with instead
    dump_dir: str | None = None   # IR after each pass, generated sources (the API boundary
                                  # takes it from HIDETC_DUMP)
    verify_ir: bool = False       # run the graph and TIR verifiers between passes
    threads: int = 0              # OpenMP threads at run time; 0 = all cores
    arch: str | None = None       # cuda: "sm_80,sm_90"; default: the visible GPU, else sm_90
    gpu: str | None = None        # cuda: a known GPU to compile for (hidetc.target.KNOWN_GPUS)
    cpu_cores: int | None = None  # cpu: the cores to shape the kernels for (default: this
                                  # process's usable cores)
    cpu_isa: str | None = None    # cpu: avx2 | avx512 (default: the host's best; the API
                                  # boundary takes it from HIDETC_CPU_ISA)
    fuse: bool = True             # post-scheduling fusion (False: one kernel per node)
    tune: bool | None = None      # None: tune when the target's device is here (the API
                                  # boundary: False under HIDETC_TUNE=0)
    space: int | None = None      # 0: default config, 1: short list, 2: whole space;
                                  # None: the target backend's default
    records: str | None = None    # the tuning records file (default: in the cache dir)
    layout: str = "auto"          # "nchw": keep the model's NCHW convolutions
    shapes: dict[str, list[int | str]] | None = None  # input name -> per dim a size or a
                                  # range "1..512", binding the inputs whose dims are
                                  # symbolic or unknown in the ONNX file
    dims: dict[str, int | str] | None = None   # the file's named dims -> a size or range
    shape_opts: dict[str, list[list[int]]] | None = None   # input -> shapes to tune at
    dim_opts: dict[str, list[int]] | None = None           # named dim -> sizes to tune at
    graph_cache: int = 8          # cuda, ranges: shapes each context keeps captured (a
                                  # CUDA graph each; least recently used ones go)
    keep_f32: tuple[str, ...] = ()  # bf16: nodes (of the lowered graph) computed in f32

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ConfigError(f"target: expected one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision: expected one of {', '.join(PRECISIONS)}, "
                              f"got {self.precision!r}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout: expected one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.rtol is not None and not (isinstance(self.rtol, (int, float))
                                          and not isinstance(self.rtol, bool) and self.rtol > 0):
            raise ConfigError(f"rtol: expected a positive number, got {self.rtol!r}")
        if self.cpu_cores is not None and not (isinstance(self.cpu_cores, Integral)
                                               and not isinstance(self.cpu_cores, bool)
                                               and self.cpu_cores >= 1):
            raise ConfigError(f"cpu_cores: expected a positive integer, got {self.cpu_cores!r}")
        if self.cpu_isa is not None and self.cpu_isa not in CPU_ISAS:
            raise ConfigError(f"cpu_isa: expected one of {', '.join(CPU_ISAS)}, "
                              f"got {self.cpu_isa!r}")
        if not (isinstance(self.graph_cache, Integral) and not isinstance(self.graph_cache, bool)
                and self.graph_cache >= 1):
            raise ConfigError(f"graph_cache: expected a positive integer, got "
                              f"{self.graph_cache!r}")
        if self.space is not None and self.space not in (0, 1, 2):
            raise ConfigError(f"space: expected 0, 1 or 2, got {self.space!r}")
        if isinstance(self.keep_f32, str) or not all(
                isinstance(n, str) for n in self.keep_f32):
            raise ConfigError(f"keep_f32: expected a list of node names, got {self.keep_f32!r}")
        object.__setattr__(self, "keep_f32", tuple(self.keep_f32))
        for key, check in (("shapes", _check_shapes), ("dims", _check_dims),
                           ("shape_opts", _check_shape_opts), ("dim_opts", _check_dim_opts)):
            if getattr(self, key) is not None:
                object.__setattr__(self, key, check(getattr(self, key)))

    @property
    def tolerance(self) -> float:
        """The verification bound: `rtol` when given, else the precision's default."""
        return float(self.rtol) if self.rtol is not None else TOLERANCES[self.precision]

    @property
    def bindings(self) -> dict[str, Any]:
        """The input bindings as `load_model` takes them."""
        return {"shapes": self.shapes, "dims": self.dims, "shape_opts": self.shape_opts,
                "dim_opts": self.dim_opts}

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _names(key: str, value: Any, what: str) -> Mapping:
    if not isinstance(value, Mapping) or not all(isinstance(n, str) and n for n in value):
        raise ConfigError(f"{key}: expected a mapping of {what}, got {value!r}")
    return value


def _size(key: str, name: str, value: Any) -> int | str:
    """A positive int, or the text of a size range "lo..hi" (kept as text)."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        text = str(int(value))
    elif isinstance(value, str):
        text = value
    else:
        raise ConfigError(f"{key}: {name!r}: expected a positive size or a range like "
                          f"1..512, got {value!r}")
    try:
        rng = parse_size(text)
    except ValueError as error:
        raise ConfigError(f"{key}: {name!r}: {error}") from None
    return rng.lo if rng.fixed and "." not in text else str(rng)


def _positive_ints(key: str, name: str, values: Any) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or \
            not values or not all(isinstance(d, Integral) and not isinstance(d, bool)
                                  and d > 0 for d in values):
        raise ConfigError(f"{key}: {name!r}: expected a list of positive ints, got {values!r}")
    return [int(d) for d in values]


def _check_shapes(shapes: Any) -> dict[str, list[int | str]]:
    """`shapes` as {name: [a positive int or a range "lo..hi" per dim]}; ConfigError
    naming the bad entry."""
    checked = {}
    for name, dims in _names("shapes", shapes, "input name: [dims]").items():
        if isinstance(dims, (str, bytes)) or not isinstance(dims, (list, tuple)):
            raise ConfigError(f"shapes: input {name!r}: expected a list of positive ints "
                              f"or ranges like 1..512, got {dims!r}")
        checked[name] = [_size("shapes", name, d) for d in dims]
    return checked


def _check_dims(dims: Any) -> dict[str, int | str]:
    return {name: _size("dims", name, value)
            for name, value in _names("dims", dims, "dimension name: size or range").items()}


def _check_shape_opts(opts: Any) -> dict[str, list[list[int]]]:
    checked = {}
    for name, shapes in _names("shape_opts", opts, "input name: [shapes]").items():
        if not isinstance(shapes, (list, tuple)) or not shapes:
            raise ConfigError(f"shape_opts: {name!r}: expected a list of shapes, got {shapes!r}")
        checked[name] = [_positive_ints("shape_opts", name, s) for s in shapes]
    return checked


def _check_dim_opts(opts: Any) -> dict[str, list[int]]:
    return {name: _positive_ints("dim_opts", name, sizes)
            for name, sizes in _names("dim_opts", opts, "dimension name: [sizes]").items()}


def bf16_needs(where: str, has: str) -> str:
    """The one line for a bf16 compile whose cpu lacks AVX512_BF16: `where` says which
    cpu, `has` what it has."""
    return (f"--precision bf16 needs AVX512_BF16 (vdpbf16ps), which {where} lacks (it has "
            f"{has}): use --precision f32, or --cpu-isa avx512_bf16 to cross-compile for a "
            f"CPU with it")


def f16_needs_cuda(note: str = "") -> str:
    return (f"f16 precision needs the cuda target{note} (the cpu target computes in f32 "
            f"only); use --target cuda (it cross-compiles without a GPU) or --precision f32")


def _resolve(preset: str) -> Path:
    path = Path(preset)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return CONFIG_DIR / f"{preset}.yaml"


def load_preset(preset: str) -> dict[str, Any]:
    path = _resolve(preset)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of option: value")
    known = {f.name for f in fields(CompileConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown option(s) {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(known))})")
    return data


def make_config(preset: str | None = None, overrides: Mapping[str, Any] | None = None
                ) -> CompileConfig:
    values: dict[str, Any] = load_preset(preset) if preset else {}
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return CompileConfig(**values)
    except TypeError as exc:
        raise ConfigError(str(exc)) from None
