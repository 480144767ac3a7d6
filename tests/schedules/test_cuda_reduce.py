"""The CUDA reduction template (hidetc/schedules/cuda/reduce_template.py): Reduce* over
contiguous, strided and mixed axes (keepdims either way, empty axes as a no-op, an empty
reduced dim), int32 Max/Sum, Softmax/LogSoftmax on inner and middle axes, LayerNorm
with and without bias, global pools; row lengths 1, 7, 31, 33, 129, 1000, 4099 and
row counts 1, 3, 130; float32 and float16; inputs of large magnitude (softmax ~1e4,
LogSumExp ~1e2: max subtraction keeps them finite) and LayerNorm rows of mean 1e4
(the shifted two-pass variance keeps them accurate).

A seeded sample of (task, config) cases plus every family's default config is built,
lowered and printed into two .cu units -> nvcc for sm_80 (a ptxas error fails; no
spills, no stack frame: the cached rows stay in registers) and the emulator (g++) ->
each kernel runs in the emulator on NaN-guarded inputs and a sentinel-guarded output
and is compared with numpy in float64. Every config of the space runs under `-m slow`.
Builds are cached by content hash, so reruns only launch kernels."""
from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from helpers import targets
from helpers.kernel_device import kernel_module

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources
from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType
from hidetc.schedules.catalog import representative_tasks
from hidetc.schedules.cuda import TEMPLATES, build_kernel, supports
from hidetc.schedules.cuda.reduce_rows import row_view, view_of
from hidetc.schedules.cuda.reduce_template import (
    MULTI_PASS,
    OPS,
    TEMPLATE,
    ReduceConfig,
    check_config,
    config_space,
    default_config,
)
from hidetc.schedules.template import MAX_SPACE
from hidetc.tir.pipeline import lower

NVCC = shutil.which("nvcc")
CUDA = targets.CUDA
GUARD = 64            # elements of NaN around each input, of sentinels around the output
SENTINEL = 7
SAMPLE = 40
MAX_EMULATED_THREADS = 40_000   # rows x threads per row of one case (emulator time)
F32, F16, F64, I32, I64 = "float32", "float16", "float64", "int32", "int64"
# float32: the kernels accumulate in float32 (serial per thread, then a shuffle tree),
# so a sum of n terms is off by about n * 2^-24 of the terms' magnitude: 1e-4 relative
# covers n = 4099 with margin. float16 storage: the result is rounded to float16 once
# (<= 2^-11 relative) and the float32 accumulation adds ~1e-4 at most, so 2e-3 relative
# (4 ulp) is a bound; a float16 accumulator would be off by ~sqrt(n) ulp of the partial
# sums (~1 for ReduceSum of 4099 N(0,1)), far outside it.
TOL = {F32: 1e-4, F16: 2e-3, F64: 1e-9, I32: 0, I64: 0, "bool": 0}


@dataclass(frozen=True)
class Problem:
    name: str
    task: Task
    make: Callable      # rng -> list of input arrays (the buffer inputs, in order)
    ref: Callable       # inputs (float64 or int) -> expected output (float64 or int)


def _tt(dtype, shape):
    return TensorType(dtype, tuple(shape))


def reduce_problem(op, shape, axes, keepdims=1, dtype=F32, scale=1.0, offset=0.0, noop=0):
    x = np.zeros(shape)
    red = tuple(a % len(shape) for a in axes) if axes else (() if noop else tuple(
        range(len(shape))))
    out_shape = np.sum(x, axis=red, keepdims=bool(keepdims)).shape
    attrs = (("keepdims", keepdims),) + ((("noop_with_empty_axes", 1),) if noop else ())
    task = Task(op, (_tt(dtype, shape), _tt("int64", (len(axes),))), (_tt(dtype, out_shape),),
                attrs, (None, tuple(axes)))
    ref = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max,
           "ReduceMin": np.min, "ReduceProd": np.prod,
           "ReduceSumSquare": lambda v, axis, keepdims: np.sum(v * v, axis, keepdims=keepdims),
           "ReduceL1": lambda v, axis, keepdims: np.sum(np.abs(v), axis, keepdims=keepdims),
           "ReduceL2": lambda v, axis, keepdims: np.sqrt(np.sum(v * v, axis,
                                                                keepdims=keepdims)),
           "ReduceLogSumExp": _logsumexp,
           "ReduceLogSum": lambda v, axis, keepdims: np.log(np.sum(v, axis,
                                                                   keepdims=keepdims))}[op]

    def make(rng):
        if dtype == "bool":
            return [rng.random(shape) < (0.97 if op == "ReduceMin" else 0.03)]
        if np.dtype(dtype).kind == "i":
            return [rng.integers(-1000, 1000, shape).astype(dtype)]
        return [(rng.standard_normal(shape) * scale + offset).astype(dtype)]

    def reference(xs):
        v = xs[0]
        if v.size == 0 or 0 in [shape[a] for a in red]:
            info = np.iinfo(v.dtype) if v.dtype.kind == "i" else None
            init = {"ReduceMax": info.min, "ReduceMin": info.max} if info else {}
            return np.full(out_shape, init.get(op, 0), v.dtype)
        return np.asarray(ref(v, axis=red, keepdims=bool(keepdims))).reshape(out_shape)
    name = f"{op}{list(shape)}ax{list(axes)}k{keepdims}{dtype}{'big' if scale > 1 else ''}"
    return Problem(name, task, make, reference)


def _logsumexp(v, axis, keepdims):
    top = np.max(v, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(v - top), axis=axis, keepdims=True)) + top
    return out if keepdims else np.squeeze(out, axis)


def softmax_problem(op, shape, axis, dtype=F32, scale=1.0, offset=0.0):
    task = Task(op, (_tt(dtype, shape),), (_tt(dtype, shape),), (("axis", axis),), (None,))

    def reference(xs):
        shifted = xs[0] - np.max(xs[0], axis=axis, keepdims=True)
        total = np.sum(np.exp(shifted), axis=axis, keepdims=True)
        return shifted - np.log(total) if op == "LogSoftmax" else np.exp(shifted) / total
    make = lambda rng: [(rng.standard_normal(shape) * scale + offset).astype(dtype)]  # noqa
    return Problem(f"{op}{list(shape)}ax{axis}{dtype}{'big' if scale > 1 or offset else ''}",
                   task, make, reference)


def layernorm_problem(shape, axis=-1, bias=True, dtype=F32, offset=0.0, eps=1e-5,
                      scale_shape=None, bias_shape=None):
    norm = shape[axis % len(shape):]
    scale_shape, bias_shape = scale_shape or norm, bias_shape or norm
    ins = [_tt(dtype, shape), _tt(dtype, scale_shape)] + ([_tt(dtype, bias_shape)] if bias
                                                           else [])
    task = Task("LayerNormalization", tuple(ins), (_tt(dtype, shape),),
                (("axis", axis), ("epsilon", eps)), (None,) * len(ins))
    axes = tuple(range(axis % len(shape), len(shape)))

    def make(rng):
        arrays = [rng.standard_normal(shape) + offset,
                  rng.standard_normal(scale_shape) * 0.5 + 1]
        arrays += [rng.standard_normal(bias_shape)] if bias else []
        return [a.astype(dtype) for a in arrays]

    def reference(xs):
        mean = np.mean(xs[0], axis=axes, keepdims=True)
        var = np.mean((xs[0] - mean) ** 2, axis=axes, keepdims=True)
        y = (xs[0] - mean) / np.sqrt(var + eps) * xs[1]
        return y + xs[2] if bias else y
    name = (f"LayerNorm{list(shape)}ax{axis}{'b' if bias else ''}{dtype}"
            f"{'big' if offset else ''}{list(scale_shape)}")
    return Problem(name, task, make, reference)


def pool_problem(op, shape, dtype=F32):
    out = shape[:2] + (1,) * (len(shape) - 2)
    task = Task(op, (_tt(dtype, shape),), (_tt(dtype, out),), (), (None,))
    fn = np.mean if op == "GlobalAveragePool" else np.max
    return Problem(f"{op}{list(shape)}{dtype}", task,
                   lambda rng: [rng.standard_normal(shape).astype(dtype)],
                   lambda xs: fn(xs[0], axis=tuple(range(2, len(shape))), keepdims=True))


R, S, L, P = reduce_problem, softmax_problem, layernorm_problem, pool_problem
PROBLEMS = [
    R("ReduceSum", (3, 1000), [1]), R("ReduceSum", (129, 130), [0], keepdims=0),
    R("ReduceMean", (2, 7, 31), [0, 2]), R("ReduceMax", (130, 33), [-1]),
    R("ReduceMin", (1, 4099), [], keepdims=0), R("ReduceProd", (3, 7), [1], scale=0.1,
                                                  offset=1.0),
    R("ReduceSumSquare", (130, 31), [1]), R("ReduceL1", (3, 129), [1], keepdims=0),
    R("ReduceL2", (4099, 3), [0]), R("ReduceLogSumExp", (130, 129), [1], scale=100.0),
    R("ReduceLogSumExp", (3, 1, 33), [0, 2], keepdims=0), R("ReduceMax", (3, 1000), [1], dtype=I32),
    R("ReduceMax", (130, 7), [1], dtype=I32, keepdims=0), R("ReduceSum", (33, 3), [0], dtype=I32),
    R("ReduceMax", (3, 0, 2), [1], dtype=I32), R("ReduceSum", (3, 0), [1]),
    R("ReduceSumSquare", (3, 7), [], noop=1), R("ReduceMean", (130, 129), [1], dtype=F16),
    R("ReduceSum", (3, 4099), [1], dtype=F16), R("ReduceMax", (1, 33), [1], dtype=F16),
    R("ReduceL2", (7, 31, 3), [1], dtype=F16), R("ReduceMin", (130, 33), [1], dtype=I64),
    R("ReduceMax", (3, 129), [1], dtype="bool"), R("ReduceMin", (7, 31, 3), [1], dtype="bool"),
    R("ReduceSum", (0, 5), [1]), R("ReduceLogSum", (7, 129), [1], scale=0.5, offset=3.0),
    S("Softmax", (3, 33), -1, dtype=F64),
    S("Softmax", (130, 128), -1, scale=1e4), S("Softmax", (3, 129), -1, offset=1e4, scale=3),
    S("Softmax", (3, 1000), -1), S("Softmax", (1, 4099), -1), S("Softmax", (2, 33, 7), 1),
    S("Softmax", (130, 31), -1, dtype=F16), S("Softmax", (130, 1), -1),
    S("Softmax", (5, 7, 1), -1), S("LogSoftmax", (3, 129), -1, scale=1e4),
    S("LogSoftmax", (7, 31, 3), 1), S("LogSoftmax", (3, 1000), -1, dtype=F16),
    S("LogSoftmax", (1, 4099), -1),
    L((130, 768), offset=1e4), L((3, 33), bias=False), L((2, 3, 129), axis=-2),
    L((1, 4099)), L((130, 129), dtype=F16), L((3, 1000), bias=False, dtype=F16),
    L((3, 7), offset=1e4), L((130, 1)),
    L((2, 3, 129), axis=-2, scale_shape=(129,), bias_shape=(3, 1)),
    P("GlobalAveragePool", (2, 65, 7, 7)), P("GlobalMaxPool", (1, 3, 31, 33)),
    P("GlobalAveragePool", (1, 130, 1, 1), dtype=F16),
]


def emulated_threads(problem: Problem, cfg: ReduceConfig) -> int:
    return max(view_of(problem.task).rows, 1) * cfg.threads


def cases(configs_for: Callable[[Problem], list[ReduceConfig]], per_config: int, seed: int
          ) -> list[tuple[Problem, ReduceConfig]]:
    """Each config (of the union of the problems' spaces) paired with `per_config`
    random problems whose op space holds it and whose rows x threads stay within
    MAX_EMULATED_THREADS (the emulator runs every thread as a fiber)."""
    rng = random.Random(seed)
    pool = {}
    for p in PROBLEMS:
        for cfg in configs_for(p):
            pool.setdefault(cfg, []).append(p)
    out = []
    for cfg in sorted(pool, key=str):
        fits = [p for p in pool[cfg] if emulated_threads(p, cfg) <= MAX_EMULATED_THREADS]
        out.extend((p, cfg) for p in rng.sample(fits, min(per_config, len(fits))))
    return out


def sampled_cases() -> list[tuple[Problem, ReduceConfig]]:
    everything = cases(lambda p: config_space(p.task.op), 1, 0)
    sample = random.Random(0).sample(everything, SAMPLE)
    defaults = [(p, TEMPLATE.default(p.task, CUDA)) for p in PROBLEMS]
    return sample + defaults


def guarded(array: np.ndarray, fill) -> tuple[np.ndarray, np.ndarray]:
    """(buffer with guards, C-contiguous view inside it holding `array`)."""
    buf = np.full(array.size + 2 * GUARD, fill, array.dtype)
    view = buf[GUARD:GUARD + array.size].reshape(array.shape)
    view[...] = array
    return buf, view


def guard_value(dtype: np.dtype):
    """What surrounds an input: NaN for floats, the dtype's max for ints, True for bool
    (each shows up in the result of a kernel that reads past its operand)."""
    return {"f": np.nan, "i": np.iinfo(dtype).max if dtype.kind == "i" else 0,
            "b": True}[dtype.kind]


def run_case(module, problem: Problem, fn, rng) -> None:
    task = problem.task
    inputs = problem.make(rng)
    ins = [guarded(a, guard_value(a.dtype))[1] for a in inputs]
    out_type = task.outputs[0]
    sentinel = np.asarray(SENTINEL).astype(out_type.dtype)
    out_buf, out = guarded(np.full(out_type.shape, sentinel), sentinel)
    module.launch(fn.name, fn.attr("grid"), fn.attr("block"), ins + [out])
    wide = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in inputs]
    expected = np.asarray(problem.ref(wide))
    tol = TOL[out_type.dtype]
    msg = f"{fn.name}: {problem.name}"
    if tol == 0:
        np.testing.assert_array_equal(out, expected, err_msg=msg)
    else:
        scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
        np.testing.assert_allclose(out.astype(np.float64), expected, rtol=tol,
                                   atol=tol * scale * 0.1, err_msg=msg)
    assert (out_buf[:GUARD] == sentinel).all() and (out_buf[GUARD + out.size:] == sentinel).all()


def check_all(tmp_path, cases_: list[tuple[Problem, ReduceConfig]]) -> None:
    built = [(p, cfg, lower(TEMPLATE.build(p.task, cfg, f"red{i}", targets.CUDA)))
             for i, (p, cfg) in enumerate(cases_)]
    units = {f"reduce{u}": print_cuda_module([fn for _, _, fn in built[u::2]])
             for u in range(2)}
    if NVCC:
        cubins = compile_cubins(units, "sm_80", tmp_path / "cubin", ptx=False,
                                include_dirs=[CUDA_INCLUDE_DIR], keep_logs=True)
        report = {}
        for path in cubins["sm_80"].values():
            report.update(ptxas_resources(path))
        assert set(report) == {fn.name for _, _, fn in built}
        for p, cfg, fn in built:
            res = report[fn.name]
            assert res["registers"] <= 255 and res["spills"] == 0, (p.name, cfg, res)
            assert res["stack_bytes"] == 0, (p.name, cfg, res)
            assert res["shared_bytes"] <= cfg.shared_bytes(), (p.name, cfg, res)
    module = kernel_module(units)
    rng = np.random.default_rng(0)
    for p, cfg, fn in built:
        run_case(module, p, fn, rng)


# tests ---------------------------------------------------------------------------------
def test_space_is_hardware_centric_and_fits_the_limits():
    small, big = PROBLEMS[0].task, reduce_problem("ReduceSum", (4096, 4096), [1]).task
    for op in OPS:
        space = config_space(op)
        assert len(space) <= MAX_SPACE and len(set(space)) == len(space)
        assert len(space) == (168 if op in MULTI_PASS else 84)
        for cfg in space:
            assert check_config(cfg) is None
            assert cfg.block_threads <= 1024 and cfg.shared_bytes() <= 48 * 1024
    assert TEMPLATE.space(small, CUDA) == TEMPLATE.space(big, CUDA)
    assert check_config(ReduceConfig(1024, 2, 4, False)) is not None
    assert check_config(ReduceConfig(48, 1, 4, False)) is not None
    for op in OPS:
        assert TEMPLATES[op] is TEMPLATE and supports(op)
    assert TEMPLATE.precisions == ("f32", "f16", "bf16")
    for dtype in (F32, F16):     # what `hidetc inspect --space` reports (OPS[0]: Softmax)
        tasks = representative_tasks(OPS[0], dtype)
        assert [len(TEMPLATE.space(t, CUDA)) for t in tasks.values()] == [168]


def test_row_views():
    v = row_view((2, 1, 3, 4, 5), [2, 3])          # kept 2, reduced 3*4, kept 5: strided
    assert (v.dims, v.reduced, v.rows, v.n, v.contiguous) == ((2, 12, 5), (False, True, False),
                                                              10, 12, False)
    v = row_view((6, 1, 7), [1, 2])                 # trailing: contiguous rows
    assert (v.rows, v.n, v.contiguous, v.buffer_shape()) == (6, 7, True, (6, 7))
    v = row_view((3, 4), [])                        # no reduced dim: rows of one element
    assert (v.rows, v.n, v.contiguous) == (12, 1, True)


@pytest.mark.parametrize("op,rows,n,dtype,expected", [
    ("Softmax", 12 * 128, 128, F32, (32, 8, 4, True)),          # BERT attention
    ("LayerNormalization", 128, 768, F32, (64, 1, 4, True)),    # BERT LayerNorm
    ("GlobalAveragePool", 2048, 49, F32, (32, 8, 1, False)),    # ResNet-50 head
    ("ReduceSum", 1, 1_000_000, F32, (1024, 1, 4, False)),      # one long row
    ("Softmax", 4, 30000, F16, (1024, 1, 8, True)),
    ("ReduceMax", 130, 7, I32, (32, 1, 1, False)),
])
def test_default_config(op, rows, n, dtype, expected):
    view = row_view((rows, n), [1])
    cfg = default_config(op, view, dtype)
    assert (cfg.threads, cfg.rows, cfg.vector, cfg.cache) == expected
    assert cfg in config_space(op)


def test_rules_build_the_default():
    p = layernorm_problem((130, 768))
    fn = build_kernel(p.task, "ln", targets.CUDA)
    cfg = TEMPLATE.default(p.task, CUDA)
    assert fn.attr("block")[0] == cfg.block_threads
    assert fn.attr("grid")[0] == -(-130 // cfg.rows)


def test_sampled_configs_on_awkward_shapes(tmp_path):
    chosen = sampled_cases()
    assert len(chosen) >= 30 + len(PROBLEMS) and {p.task.op for p in PROBLEMS} == set(OPS)
    check_all(tmp_path, chosen)


@pytest.mark.slow
def test_every_config_on_awkward_shapes(tmp_path):
    check_all(tmp_path, cases(lambda p: config_space(p.task.op), 2, 1))
