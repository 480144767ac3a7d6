"""One frozen `CompileConfig`: defaults, overlaid by a YAML preset (configs/NAME.yaml or a
path), overlaid by explicit overrides (the CLI's options). Unknown keys and bad values
are `ConfigError`s naming the file and key."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

import yaml

from hidetc.errors import ConfigError

TARGETS = ("auto", "cpu", "cuda")
PRECISIONS = ("f32",)
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclass(frozen=True)
class CompileConfig:
    target: str = "auto"
    precision: str = "f32"
    verify: bool = True
    rtol: float = 1e-4            # norm-wise relative error bound for f32 outputs
    seed: int = 0                 # seed of the random verification input
    sample: str | None = None     # a .npy/.npz input to verify with instead
    dump_dir: str | None = None   # HIDETC_DUMP: IR after each pass, generated sources
    verify_ir: bool = False       # run the graph and TIR verifiers between passes
    threads: int = 0              # OpenMP threads at run time; 0 = all cores
    arch: str | None = None       # cuda: "sm_80,sm_90"; default: the visible GPU, else sm_90

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ConfigError(f"target: expected one of {', '.join(TARGETS)}, got {self.target!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision: expected one of {', '.join(PRECISIONS)}, "
                              f"got {self.precision!r}")
        if not self.rtol > 0:
            raise ConfigError(f"rtol: expected a positive number, got {self.rtol!r}")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
