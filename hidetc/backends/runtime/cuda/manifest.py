"""The `cuda` section of a CUDA artifact's manifest: parsing, validation, choosing the
kernel image for a GPU, and packing kernel arguments. Pure Python (no GPU, no pycuda),
so every rule here is tested on machines without a GPU.

The section (paths are relative to the artifact directory):

    cuda:
      archs: [sm_80, sm_90]              # what the cubins were compiled for
      modules:                           # one per CUDA translation unit
        - name: model
          cubins: {sm_80: kernels/sm_80/model.cubin, sm_90: kernels/sm_90/model.cubin}
          ptx: {arch: compute_90, file: kernels/model.compute_90.ptx}   # optional
      launches:                          # the forward pass, in order
        - kernel: matmul_0               # extern "C" symbol in the module
          module: model
          grid: [16, 8, 1]               # 1 to 3 dims
          block: [128, 1, 1]
          shared_bytes: 0                # dynamic shared memory
          args: [[input, 0], [weights, 4096], [arena, 0], [output, 0], [i32, 7]]
      variant_launches:                  # a dynamic artifact: the launches of each
        - [...]                          # further dispatch variant (manifest `dynamic`)

An argument is [space, index] with space input | output (index = position in the
manifest's inputs/outputs) or arena | weights (index = byte offset), as the CPU
launcher's `Arg`; or a scalar [type, value] with type i32 | u32 | i64 | u64 | f32 | f64;
or [size, k], the k-th symbolic size of the pass (the `dynamic.order`), an int64. The
mapping forms {space, index} and {type, value} are accepted too. In a dynamic artifact a
grid dimension may be an expression of the sizes ("((255 + 128*batch)//256)",
`hidetc.graph.symbolic.parse`): `LaunchSpec.at(sizes)` is the launch of one pass (grid
evaluated and checked against the limits, sizes as i64 scalars); a dimension 0 there is
an empty launch, skipped.

Guarantees: every problem is a one-line ArtifactError naming the launch (index and
kernel) or module. Arguments are packed like a C struct of the kernel's parameters
(natural alignment, pointers as 64-bit), which is the CUDA kernel-parameter ABI.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence, Union

from hidetc.errors import ArtifactError
from hidetc.graph.symbolic import Dim, SymDim, evaluate, parse

POINTER_SPACES = ("input", "output", "arena", "weights")
SIZE_SPACE = "size"        # [size, k]: the k-th symbolic size of the pass, as an int64
SCALAR_FORMATS = {"i32": "i", "u32": "I", "i64": "q", "u64": "Q", "f32": "f", "f64": "d"}
MIN_CAPABILITY = 80
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK_THREADS = 1024

_SM_RE = re.compile(r"^sm_(\d{2,3})([af]?)$")
_COMPUTE_RE = re.compile(r"^compute_(\d{2,3})([af]?)$")


@dataclass(frozen=True)
class ModuleSpec:
    name: str
    cubins: dict[str, str]                  # arch -> relative path
    ptx: Optional[tuple[str, str]] = None   # (compute_XX, relative path)


@dataclass(frozen=True)
class LaunchSpec:
    index: int
    kernel: str
    module: str
    grid: tuple[Dim, Dim, Dim]          # ints; SymDims where they depend on the sizes
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[tuple[str, Union[int, float]], ...]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def symbolic(self) -> bool:
        """Whether the launch depends on the pass's sizes (grid or size arguments)."""
        return any(isinstance(g, SymDim) for g in self.grid) or \
            any(kind == SIZE_SPACE for kind, _ in self.args)

    @property
    def empty(self) -> bool:
        """A grid with no block (a bound launch over an empty extent): not launched."""
        return any(g == 0 for g in self.grid)

    def at(self, sizes: Mapping[str, int], order: Sequence[str]) -> "LaunchSpec":
        """This launch in a pass at `sizes` (`order`: the symbols as `[size, k]` counts
        them): the grid evaluated and checked against the CUDA limits, each size
        argument an i64 scalar. A one-line ArtifactError naming the launch and sizes."""
        if not self.symbolic:
            return self
        where = ", ".join(f"{k}={v}" for k, v in sizes.items())
        grid = tuple(evaluate(g, sizes) for g in self.grid)
        if any(g < 0 for g in grid) or any(g > m for g, m in zip(grid, MAX_GRID)):
            raise ArtifactError(f"{self.describe()}: grid {list(grid)} at {where} is outside "
                                f"the CUDA limits (grid {list(MAX_GRID)})")
        args = []
        for kind, value in self.args:
            if kind == SIZE_SPACE:
                if not 0 <= int(value) < len(order):
                    raise ArtifactError(f"{self.describe()}: size argument {value} but the "
                                        f"artifact has {len(order)} symbolic sizes")
                args.append(("i64", int(sizes[order[int(value)]])))
            else:
                args.append((kind, value))
        return replace(self, grid=grid, args=tuple(args))

    def describe(self) -> str:
        return f"launch {self.index} ({self.kernel})"


@dataclass(frozen=True)
class CudaSection:
    modules: tuple[ModuleSpec, ...]
    launches: tuple[LaunchSpec, ...]
    variant_launches: tuple[tuple[LaunchSpec, ...], ...] = ()   # dispatch variants 1..

    @property
    def variants(self) -> tuple[tuple[LaunchSpec, ...], ...]:
        """The launches of every dispatch variant, the first's first."""
        return (self.launches, *self.variant_launches)


# ---------------------------------------------------------------- parsing


def _ints(value: Any, what: str, where: str) -> tuple[int, int, int]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not 1 <= len(items) <= 3 or not all(isinstance(x, int) and not isinstance(x, bool)
                                            and x > 0 for x in items):
        raise ArtifactError(f"{where}: {what} must be 1 to 3 positive integers, got {value!r}")
    items += [1] * (3 - len(items))
    return items[0], items[1], items[2]


def _grid(value: Any, where: str) -> tuple[Dim, Dim, Dim]:
    """A grid: 1 to 3 positive ints, or expressions of the sizes (a dynamic artifact)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    dims: list[Dim] = []
    for item in items:
        if isinstance(item, str):
            try:
                item = parse(item)
            except (ValueError, SyntaxError):
                raise ArtifactError(f"{where}: grid dimension {item!r} is not an expression "
                                    f"of the sizes") from None
        dims.append(item)
    if not 1 <= len(dims) <= 3 or not all(
            isinstance(d, SymDim) or (isinstance(d, int) and not isinstance(d, bool) and d > 0)
            for d in dims):
        raise ArtifactError(f"{where}: grid must be 1 to 3 positive integers or size "
                            f"expressions, got {value!r}")
    dims += [1] * (3 - len(dims))
    return dims[0], dims[1], dims[2]


def _arg(raw: Any, where: str) -> tuple[str, Union[int, float]]:
    if isinstance(raw, Mapping):
        pair = (raw.get("space", raw.get("type")), raw.get("index", raw.get("value")))
    elif isinstance(raw, (list, tuple)) and len(raw) == 2:
        pair = (raw[0], raw[1])
    else:
        raise ArtifactError(f"{where}: expected [space, index] or [type, value], got {raw!r}")
    kind, value = pair
    if kind in POINTER_SPACES or kind == SIZE_SPACE:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ArtifactError(f"{where}: {kind} index must be a non-negative integer, "
                                f"got {value!r}")
        return kind, value
    if kind in SCALAR_FORMATS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ArtifactError(f"{where}: {kind} value must be a number, got {value!r}")
        if kind[0] in "iu" and not isinstance(value, int):
            raise ArtifactError(f"{where}: {kind} value must be an integer, got {value!r}")
        return kind, value
    raise ArtifactError(f"{where}: unknown argument kind {kind!r} (expected one of "
                        f"{', '.join(POINTER_SPACES + tuple(SCALAR_FORMATS))})")


def _launch(index: int, raw: Any, modules: set[str], where: str) -> LaunchSpec:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("kernel"), str):
        raise ArtifactError(f"{where}: cuda.launches[{index}] needs a kernel name")
    at = f"{where}: launch {index} ({raw['kernel']})"
    module = raw.get("module", next(iter(modules)) if len(modules) == 1 else None)
    if module not in modules:
        raise ArtifactError(f"{at}: unknown module {module!r} (modules: "
                            f"{', '.join(sorted(modules))})")
    grid, block = _grid(raw.get("grid"), at), _ints(raw.get("block"), "block", at)
    if any(isinstance(g, int) and g > m for g, m in zip(grid, MAX_GRID)) or \
            block[0] * block[1] * block[2] > MAX_BLOCK_THREADS:
        raise ArtifactError(f"{at}: grid {list(grid)} / block {list(block)} exceed the CUDA "
                            f"limits (grid {list(MAX_GRID)}, {MAX_BLOCK_THREADS} threads)")
    shared = raw.get("shared_bytes", 0)
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise ArtifactError(f"{at}: shared_bytes must be a non-negative integer")
    args = raw.get("args", [])
    if not isinstance(args, (list, tuple)):
        raise ArtifactError(f"{at}: args must be a list")
    parsed = tuple(_arg(a, f"{at}: arg {k}") for k, a in enumerate(args))
    return LaunchSpec(index, raw["kernel"], module, grid, block, shared, parsed)


def _module(raw: Any, where: str) -> ModuleSpec:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        raise ArtifactError(f"{where}: every cuda.modules entry needs a name")
    at = f"{where}: module {raw['name']!r}"
    cubins = raw.get("cubins") or {}
    if not isinstance(cubins, Mapping) or not all(
            isinstance(k, str) and _SM_RE.match(k) and isinstance(v, str)
            for k, v in cubins.items()):
        raise ArtifactError(f"{at}: cubins must map sm_XX to a file")
    ptx = raw.get("ptx")
    if ptx is not None:
        if not (isinstance(ptx, Mapping) and isinstance(ptx.get("file"), str)
                and isinstance(ptx.get("arch"), str) and _COMPUTE_RE.match(ptx["arch"])):
            raise ArtifactError(f"{at}: ptx must be {{arch: compute_XX, file: PATH}}")
        ptx = (ptx["arch"], ptx["file"])
    if not cubins and ptx is None:
        raise ArtifactError(f"{at}: has neither cubins nor PTX")
    return ModuleSpec(raw["name"], dict(cubins), ptx)


def parse_section(manifest: Mapping[str, Any], where: str = "manifest") -> CudaSection:
    """The validated `cuda` section of `manifest`."""
    section = manifest.get("cuda")
    if not isinstance(section, Mapping):
        raise ArtifactError(f"{where}: a cuda artifact needs a 'cuda' section "
                            "(modules and launches)")
    raw_modules, raw_launches = section.get("modules"), section.get("launches")
    if not isinstance(raw_modules, list) or not raw_modules:
        raise ArtifactError(f"{where}: cuda.modules must be a non-empty list")
    if not isinstance(raw_launches, list):
        raise ArtifactError(f"{where}: cuda.launches must be a list")
    modules = tuple(_module(m, where) for m in raw_modules)
    names = {m.name for m in modules}
    if len(names) != len(modules):
        raise ArtifactError(f"{where}: cuda.modules has duplicate names")
    launches = tuple(_launch(i, raw, names, where) for i, raw in enumerate(raw_launches))
    more = section.get("variant_launches") or []
    if not isinstance(more, list) or not all(isinstance(v, list) for v in more):
        raise ArtifactError(f"{where}: cuda.variant_launches must be a list of launch lists")
    variants = tuple(tuple(_launch(i, raw, names, f"{where}: variant {k + 1}")
                           for i, raw in enumerate(v)) for k, v in enumerate(more))
    return CudaSection(modules, launches, variants)


# ---------------------------------------------------------------- choosing an image


def _capability(arch: str) -> tuple[int, str]:
    match = _SM_RE.match(arch) or _COMPUTE_RE.match(arch)
    assert match is not None, arch
    return int(match.group(1)), match.group(2)


def _available(module: ModuleSpec) -> str:
    parts = [", ".join(sorted(module.cubins, key=_capability))] if module.cubins else []
    if module.ptx:
        parts.append(f"PTX {module.ptx[0]}")
    return " and ".join(parts) or "nothing"


def select_image(module: ModuleSpec, capability: tuple[int, int],
                 gpu: str = "this GPU") -> tuple[str, str]:
    """(relative path, description) of the image to load for a GPU of `capability`:
    the cubin for its exact arch, else the newest cubin of the same major version and
    an older or equal minor (binary compatible), else the PTX if its virtual arch is not
    newer than the GPU (the driver JIT-compiles it), else a one-line ArtifactError."""
    major, minor = capability
    number = major * 10 + minor
    device_arch = f"sm_{number}"
    have = _available(module)
    if number < MIN_CAPABILITY:
        raise ArtifactError(f"artifact has {have} but {gpu} is {device_arch}, which hidetc "
                            f"does not support (the cuda target needs sm_{MIN_CAPABILITY} "
                            "or newer); use --target cpu")
    for arch in (device_arch, f"{device_arch}a"):
        if arch in module.cubins:
            return module.cubins[arch], f"cubin {arch}"
    compatible = [a for a in module.cubins if not _capability(a)[1]
                  and _capability(a)[0] // 10 == major and _capability(a)[0] <= number]
    if compatible:
        best = max(compatible, key=_capability)
        return module.cubins[best], f"cubin {best}"
    if module.ptx is not None:
        virtual, suffix = _capability(module.ptx[0])
        if virtual <= number and (not suffix or virtual == number):
            return module.ptx[1], f"PTX {module.ptx[0]} (JIT-compiled by the driver)"
    raise ArtifactError(f"artifact has {have} but {gpu} is {device_arch}; recompile with "
                        f"--arch {device_arch}")


# ---------------------------------------------------------------- arguments


def pack_args(launch: LaunchSpec, inputs: Sequence[int], outputs: Sequence[int],
              arena: tuple[int, int], weights: tuple[int, int]) -> bytes:
    """The kernel-parameter buffer of `launch`: device pointers resolved against the
    input/output buffer addresses and the (base, size) of the arena and weights."""
    fmt, values = "@", []
    if launch.symbolic and any(isinstance(g, SymDim) for g in launch.grid):
        raise ArtifactError(f"{launch.describe()}: its grid depends on the sizes: pack the "
                            f"launch of one pass (LaunchSpec.at)")
    for k, (kind, value) in enumerate(launch.args):
        if kind == SIZE_SPACE:
            raise ArtifactError(f"{launch.describe()}: arg {k} is a symbolic size: pack the "
                                f"launch of one pass (LaunchSpec.at)")
        if kind in SCALAR_FORMATS:
            fmt += SCALAR_FORMATS[kind]
            values.append(value)
            continue
        fmt += "Q"
        values.append(_pointer(launch, k, kind, int(value), inputs, outputs, arena, weights))
    try:
        return struct.pack(fmt, *values)
    except struct.error as exc:
        raise ArtifactError(f"{launch.describe()}: cannot pack its arguments ({exc})") from None


def _pointer(launch: LaunchSpec, k: int, space: str, index: int, inputs: Sequence[int],
             outputs: Sequence[int], arena: tuple[int, int],
             weights: tuple[int, int]) -> int:
    if space in ("input", "output"):
        table = inputs if space == "input" else outputs
        if index >= len(table):
            raise ArtifactError(f"{launch.describe()}: arg {k} is {space} {index} but the "
                                f"model has {len(table)} {space}s")
        return table[index]
    base, size = arena if space == "arena" else weights
    if index >= max(size, 1):
        raise ArtifactError(f"{launch.describe()}: arg {k} points past the {space} "
                            f"(offset {index} of {size} bytes)")
    return base + index
