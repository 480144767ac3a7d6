"""Run a CUDA artifact on the CPU with the emulator: the artifact's own CUDA sources
(kernels/src/*.cu) are compiled with the emulation header (cached by content), and the
manifest's launches run one after another on numpy buffers (arena, weights, inputs,
outputs), exactly as the CUDA runtime would run them on a GPU.

For tests and debugging on machines without a GPU: every thread of every block runs as
a fiber, so this is slow; use it on the tiny models.

`sanitize=True` (`hidetc run --emulate --sanitize`) runs each pass twice and reports
hazards (`SanitizerError`, one line each, naming the kernel):
- the arena starts poisoned (all bits set: NaN in floats) but for the region the
  kernels keep zero (split-K's counters, `scratch.ZEROED_REGION`), and every
  float output element starts as a sentinel NaN: one still holding it after the pass
  was never written ("never wrote N elements of output O"); one holding poison's bits
  (all set: arithmetic passes a NaN's payload on) was computed from memory never
  written -- shared memory and local arrays start as poison in the emulator too; so
  does every float arena value holding poison after the pass (the manifest's
  `memory.dtypes`), named with the kernels that write it (unless the inputs or float
  weights hold poison's bits themselves: then it cannot be told from data);
- every arena value gets a region of its own between red zones (from the manifest's
  `memory.offsets` and `memory.bytes`; the launches' arguments are remapped to them),
  and so does every output, input and weight: a launch that writes into a red zone is
  reported ("wrote N bytes past the end of V"); reads there read poison, which shows
  in the results (below);
- the second pass runs every launch with its blocks and threads in reverse order
  (`EmulatedModule.launch(reverse=True)`): the arena and outputs after each launch must
  be the same bits as in the first pass, else "the result depends on the order of
  blocks or threads" names the first launch that differs;
- the first pass checks shared memory for races (`EmulatedModule.launch(races=True)`:
  one warp's load of bytes another warp stored, or a store to bytes another loaded, in
  the same barrier interval);
- the emulator itself already lands cp.async only at its thread's wait and starts each
  block with poisoned shared memory, so a missing wait or barrier shows as NaN.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

import numpy as np

from hidetc.backends.runtime.contexts import Executor
from hidetc.backends.runtime.cuda.manifest import SCALAR_FORMATS, LaunchSpec, parse_section
from hidetc.backends.runtime.emulator.emulator import (
    EmulatedModule,
    EmulatorError,
    build_emulated,
)
from hidetc.backends.runtime.executor import check_inputs, collect_outputs, value_bytes
from hidetc.backends.runtime.sizes import (
    Pass,
    kept_zero,
    read_dynamic,
    variant_view,
    zero_inputs,
)
from hidetc.backends.runtime.weights import WeightEntry, read_weights
from hidetc.errors import ArtifactError
from hidetc.tir import scratch

# float outputs start as this NaN (a payload no arithmetic produces): still there after
# a pass, an element was never written
SENTINEL = {np.dtype(np.float32): np.uint32(0x7FC0DEAD), np.dtype(np.float16): np.uint16(0x7EAD),
            np.dtype("bfloat16"): np.uint16(0x7FED),
            np.dtype(np.float64): np.uint64(0x7FF80000DEADBEEF)}
RED_ZONE = 256       # poisoned bytes before and after every value in a sanitized pass
# pooled contexts of an emulated model: the emulator runs one launch at a time, so more
# passes in flight only interleave (each context is one arena)
CONTEXTS = 4


class SanitizerError(ArtifactError):
    """Hazards a sanitized pass found: `hazards` holds one line each."""

    def __init__(self, hazards: list[str]):
        super().__init__("; ".join(hazards))
        self.hazards = hazards


def _detail(exc: Exception) -> str:
    """An emulator error's message without its `kernel<<<...>>>: ` prefix."""
    text = str(exc)
    return text.split(">>>: ", 1)[1] if ">>>: " in text else text


class EmulatedCudaExecutor(Executor):
    """A cuda artifact loaded into the emulator: the compiled module, the weights (and a
    sanitized pass's layout: each arena value, output, input and weight between red
    zones) shared by every pass; each pass runs on an `EmulatedContext` of its own (its
    arena; `runtime.contexts`). The emulator runs one launch at a time in the process, so
    concurrent passes interleave launch by launch, each on its own memory."""

    def __init__(self, path: Path, manifest: dict, sanitize: bool = False,
                 max_contexts: Optional[int] = None):
        self.manifest = manifest
        self.sanitize = sanitize
        self.section = parse_section(manifest, str(path / "manifest.yaml"))
        self.dynamic = read_dynamic(manifest)
        sources = {p.stem: p.read_text() for p in sorted((path / "kernels" / "src").glob("*.cu"))}
        self.module = EmulatedModule(build_emulated(sources))
        weights = manifest["weights"]
        entries = {k: WeightEntry(**v) for k, v in weights["entries"].items()}
        blob, self.constants = read_weights(path / weights["file"], entries, mmap=False)
        self._weights = blob
        self.arena_bytes = max(int(manifest["memory"]["arena_bytes"]), 64)
        # per dispatch variant: its kernels and arena layout as the manifest gives them
        # (`views`), and when sanitizing, each arena value's region (`layouts`)
        self.views = [variant_view(manifest, k) for k in range(len(self.section.variants))]
        self.layouts: list[Optional[Layout]] = [None] * len(self.views)
        self._spaced_weights: Optional[np.ndarray] = None   # sanitize: weights spaced out
        self._weight_at: dict[int, int] = {}                # offset -> its spaced offset
        self._weights_poison = False     # sanitize: a float weight holds poison's bits
        if sanitize:
            self.layouts = [self._space_values(view, launches)
                            for view, launches in zip(self.views, self.section.variants)]
            self._space_weights()
            self._weights_poison = self._weights_hold_poison()
        self.uses_graph = False
        self.graph_unavailable: Optional[str] = "emulated: launches run one by one on the CPU"
        self._init_pool(max_contexts or CONTEXTS, 1)

    def new_context(self, threads: int) -> "EmulatedContext":
        return EmulatedContext(self, threads)

    def sizes_exact(self, one: Pass) -> bool:
        """Whether the manifest's value sizes (`memory.bytes`) are this pass's: a static
        artifact's, or a static build's (the first variant's, when built for one size);
        a variant over a range plans each value at the range's largest size."""
        if self.dynamic is None:
            return True
        return one.variant == 0 and bool(self.manifest["dynamic"]["variants"][0].get("static"))

    def bound_pass(self, inputs: Mapping[str, np.ndarray]
                   ) -> tuple[Pass, tuple[LaunchSpec, ...]]:
        """The pass `inputs` make (`pass_of`) and its launches bound at its sizes
        (`LaunchSpec.at`)."""
        one = self.pass_of(inputs)
        launches = self.section.variants[one.variant]
        if self.dynamic is not None:
            launches = tuple(launch.at(one.sizes, self.dynamic.order) for launch in launches)
        return one, launches

    def run_with_hook(self, inputs: Mapping[str, np.ndarray],
                      hook: Callable[[str, int, Callable], None]) -> dict[str, np.ndarray]:
        """One pass (its memory poisoned as a sanitized pass's) with `hook` around each
        launch (see `EmulatedContext.forward`): what a per-kernel comparison drives."""
        return self.pooled("run_with_hook", inputs, hook)

    def measure(self, repeat: int = 3, warmup: int = 0) -> list[float]:
        """Wall milliseconds of `repeat` emulated passes on a context's last inputs (a
        single-threaded caller's: those of its last `run`; zeros before any): the
        CudaExecutor call, for code that times artifacts, with the CPU's emulation time in
        place of the GPU's."""
        return self.pooled("measure", repeat, warmup)

    def profile(self, inputs: Mapping[str, np.ndarray], repeat: int = 1) -> list[float]:
        """Per launch, the median emulated wall milliseconds over `repeat` passes: the
        CPU's time to emulate it (for exercising profiling code without a GPU, not a
        prediction of the GPU's time)."""
        return self.pooled("profile", inputs, repeat)

    # sanitizing: the layout ------------------------------------------------------
    def _space_values(self, view: Optional[dict], launches) -> Optional["Layout"]:
        """Every arena value of a variant (`view`: its kernels and memory) in a region of
        its own between red zones, when the manifest says each value's size and every
        launch argument's value; None otherwise (the planned offsets are used)."""
        if view is None:
            return None
        memory = view["memory"]
        sizes, kernels = memory.get("bytes"), view.get("kernels", [])
        if not sizes or len(kernels) != len(launches):
            return None
        pos, spaced, regions = RED_ZONE, {}, []
        for value in sorted(memory["offsets"]):
            if value not in sizes:
                return None
            spaced[value] = pos
            regions.append((value, pos, pos + int(sizes[value])))
            pos += -(-int(sizes[value]) // 64) * 64 + RED_ZONE
        self.arena_bytes = max(pos, self.arena_bytes)
        return Layout(spaced, regions)

    def _space_weights(self) -> None:
        """A copy of the weights with every entry between poisoned red zones: a read
        past one reads poison, not its neighbour (the launches' weight offsets are
        remapped; an offset into the middle of an entry keeps the plain blob)."""
        entries = sorted(self.manifest["weights"]["entries"].values(),
                         key=lambda e: int(e["offset"]))
        pos, at = RED_ZONE, {}
        for e in entries:
            at[int(e["offset"])] = pos
            pos += -(-int(e["nbytes"]) // 64) * 64 + RED_ZONE
        spaced = np.full(max(pos, 64), 0xFF, np.uint8)
        for e in entries:
            start, size = at[int(e["offset"])], int(e["nbytes"])
            spaced[start:start + size] = self._weights[int(e["offset"]):int(e["offset"]) + size]
        self._spaced_weights, self._weight_at = spaced, at

    def _holds_poison(self, inputs: Mapping[str, np.ndarray]) -> bool:
        """Whether the data itself (an input, or a float weight) holds poison's bits in
        an element of 2 or more bytes (an int -1 reinterpreted by a BitCast is
        legitimately all ones): then poison in a result cannot be told from data, and
        is not reported. The weights never change: their part is found once, at load."""
        return self._weights_poison or _any_poison(
            np.ascontiguousarray(a) for a in inputs.values())

    def _weights_hold_poison(self) -> bool:
        """Whether a float weight holds poison's bits (see `_holds_poison`)."""
        arrays = []
        for e in self.manifest["weights"]["entries"].values():
            dtype = np.dtype(e["dtype"]) if e["dtype"] != "bfloat16" else np.dtype(np.uint16)
            if dtype.kind == "f" or e["dtype"] == "bfloat16":
                raw = self._weights[int(e["offset"]):int(e["offset"]) + int(e["nbytes"])]
                arrays.append(raw.view(dtype))
        return _any_poison(arrays)


def _any_poison(arrays: Iterable[np.ndarray]) -> bool:
    """Whether an element of 2, 4 or 8 bytes of `arrays` has all its bits set."""
    for a in arrays:
        if a.dtype.itemsize in (2, 4, 8):
            units = a.reshape(-1).view(f"u{a.dtype.itemsize}")
            if np.any(units == np.iinfo(units.dtype).max):
                return True
    return False


class EmulatedContext:
    """One pass at a time of an `EmulatedCudaExecutor`: its arena (spaced between red
    zones when sanitizing), and a sanitized pass's whole input and output buffers."""

    def __init__(self, executor: EmulatedCudaExecutor, threads: int):
        self._ex = executor
        self.manifest, self.section = executor.manifest, executor.section
        self.threads = threads                  # the emulator runs on the calling thread
        self.arena_bytes = executor.arena_bytes
        self._arena = np.zeros(executor.arena_bytes, np.uint8)
        self._variant = 0             # the dispatch variant of the pass under way
        self._kept_zero_for = 0       # the variant whose kept-zero region is zero
        self._data_poison = False      # sanitize: the data holds poison's bits itself
        self._last_inputs: Optional[dict] = None     # of its last `run`, for `measure`
        # a sanitized pass's whole output and input buffers (red zones included)
        self._out_buffers: list[tuple[str, np.ndarray]] = []
        self._in_buffers: list[tuple[str, np.ndarray]] = []
        self.last_latency_ms = 0.0

    def close(self) -> None:
        self._arena = np.zeros(0, np.uint8)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self._sanitized(inputs) if self._ex.sanitize else self._run(inputs, None)
        self._last_inputs = dict(inputs)
        return result

    def run_with_hook(self, inputs: Mapping[str, np.ndarray],
                      hook: Callable[[str, int, Callable], None]) -> dict[str, np.ndarray]:
        one = self._ex.pass_of(inputs)
        return self._run(inputs, None, outs=self._poisoned(one.outputs, one.variant),
                         hook=hook)

    def _pointer_arg(self, space: str, index: int, inputs, outputs, step: int = 0,
                     position: int = 0) -> np.ndarray:
        if space in SCALAR_FORMATS:         # a scalar: a size of the pass (i64), ...
            return np.dtype(SCALAR_FORMATS[space]).type(index)
        if space == "input":
            return inputs[index].reshape(-1).view(np.uint8)
        if space == "output":
            return outputs[index].reshape(-1).view(np.uint8)
        layout = self._ex.layouts[self._variant]
        if space == "arena" and layout is not None:
            value = self._ex.views[self._variant]["kernels"][step]["args"][position]
            return self._arena[layout.spaced[value]:]
        if space == "weights" and self._ex._spaced_weights is not None:
            start = self._ex._weight_at.get(int(index))
            if start is not None:
                return self._ex._spaced_weights[start:]
        base = self._arena if space == "arena" else self._ex._weights
        return base[int(index):]

    def _run(self, inputs: Mapping[str, np.ndarray], seconds: Optional[list[float]],
             reverse: bool = False, digests: Optional[list[str]] = None,
             outs: Optional[list[np.ndarray]] = None,
             hook: Optional[Callable[[str, int, Callable], None]] = None
             ) -> dict[str, np.ndarray]:
        """One forward pass; with `seconds`, each launch's wall time is appended to it;
        `reverse`: every launch in reverse block and thread order; `digests` receives a
        hash of the arena and outputs after each launch; `outs`: the output buffers;
        `hook("before" | "after", step, place)` runs around each launch, `place(value)`
        giving the bytes (a uint8 view) where a graph value lives, or None. A sanitized
        forward pass (digests, not reversed) also checks shared memory and red zones."""
        checking = digests is not None and not reverse
        one, launches = self._ex.bound_pass(inputs)
        self._variant = one.variant
        if outs is None:             # (a sanitized pass's arena was poisoned and zeroed)
            self._keep_zero(one.variant)
        arrays = [a.copy() for a in check_inputs(one.inputs, inputs)]
        if digests is not None:                 # a sanitized pass: inputs in red zones
            arrays = self._red_zoned_inputs(arrays)
        if outs is None:
            outs = [np.zeros(o["shape"], o["dtype"]) for o in one.outputs]

        def place(value: str) -> Optional[np.ndarray]:
            return self._place(value, arrays, outs)

        begin = time.perf_counter()
        for step, launch in enumerate(launches):
            if hook is not None:
                hook("before", step, place)
            if launch.empty:
                if digests is not None:
                    digests.append(digests[-1] if digests else "")
                if seconds is not None:
                    seconds.append(0.0)
                continue
            args = [self._pointer_arg(space, index, arrays, outs, step, j)
                    for j, (space, index) in enumerate(launch.args)]
            start = time.perf_counter()
            try:
                self._ex.module.launch(launch.kernel, launch.grid, launch.block, args,
                                       reverse=reverse, races=checking)
            except EmulatorError as exc:
                if not checking:
                    raise
                raise SanitizerError([f"kernel {launch.kernel}: {_detail(exc)}"]) from None
            if seconds is not None:
                seconds.append(time.perf_counter() - start)
            if hook is not None:
                hook("after", step, place)
            if checking:
                hazard = self._red_zone_hazard(launch.kernel)
                if hazard is not None:
                    raise SanitizerError([hazard])
            if digests is not None:
                h = hashlib.sha256(self._arena.tobytes())
                for o in outs:
                    h.update(o.tobytes())
                digests.append(h.hexdigest())
        self.last_latency_ms = (time.perf_counter() - begin) * 1e3
        return collect_outputs(self.manifest, arrays, outs, self._ex.constants, one.variant)

    def _keep_zero(self, variant: int) -> None:
        """Zero `variant`'s kept-zero region (`sizes.kept_zero`) when the last pass ran
        another variant, whose values may sit there (the arena is zeroed once, when the
        context is made, and a completed pass leaves its own region zero)."""
        if variant != self._kept_zero_for:
            offset, nbytes = kept_zero(self.manifest, variant)
            self._arena[offset:offset + nbytes] = 0
            self._kept_zero_for = variant

    def _place(self, value: str, arrays, outs) -> Optional[np.ndarray]:
        """The bytes of graph value `value` in this pass (of its dispatch variant): its
        arena region (its own, when sanitizing), its output or input buffer; None for
        weights or unknown."""
        layout, view = self._ex.layouts[self._variant], self._ex.views[self._variant]
        if view is None:
            return None
        start = layout.spaced.get(value) if layout is not None else None
        return value_bytes(view, value, self._arena, arrays, outs, start)

    # sanitizing: one pass's checks ------------------------------------------------
    def _red_zoned_inputs(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Each input copied between poisoned red zones (a read past its end reads
        poison; `self._in_buffers` keeps the whole buffers for the write check)."""
        out, self._in_buffers = [], []
        for spec, a in zip(self.manifest["inputs"], arrays):
            buf = np.full(a.nbytes + 2 * RED_ZONE, 0xFF, np.uint8)
            buf[RED_ZONE:RED_ZONE + a.nbytes] = a.reshape(-1).view(np.uint8)
            out.append(buf[RED_ZONE:RED_ZONE + a.nbytes].view(a.dtype).reshape(a.shape))
            self._in_buffers.append((spec["name"], buf))
        return out

    def _poisoned(self, specs: list[dict], variant: int = 0) -> list[np.ndarray]:
        """Poison the arena (but the zeroed region) and make sentinel-filled outputs
        (`specs`: the pass's, at its sizes), each inside red zones (`self._out_buffers`
        keeps the whole buffers). A dispatch variant whose layout the manifest does not
        hold (an older hidetc's) gets a zeroed arena instead: its zeroed region's place
        is not known."""
        self._variant = self._kept_zero_for = variant
        if self._ex.views[variant] is None:
            self._arena.fill(0)
        else:
            self._arena.fill(0xFF)
            region = self._place(scratch.ZEROED_REGION, [], [])
            if region is not None:
                region[...] = 0
        outs, self._out_buffers = [], []
        for spec in specs:
            dtype = np.dtype(spec["dtype"])
            size = int(np.prod(spec["shape"], dtype=np.int64)) * dtype.itemsize
            buf = np.full(size + 2 * RED_ZONE, 0xFF, np.uint8)
            out = buf[RED_ZONE:RED_ZONE + size].view(dtype).reshape(spec["shape"])
            sentinel = SENTINEL.get(dtype)
            if sentinel is not None:
                out.view(sentinel.dtype)[...] = sentinel
            outs.append(out)
            self._out_buffers.append((spec["name"], buf))
        return outs

    def _red_zone_hazard(self, kernel: str) -> Optional[str]:
        """Which red zone `kernel` wrote into, if any (the arena's: where the pass's
        variant has its values spaced out)."""
        arena = self._arena
        layout = self._ex.layouts[self._variant]
        for value, start, end in layout.regions if layout is not None else ():
            after = arena[end:-(-end // 64) * 64 + RED_ZONE]
            before = arena[start - RED_ZONE:start]
            for zone, where in ((after, "past the end of"), (before, "before")):
                touched = np.flatnonzero(zone != 0xFF)
                if touched.size:
                    return f"kernel {kernel}: wrote {touched.size} bytes {where} {value!r}"
        buffers = [("output", name, buf) for name, buf in self._out_buffers]
        buffers += [("input", name, buf) for name, buf in self._in_buffers]
        for kind, name, buf in buffers:
            zones = (buf[:RED_ZONE], buf[-RED_ZONE:]) if RED_ZONE else ()
            for zone, where in zip(zones, ("before", "past the end of")):
                touched = np.flatnonzero(zone != 0xFF)
                if touched.size:
                    return f"kernel {kernel}: wrote {touched.size} bytes {where} {kind} {name!r}"
        if self._ex._spaced_weights is not None:
            for offset, start in self._ex._weight_at.items():
                if self._ex._spaced_weights[start - RED_ZONE:start].min() != 0xFF:
                    return f"kernel {kernel}: wrote before a weight (offset {offset})"
        return None

    def _poisoned_values(self) -> list[str]:
        """After a sanitized forward pass: the float arena values (each in its own
        region) holding poison's bits, named with the kernels that write them."""
        view = self._ex.views[self._variant]
        if self._ex.layouts[self._variant] is None or view is None:
            return []
        memory, hazards = view["memory"], []
        writers: dict[str, list[str]] = {}
        for k in view.get("kernels", []):
            for value in k.get("writes", []):
                writers.setdefault(value, []).append(k["name"])
        for value, dtype in sorted(memory.get("dtypes", {}).items()):
            region = self._place(value, [], [])
            sentinel = SENTINEL.get(np.dtype(dtype))
            if region is None or sentinel is None or value not in writers:
                continue
            bits = region[:region.size - region.size % sentinel.dtype.itemsize].view(sentinel.dtype)
            poisoned = int(np.count_nonzero(bits == np.iinfo(sentinel.dtype).max))
            if poisoned:
                hazards.append(f"kernel {', '.join(writers[value])}: {poisoned} of the "
                               f"{bits.size} elements of {value!r} hold poison after the "
                               f"pass (never written, or computed from memory never "
                               f"written: shared, local or arena)")
        return hazards

    def _sanitized(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Two passes, forward and reversed (see the module docstring)."""
        self._data_poison = self._ex._holds_poison(inputs)
        hazards: list[str] = []
        forward: list[str] = []
        one, launches = self._ex.bound_pass(inputs)
        outs = self._poisoned(one.outputs, one.variant)
        result = self._run(inputs, None, digests=forward, outs=outs)
        writers = {index: launch.kernel for launch in launches if not launch.empty
                   for space, index in launch.args if space == "output"}
        for k, (spec, out) in enumerate(zip(one.outputs, outs)):
            sentinel = SENTINEL.get(out.dtype)
            if sentinel is None or k not in writers:
                continue
            bits = out.view(sentinel.dtype)
            unwritten = int(np.count_nonzero(bits == sentinel))
            if unwritten:
                hazards.append(f"kernel {writers[k]}: never wrote {unwritten} of the "
                               f"{out.size} elements of output {spec['name']!r}")
            poisoned = (0 if self._data_poison else
                        int(np.count_nonzero(bits == np.iinfo(sentinel.dtype).max)))
            if poisoned:
                hazards.append(f"kernel {writers[k]}: {poisoned} of the {out.size} elements "
                               f"of output {spec['name']!r} carry poison (computed from "
                               f"memory never written: shared, local or arena)")
        if not self._data_poison and self._ex.sizes_exact(one):
            hazards.extend(self._poisoned_values())
        backward: list[str] = []
        self._run(inputs, None, reverse=True, digests=backward,
                  outs=self._poisoned(one.outputs, one.variant))
        for launch, a, b in zip(launches, forward, backward):
            if a != b:
                hazards.append(f"kernel {launch.kernel}: its result depends on the order "
                               f"of blocks or threads (reversed, it differs)")
                break
        if hazards:
            raise SanitizerError(hazards)
        return result

    def measure(self, repeat: int, warmup: int) -> list[float]:
        inputs = self._last_inputs or zero_inputs(self.manifest, self._ex.dynamic)
        times = []
        for _ in range(warmup + repeat):
            self._run(inputs, None)
            times.append(self.last_latency_ms)
        return times[warmup:]

    def profile(self, inputs: Mapping[str, np.ndarray], repeat: int = 1) -> list[float]:
        passes = []
        for _ in range(max(repeat, 1)):
            seconds: list[float] = []
            self._run(inputs, seconds)
            passes.append(seconds)
        return [float(v) * 1e3 for v in np.median(np.asarray(passes), axis=0)]


@dataclass(frozen=True)
class Layout:
    """A sanitized pass's arena: each value's region start and (value, start, end)."""
    spaced: dict
    regions: list

