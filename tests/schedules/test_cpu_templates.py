"""The CPU MatMul and Conv templates on awkward shapes, for every config (or a
deterministic sample): build -> lower -> print C -> gcc -> run with ctypes -> compare
with numpy (rtol/atol 1e-4 elementwise after scaling by the output norm).

gcc builds are cached by content hash, so reruns are fast; the first run compiles a few
hundred small kernels in parallel batches (one shared library per batch)."""
from __future__ import annotations

import ctypes
import itertools
import random
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from helpers import targets
from helpers.tasks import conv_task, matmul_task, nhwc_task, task_reference

from hidetc.backends.codegen.c import print_c_module
from hidetc.backends.toolchain.gcc import build_shared_library, find_compiler, host_flags
from hidetc.compute.task import Task
from hidetc.schedules.common.conv_geometry import conv_geometry
from hidetc.schedules.cpu import TEMPLATES, avx2, build_kernel, conv_direct, winograd
from hidetc.schedules.cpu import conv as cpu_conv
from hidetc.schedules.cpu import matmul as cpu_matmul
from hidetc.schedules.cpu.conv_direct import DIRECT_SPACE, DirectConfig
from hidetc.schedules.cpu.depthwise import DepthwiseConfig
from hidetc.schedules.cpu.depthwise_nhwc import DepthwiseNHWCConfig
from hidetc.schedules.cpu.microkernel import GemmConfig
from hidetc.schedules.cpu.task_shape import blocking
from hidetc.schedules.cpu.winograd import WinogradConfig
from hidetc.schedules.template import MAX_SPACE
from hidetc.tir.pipeline import lower

RNG = np.random.default_rng(0)
# weights packed at compile time
PREPACK = {"Conv": cpu_conv, "ConvNHWC": cpu_conv, "MatMul": cpu_matmul}


def run_all(tmp_path, cases: list[tuple[Task, object]], prepacked: bool = False) -> None:
    """Build every (task, config) into one library per chunk, run each, compare.
    `prepacked`: Conv kernels built to read weights packed at compile time, fed
    `conv.prepack_weights` of the random weights."""
    extra = {"prepacked": True} if prepacked else {}
    fns = [(task, TEMPLATES[task.op].build(task, cfg, f"k{i}", targets.CPU, **extra), cfg)
           for i, (task, cfg) in enumerate(cases)]
    chunks = [fns[i:i + 16] for i in range(0, len(fns), 16)]

    def build(idx_chunk):
        idx, chunk = idx_chunk
        sources = {fn.name: print_c_module([lower(fn)]) for _, fn, _ in chunk}
        return ctypes.CDLL(str(build_shared_library(sources, tmp_path / f"lib{idx}.so")))
    with ThreadPoolExecutor(max_workers=2) as pool:
        libs = list(pool.map(build, enumerate(chunks)))
    for lib, chunk in zip(libs, chunks):
        for task, fn, cfg in chunk:
            _check(task, getattr(lib, fn.name), cfg, prepacked)


GUARD = 64  # NaN floats around every input, sentinels around the output


def _check(task: Task, kernel, cfg, prepacked: bool = False) -> None:
    """Inputs sit between NaN guards (a read out of bounds that reaches an output shows
    up as NaN), the output between sentinels (a write out of bounds changes them)."""
    inputs = [RNG.standard_normal(t.shape).astype(np.float32) for t in task.inputs]
    passed = list(inputs)
    if prepacked:
        passed[1] = PREPACK[task.op].prepack_weights(task, cfg, inputs[1])
    guarded = [np.pad(x.ravel(), GUARD, constant_values=np.nan) for x in passed]
    size = task.outputs[0].size
    out = np.full(size + 2 * GUARD, 7.0, np.float32)
    out[GUARD:GUARD + size] = np.nan
    kernel(*[g[GUARD:].ctypes.data_as(ctypes.c_void_p) for g in guarded],
           out[GUARD:].ctypes.data_as(ctypes.c_void_p))
    what = f"{task.signature()} {dict(task.attrs)} {cfg}"
    assert (out[:GUARD] == 7.0).all() and (out[GUARD + size:] == 7.0).all(), what
    ref = task_reference(task, inputs).reshape(-1)
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1.0)
    np.testing.assert_allclose(out[GUARD:GUARD + size], ref, rtol=1e-4, atol=1e-4 * scale,
                               err_msg=what)


def sample(space, count: int, seed: int) -> list:
    """A deterministic sample of a config space (all of it when small)."""
    space = list(space)
    return space if len(space) <= count else random.Random(seed).sample(space, count)


TARGET = targets.CPU
MM_SHAPES = [((7,), (7, 13)), ((13, 7), (7,)), ((7,), (7,)), ((1, 100), (100, 1)),
             ((13, 64), (64, 100)), ((100, 7), (7, 13)), ((2, 3, 7, 13), (3, 13, 64)),
             ((5, 1, 13, 7), (1, 4, 7, 13)), ((64, 300), (300, 100)), ((1, 1), (1, 1))]
CONV_SHAPES = [  # x, w, bias, attrs
    ((1, 3, 11, 13), (5, 3, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    ((2, 4, 17, 10), (6, 4, 3, 2), False,
     {"strides": [2, 3], "dilations": [2, 1], "pads": [2, 0, 1, 2]}),
    ((1, 6, 9, 9), (9, 2, 3, 3), True, {"group": 3, "pads": [1, 1, 1, 1]}),
    ((1, 16, 7, 9), (13, 16, 1, 1), True, {}),
    ((1, 16, 9, 9), (8, 16, 1, 1), False, {"strides": [2, 2]}),
    ((1, 3, 23, 19), (8, 3, 7, 7), True, {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    ((1, 5, 9, 11), (6, 5, 1, 7), True, {"pads": [0, 3, 0, 3]}),
    ((1, 4, 13, 13), (4, 4, 3, 3), False, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 3, 10, 9), (4, 3, 3, 3), True, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 64, 5, 6), (7, 64, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    ((1, 2, 30, 41), (3, 2, 3, 3), False, {"pads": [1, 1, 1, 1]}),
    ((1, 1, 3, 401), (2, 1, 1, 3), True, {}),
]
DEPTHWISE_SHAPES = [
    ((1, 8, 7, 7), (8, 1, 3, 3), True, {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((2, 4, 9, 8), (8, 1, 3, 3), False, {"group": 4, "pads": [0, 1, 2, 0]}),
    ((1, 6, 13, 12), (6, 1, 5, 5), True, {"group": 6, "dilations": [2, 2],
                                          "pads": [4, 4, 4, 4]}),
    ((1, 3, 1, 17), (3, 1, 1, 3), False, {"group": 3, "auto_pad": "SAME_LOWER"}),
    # the flattened interior band (SH * W == SW * OW: stride 1, width kept; not for
    # stride 2), a channel multiplier, a plane too small for any interior
    ((1, 5, 14, 14), (5, 1, 3, 3), True, {"group": 5, "pads": [1, 1, 1, 1]}),
    ((1, 4, 16, 16), (4, 1, 3, 3), True, {"group": 4, "strides": [2, 2],
                                          "pads": [1, 1, 1, 1]}),
    ((1, 3, 10, 10), (6, 1, 3, 3), False, {"group": 3, "pads": [1, 1, 1, 1]}),
    ((1, 2, 2, 2), (2, 1, 3, 3), True, {"group": 2, "pads": [1, 1, 1, 1]}),
    # column phases (stride > 1 along W): stride 3, odd widths, asymmetric pads, dilation
    ((1, 3, 20, 23), (3, 1, 3, 3), True, {"group": 3, "strides": [2, 3],
                                          "pads": [1, 0, 1, 2]}),
    ((1, 2, 15, 16), (2, 1, 3, 5), False, {"group": 2, "strides": [1, 2],
                                           "dilations": [1, 2], "pads": [1, 4, 1, 3]}),
]


def _conv(x, w, bias, attrs) -> Task:
    return conv_task(x, w, bias, **attrs)


def test_spaces_are_small_frozen_and_contain_the_default():
    tasks = [matmul_task(*MM_SHAPES[4]), _conv(*CONV_SHAPES[0]), _conv(*DEPTHWISE_SHAPES[0])]
    for task in tasks:
        template = TEMPLATES[task.op]
        space = template.space(task, TARGET)
        assert 1 <= len(space) <= MAX_SPACE
        assert len(set(space)) == len(space)
        assert template.default(task, TARGET) in space
        hash(space[0])


def test_blocking_balances_tasks_over_the_cores():
    bl = blocking(GemmConfig(), 128, 768, 768, 1, TARGET)
    assert (bl.m_tiles * bl.n_tiles) % 2 == 0 and bl.mt % bl.mc == 0
    bl = blocking(GemmConfig(), 1, 1000, 2048, 1, TARGET)
    assert bl.m_tiles * bl.n_tiles >= 2
    bl = blocking(GemmConfig(), 512, 49, 4608, 1, TARGET, n_unit=7, k_unit=9)
    assert bl.nc == 49 and bl.kc % 9 == 0 and bl.m_tiles == 2


def _row_tiles(bl) -> list[int]:
    """The rows of each row tile of `bl`, in order."""
    return [min(bl.mt, bl.m - i * bl.mt) for i in range(bl.m_tiles)]


def _even_rows(bl, cores: int) -> bool:
    """One row tile per core, each a multiple of MR but the last, none more than one MR
    panel longer than an exact share."""
    tiles = _row_tiles(bl)
    return (len(tiles) == cores and all(t % bl.mr == 0 for t in tiles[:-1])
            and max(tiles) - bl.m / cores < bl.mr)


def test_rows_split_evenly_where_the_blocks_do_not(tmp_path):
    """784 positions in MC=64 blocks (13) would split 448 + 336 over two cores, so the
    cheapest block split had every task read all rows and split the columns instead:
    the rows split evenly instead (a multiple of MR, the last MC block short). Many
    MC-block tasks and near-even splits keep whole MC blocks. With `local_rows` (a
    conv's positions), column-only splits of light weights and uneven row tiles split
    the rows evenly. Properties at TARGET's two cores; the kernels compute right with
    such tasks."""
    cores = TARGET.cores
    bl = blocking(GemmConfig(8, 32, mc=64, nc=192), 784, 128, 512, 1, TARGET)
    assert _even_rows(bl, cores) and bl.nc >= bl.n          # rows split, whole width
    bl = blocking(GemmConfig(4, 64, mc=256, nc=96), 3136, 64, 576, 1, TARGET)
    assert bl.mt % bl.mc == 0 and bl.m_tiles > 2 * cores    # many MC blocks: kept whole
    bl = blocking(GemmConfig(8, 32, mc=64, nc=192), 1225, 96, 864, 1, TARGET)
    assert bl.mt % bl.mc == 0 and bl.m_tiles == cores       # near-even block split kept
    # a column split (NC=96 of 192) over more rows than columns: rows split, whole width
    bl = blocking(GemmConfig(8, 32, mc=64, nc=96), 289, 192, 896, 1, TARGET)
    assert _even_rows(bl, cores) and bl.n_tiles == 1
    # fewer rows than columns (a 7x7 map, 960 channels): the weights stay split
    bl = blocking(GemmConfig(4, 64, mc=64, nc=192), 49, 960, 160, 1, TARGET)
    assert bl.m_tiles == 1 and bl.n_tiles > 1
    bl = blocking(GemmConfig(7, 48, mc=64, nc=192), 49, 512, 2048, 1, TARGET, local_rows=True)
    assert bl.m_tiles == 1 and bl.n_tiles > 1      # weights 2048x512 > 4 x 49 x (2048+512)
    # local rows (positions, one image): a column-only split whose weights are smaller
    # than the activations it moves between cores splits the rows (a 14x14 96->576 1x1)
    args = (GemmConfig(6, 48, mc=256, nc=96), 196, 576, 96, 1, TARGET)
    assert blocking(*args).m_tiles == 1 and blocking(*args).n_tiles >= cores
    bl = blocking(*args, local_rows=True)
    assert _even_rows(bl, cores) and bl.n_tiles == blocking(*args).n_tiles
    two = conv_geometry(nhwc_task((2, 96, 14, 14), (576, 96, 1, 1), True))  # two images:
    assert conv_direct.blocking_for(two, DirectConfig(6, 48, mc=256, nc=96, kc=0),
                                    TARGET).m_tiles == 1          # images outermost, as before
    # ... and more row tiles than cores (256+256 | 256+16) rebalance when cheaper
    args = (GemmConfig(4, 64, mc=256, nc=192), 784, 192, 32, 1, TARGET)
    assert blocking(*args).mt == args[0].mc and blocking(*args).m_tiles > cores
    assert _even_rows(blocking(*args, local_rows=True), cores)
    conv = nhwc_task((1, 24, 4, 13), (32, 24, 1, 1), True)
    mm = matmul_task((52, 24), (24, 32))
    cases = [(conv, DirectConfig(4, 16, mc=8, nc=32, kc=0)),
             (conv, DirectConfig(4, 16, mc=8, nc=32, kc=8)),
             (mm, GemmConfig(4, 16, mc=8, nc=32)),
             (mm, GemmConfig(4, 16, mc=8, nc=32, pack_a=False))]
    for _, cfg in cases:
        gemm = cfg.gemm() if isinstance(cfg, DirectConfig) else cfg
        bl = blocking(gemm, 52, 32, 24, 1, TARGET)
        assert _even_rows(bl, TARGET.cores) and bl.mt % bl.mc, cfg   # MC does not divide MT
    run_all(tmp_path, cases)
    (tmp_path / "packed").mkdir()
    run_all(tmp_path / "packed", cases, prepacked=True)


def test_every_matmul_config_on_an_awkward_shape(tmp_path):
    task = matmul_task((2, 3, 7, 13), (3, 13, 64))
    space = TEMPLATES["MatMul"].space(task, TARGET)
    big = matmul_task((37, 300), (300, 53))
    run_all(tmp_path, [(task, cfg) for cfg in space] + [(big, cfg) for cfg in space[::12]])


@pytest.mark.parametrize("shapes", [MM_SHAPES])
def test_matmul_configs_on_awkward_shapes(tmp_path, shapes):
    tasks = [matmul_task(a, b) for a, b in shapes]
    configs = sample(TEMPLATES["MatMul"].space(tasks[0], TARGET), 6, 1)
    configs.append(TEMPLATES["MatMul"].default(tasks[0], TARGET))
    run_all(tmp_path, list(itertools.product(tasks, configs)))


def test_conv_configs_on_awkward_shapes(tmp_path):
    tasks = [_conv(*c) for c in CONV_SHAPES]
    space = TEMPLATES["Conv"].space(tasks[0], TARGET)
    default = TEMPLATES["Conv"].default(tasks[0], TARGET)
    cases = [(t, default) for t in tasks]
    cases += [(t, cfg) for t, cfg in zip(itertools.cycle(tasks), sample(space, 30, 2))]
    run_all(tmp_path, cases)


def test_conv_configs_with_weights_packed_at_compile_time(tmp_path):
    """The kernels that read constant weights pre-packed (plan: `_prepacked_weights`),
    on every conv shape, with A packed or read in place in the config (both ignored)."""
    tasks = [_conv(*c) for c in CONV_SHAPES]
    space = TEMPLATES["Conv"].space(tasks[0], TARGET)
    cases = [(t, cfg) for t, cfg in zip(itertools.cycle(tasks), sample(space, 14, 3))]
    cases += [(t, GemmConfig(8, 8, pack_a=False)) for t in tasks[:2]]
    run_all(tmp_path, cases, prepacked=True)


def test_direct_conv_configs_on_every_conv_shape(tmp_path):
    """The direct convolution (positions x output channels, broadcasts from the input
    or its padded copy) on every conv shape: each micro-tile shape once with the
    weights packed per call, and a sample with them packed at compile time."""
    tasks = [_conv(*c) for c in CONV_SHAPES] + [
        conv_task((2, 8, 6, 5), (24, 8, 3, 3), True, pads=[0, 1, 2, 0]),   # ragged 24 = 16 + 8
        conv_task((1, 4, 9, 9), (40, 4, 3, 3), False, strides=[2, 2], auto_pad="SAME_UPPER"),
        conv_task((1, 300, 3, 3), (17, 300, 3, 3), True, pads=[1, 1, 1, 1])]  # K blocks
    shapes = sorted({(c.mr, c.nr) for c in DIRECT_SPACE[TARGET.isa]})
    assert len(shapes) == 6
    cases = [(t, DirectConfig(mr, nr, kc=128)) for t in tasks for mr, nr in shapes[:2]]
    cases += [(t, cfg) for t, cfg in zip(itertools.cycle(tasks),
                                         sample(DIRECT_SPACE[TARGET.isa], 20, 5))]
    (tmp_path / "packed").mkdir()    # a library path of its own: dlopen reuses a path
    run_all(tmp_path, cases[::2])
    run_all(tmp_path / "packed", cases[1::2], prepacked=True)


def test_channels_last_direct_conv_on_every_conv_shape(tmp_path):
    """ConvNHWC (channels-last input and output, OHWI weights): every conv shape with
    the micro-tile shapes in turn (MC blocks of 2 x MR, so several blocks per task),
    then a sample of the space over the shapes; the weights packed per call and at
    compile time (alternate cases)."""
    shapes = [c for c in CONV_SHAPES if c[3].get("group", 1) == 1] + [
        ((2, 8, 6, 5), (24, 8, 3, 3), True, {"pads": [0, 1, 2, 0]}),
        ((1, 300, 3, 3), (17, 300, 3, 3), True, {"pads": [1, 1, 1, 1]}),
        ((1, 6, 9, 9), (9, 2, 3, 3), True, {"group": 3, "pads": [1, 1, 1, 1]})]
    tasks = [nhwc_task(x, w, b, **a) for x, w, b, a in shapes]
    space = [c for c in TEMPLATES["ConvNHWC"].space(tasks[0], TARGET)
             if isinstance(c, DirectConfig)]     # Winograd's: test_winograd_conv_*
    assert {TEMPLATES["ConvNHWC"].default(t, TARGET) for t in tasks} <= set(space)
    micro = sorted({(c.mr, c.nr) for c in space})
    cases = [(t, DirectConfig(mr, nr, mc=2 * mr)) for t, (mr, nr) in
             zip(tasks, itertools.cycle(micro))]           # every micro-tile shape, MC blocks
    cases += [(t, cfg) for t, cfg in zip(itertools.cycle(tasks[::-1]), sample(space, 12, 7))]
    (tmp_path / "packed").mkdir()
    run_all(tmp_path, cases[::2])
    run_all(tmp_path / "packed", cases[1::2], prepacked=True)


def test_channels_last_depthwise_every_config(tmp_path):
    """ConvNHWC depthwise (C/G = OC/G = 1): every config, and every depthwise shape
    without a channel multiplier under two configs, weights read in place and prepacked
    to [taps, C]."""
    tasks = [nhwc_task(x, w, b, **a) for x, w, b, a in DEPTHWISE_SHAPES if w[0] == x[1]]
    tasks += [nhwc_task((1, 40, 7, 6), (40, 1, 3, 3), True, group=40, pads=[1, 1, 1, 1])]
    space = TEMPLATES["ConvNHWC"].space(tasks[0], TARGET)
    assert all(isinstance(c, DepthwiseNHWCConfig) for c in space)
    cases = [(tasks[-1], c) for c in space]          # every config once, every shape twice
    cases += [(t, space[i % len(space)]) for i, t in enumerate(tasks + tasks[::-1])]
    (tmp_path / "packed").mkdir()
    run_all(tmp_path, cases[::2])
    run_all(tmp_path / "packed", cases[1::2], prepacked=True)


def test_matmul_configs_with_b_packed_at_compile_time(tmp_path):
    """MatMul kernels reading a constant B pre-packed into NR panels (the last one
    zero-padded), B read in place or packed in the config (both ignored)."""
    tasks = [matmul_task(a, b) for a, b in MM_SHAPES + [((37, 300), (300, 53))]]
    space = TEMPLATES["MatMul"].space(tasks[0], TARGET)
    cases = [(t, cfg) for t, cfg in zip(itertools.cycle(tasks), sample(space, 40, 4))
             if cpu_matmul.can_prepack(t, cfg)]
    cases += [(t, cfg) for t in tasks for cfg in (TEMPLATES["MatMul"].default(t, TARGET),
                                                    GemmConfig(3, 32, pack_b=False))
              if cpu_matmul.can_prepack(t, cfg)]
    assert len(cases) >= 10
    run_all(tmp_path, cases, prepacked=True)


def test_depthwise_conv_every_config(tmp_path):
    tasks = [_conv(*c) for c in DEPTHWISE_SHAPES]
    assert all(conv_geometry(t).depthwise for t in tasks)
    space = TEMPLATES["Conv"].space(tasks[0], TARGET)
    assert all(isinstance(c, DepthwiseConfig) for c in space)
    run_all(tmp_path, list(itertools.product(tasks, space)))


def test_rules_build_the_default_configs():
    for task in (matmul_task((3, 5), (5, 7)), _conv(*CONV_SHAPES[0])):
        fn = build_kernel(task, "k", targets.CPU)
        assert fn == TEMPLATES[task.op].build(task, TEMPLATES[task.op].default(task, TARGET),
                                              "k", targets.CPU)


def fma_loops(asm: str) -> list[list[str]]:
    """The bodies of the assembly loops (label ... backward jump to it) that contain
    packed FMAs."""
    lines = asm.splitlines()
    loops = []
    for i, line in enumerate(lines):
        label = re.match(r"(\.L\d+):", line)
        if not label:
            continue
        for j in range(i + 1, len(lines)):
            if re.match(rf"\s+j\w+\s+{re.escape(label.group(1))}$", lines[j]):
                body = lines[i + 1:j]
                if any("vfmadd" in b and "ps" in b for b in body):
                    loops.append(body)
                break
            if re.match(r"\.L\d+:", lines[j]):
                break
    return loops


@pytest.mark.parametrize("task", [
    matmul_task((1, 128, 768), (768, 768)), matmul_task((12, 128, 64), (12, 64, 128)),
    conv_task((1, 64, 56, 56), (64, 64, 3, 3), True, pads=[1, 1, 1, 1]),
    conv_task((1, 3, 224, 224), (64, 3, 7, 7), True, strides=[2, 2], pads=[3, 3, 3, 3]),
    conv_task((1, 512, 7, 7), (512, 512, 3, 3), True, pads=[1, 1, 1, 1]),
    conv_task((1, 256, 56, 56), (64, 256, 1, 1), True)], ids=lambda t: t.signature())
def test_default_micro_kernel_keeps_its_accumulators_in_registers(tmp_path, task):
    """gcc must turn the default micro-kernel into MR * NR/L packed FMAs per k (L the
    ISA's lanes, `avx2.widths`) with no stack traffic in the loop (a spilled or
    scalar-replaced accumulator halves the speed; see the microkernel module
    docstring)."""
    cfg = TEMPLATES[task.op].default(task, TARGET)
    src = tmp_path / "k.c"
    src.write_text(print_c_module([lower(TEMPLATES[task.op].build(task, cfg, "k", targets.CPU))]))
    subprocess.run([find_compiler(), *host_flags(), "-S", str(src), "-o", str(tmp_path / "k.s")],
                   check=True)
    loops = fma_loops((tmp_path / "k.s").read_text())
    inner = [body for body in loops if sum("vfmadd" in b for b in body) >= 2]
    assert inner, "no vectorized FMA loop"
    hot = max(inner, key=lambda body: sum("vfmadd" in b for b in body))
    vectors = cfg.mr * len(avx2.widths(cfg.nr, TARGET.vector_lanes))
    assert sum("vfmadd" in b and "ps\t" in b for b in hot) == vectors, hot
    assert not [b for b in hot if re.search(r"\(%r[sb]p\)|vfmadd\d+ss", b)], hot


def test_channels_last_kernel_key_names_identical_kernels():
    """Configs of a channels-last conv that share a `kernel_key` (tiles clamped to a
    small shape) print the same C, so the tuner measures one of them; configs whose key
    differs print different C."""
    template = TEMPLATES["ConvNHWC"]
    for task in (nhwc_task((1, 40, 7, 7), (24, 40, 1, 1), True),
                 nhwc_task((1, 16, 9, 9), (64, 16, 3, 3), False, pads=[1, 1, 1, 1])):
        groups: dict = {}
        for cfg in template.space(task, TARGET):
            groups.setdefault(template.kernel_key(task, cfg, TARGET), []).append(cfg)
        assert 1 < len(groups) < len(template.space(task, TARGET))

        def source(cfg, task=task):
            return print_c_module([lower(template.build(task, cfg, "k", targets.CPU))])
        shared = [cfgs for cfgs in groups.values() if len(cfgs) > 1]
        for cfgs in sample(shared, 4, 3):
            assert len({source(c) for c in cfgs[:3]}) == 1, cfgs[:3]
        firsts = [cfgs[0] for cfgs in sample(list(groups.values()), 6, 5)]
        assert len({source(c) for c in firsts}) == len(firsts)


def test_channels_last_7_row_tiles_only_where_8_pads_many_rows(tmp_path):
    """On AVX-512 a 7x7 map (8-row tiles compute 56 rows for 49) gets the 7 x 48 configs
    in its space and first in its short list; a 14x14 map (2% padded) and a 56x56 map
    do not. On AVX2 there are none. The 7-row kernels are right on a 7x7 conv."""
    from hidetc.driver.tune.search import candidates
    from hidetc.schedules.cpu import conv_direct

    template = TEMPLATES["ConvNHWC"]
    small = nhwc_task((1, 40, 7, 7), (72, 40, 3, 3), True, pads=[1, 1, 1, 1])
    others = [nhwc_task((1, 8, 14, 14), (16, 8, 1, 1), True),
              nhwc_task((1, 8, 56, 56), (16, 8, 1, 1), True)]
    for task in others:
        assert template.short_list(task, TARGET) == conv_direct.LAST_SHORT_LIST[TARGET.isa]
        assert template.space(task, TARGET) == conv_direct.LAST_SPACE[TARGET.isa]
    short, space = template.short_list(small, TARGET), template.space(small, TARGET)
    direct = tuple(c for c in short if isinstance(c, DirectConfig))   # after Winograd's
    assert short[:len(winograd.SHORT_LIST[TARGET.isa])] == winograd.SHORT_LIST[TARGET.isa]
    if not conv_direct.ROWS_OF_7[TARGET.isa]:
        assert direct == conv_direct.LAST_SHORT_LIST[TARGET.isa]
        return
    assert direct[:3] == conv_direct.ROWS_OF_7[TARGET.isa] and set(short) <= set(space)
    last = conv_direct.LAST_SPACE[TARGET.isa]
    assert {(c.mr, c.nr) for c in space} - {(c.mr, c.nr) for c in last} == {(7, 48)}
    assert sum(c.mr == 7 for c in candidates(template, small, TARGET, 1)) >= 2
    run_all(tmp_path, [(small, c) for c in conv_direct.ROWS_OF_7[TARGET.isa]])


WINOGRAD_SHAPES = [  # 3x3 stride 1: odd and even maps, pads or none, OC past a panel
    ((1, 16, 14, 14), (32, 16, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    ((2, 8, 11, 9), (40, 8, 3, 3), False, {"pads": [1, 1, 1, 1]}),
    ((1, 5, 19, 17), (7, 5, 3, 3), True, {}),
    ((1, 33, 17, 15), (17, 33, 3, 3), True, {"pads": [0, 1, 2, 0]}),
    ((1, 3, 30, 30), (64, 3, 3, 3), False, {"auto_pad": "SAME_UPPER"}),
    # 1-D kernels: F(m, 7) and F(m, 3) along one dimension (Inception-V3's 1x7 / 7x1)
    ((1, 20, 9, 17), (18, 20, 1, 7), True, {"pads": [0, 3, 0, 3]}),
    ((1, 16, 17, 6), (24, 16, 7, 1), False, {"pads": [3, 0, 3, 0]}),
    ((1, 12, 7, 10), (8, 12, 1, 3), True, {"pads": [0, 1, 0, 1]}),
    ((2, 9, 11, 5), (16, 9, 3, 1), True, {}),
    ((1, 10, 13, 11), (20, 10, 5, 5), True, {"pads": [2, 2, 2, 2]}),   # F(m x m, 5 x 5)
]


def test_toom_cook_transforms_compute_the_correlation():
    """Every (m, kernel) the Winograd conv uses: A^T [(G g) . (B^T d)] is the valid
    correlation of d with g, exactly in float64 (random data)."""
    rng = np.random.default_rng(5)
    for m, k in list(winograd.MATRICES) + list(winograd.POINTS):
        dim = winograd._dim(m, k)
        bt, g, at = (np.array([[float(v) for v in row] for row in x])
                     for x in (dim.bt, dim.g, dim.at))
        d, f = rng.standard_normal(dim.a), rng.standard_normal(k)
        want = np.array([d[i:i + k] @ f for i in range(m)])
        np.testing.assert_allclose(at @ ((g @ f) * (bt @ d)), want, rtol=1e-12, atol=1e-12,
                                   err_msg=f"F({m}, {k})")


def test_winograd_conv_on_every_shape(tmp_path):
    """ConvNHWC as Winograd F(2x2,3x3) and F(4x4,3x3) (3x3 stride 1) and F(2,7), F(4,7),
    F(2,3), F(4,3) along one dimension (1x7, 7x1, 1x3, 3x1): every shape with
    both tile sizes, the micro-tile shapes in turn, the weights transformed per call and
    at compile time (alternate cases); outputs against numpy in float64."""
    tasks = [nhwc_task(x, w, b, **a) for x, w, b, a in WINOGRAD_SHAPES]
    assert all(winograd.supports(conv_geometry(t)) for t in tasks)
    for t in tasks:
        assert set(winograd.SPACE[TARGET.isa]) <= set(TEMPLATES["ConvNHWC"].space(t, TARGET))
    micro = sorted({(c.mr, c.nr) for c in winograd.SPACE[TARGET.isa]})
    cases = [(t, WinogradConfig(m, mr, nr, mc=2 * mr, nc=nr, kc=16))
             for (t, (mr, nr)), m in itertools.product(zip(tasks, itertools.cycle(micro)), (2, 4))]
    cases += [(t, cfg) for t, cfg in zip(itertools.cycle(tasks[::-1]),
                                         sample(winograd.SPACE[TARGET.isa], 8, 3))]
    (tmp_path / "packed").mkdir()
    run_all(tmp_path, cases[::2])
    run_all(tmp_path / "packed", cases[1::2], prepacked=True)


def test_short_output_rows_loop_over_the_second_to_last():
    """An NCHW -> NHWC transpose of an RGB image: rows (H) in parallel, W the inner loop,
    the 3 channels unrolled in it (`injective._build_short_rows`); the op cases
    transpose_short_rows / where_short_rows (tests/e2e/test_ops_cpu.py) take this path
    and check the values."""
    from hidetc.graph.ir import TensorType, freeze_attr
    from hidetc.schedules.cpu import injective
    task = Task("Transpose", (TensorType("float32", (1, 3, 224, 224)),),
                (TensorType("float32", (1, 224, 224, 3)),),
                (("perm", freeze_attr([0, 2, 3, 1])),), (None,))
    src = print_c_module([lower(injective.build(task, "t"))])
    assert "hidetc_par_init(&hidetc_par, 224u" in src and "#pragma GCC unroll 3" in src
    assert all(injective._short_rows(s) for s in ((2, 17, 9, 3), (4, 5, 9, 2)))
    assert not injective._short_rows((1, 50176, 3)) and not injective._short_rows((8, 3))
