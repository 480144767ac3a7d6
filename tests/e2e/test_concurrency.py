"""Many threads on one loaded model (issue 33): every pass on an execution context of its
own, so results are bit-identical to a single thread's, whatever the threads, the
intra-op thread counts and the interleaving.

- the five tiny benchmark models on the cpu target (ResNet's residual Adds write in
  place over their input: a pass sharing an arena would clobber another's), 8 threads,
  each with inputs of its own (a pass reading another's arena shows as a wrong result,
  not hidden behind equal inputs), against the same inputs run alone on one thread;
- the intra-op thread count never changes a bit (the pool shares the cores out);
- threads that come and go reuse the pooled contexts, and the per-thread scratch
  stacks of the kernels are freed when their threads end (the heap does not grow);
- an exception in one thread's pass leaves the others correct and its context is not
  lent again (the next pass gets a fresh one); a refused input (InputError, before any
  kernel) keeps its context;
- a cuda model whose MatMuls run split K (a workspace and arrival counters in the
  arena) in the emulator from 4 threads, same bits as alone.
The full-scale check (8 threads x 1,000 runs of each model) is `bench/concurrency.py
soak`; the numbers are in bench/results.
"""
from __future__ import annotations

import ctypes
import shutil
import threading

import numpy as np
import onnx
import pytest
from helpers.split_k_model import split_k_model
from helpers.threads import in_threads
from onnx import TensorProto, helper, numpy_helper

import hidetc
import models
from hidetc.backends.codegen.c_scratch import STACK_ALLOC_LIMIT
from hidetc.errors import InputError

NAMES = sorted(models.REGISTRY)
THREADS, RUNS = 8, 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """name -> (artifact dir, model proto), compiled for the cpu once for the module."""
    root = tmp_path_factory.mktemp("concurrency")
    built = {}
    for name in NAMES:
        proto = models.build(name, tiny=True)
        path = root / f"{name}.onnx"
        models.save(proto, path)
        hidetc.compile_model(path, root / name, target="cpu")
        built[name] = (root / name, proto)
    return built


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k], equal_nan=True) and a[k].dtype == b[k].dtype for k in a)


@pytest.mark.parametrize("name", NAMES)
def test_threads_get_a_single_threads_bits(name, tiny):
    out, proto = tiny[name]
    model = hidetc.load(out)
    feeds = [models.sample_inputs(proto, seed=k) for k in range(THREADS)]
    model.set_threads(1)
    alone = [model.run(f) for f in feeds]
    model.set_threads(0)                          # back to the pool's shares
    wrong: list[tuple[int, int]] = []

    def work(k: int) -> None:
        for r in range(RUNS):
            if not _same(model.run(feeds[k]), alone[k]):
                wrong.append((k, r))
    assert not in_threads(THREADS, work)
    assert not wrong, f"{len(wrong)} of {THREADS * RUNS} results differ"
    assert 1 <= model._executor.pool.created <= model.max_contexts
    if name == "resnet50":                        # the in-place case is covered
        assert model.manifest["memory"]["in_place"]


@pytest.mark.parametrize("name", NAMES)
def test_intra_op_threads_change_no_bit(name, tiny):
    out, proto = tiny[name]
    model = hidetc.load(out)
    feeds = models.sample_inputs(proto, seed=5)
    results = []
    for threads in (1, 2, 3, 5):
        with model.context(threads=threads) as own:
            results.append(own.run(feeds))
            assert own.arena_bytes >= model.manifest["memory"]["arena_bytes"]
    assert all(_same(results[0], r) for r in results[1:])


def _matmul_model(path) -> None:
    """A MatMul whose packed-A panel (512 KiB) comes from the kernels' scratch stack."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((2048, 256)) * 0.02).astype(np.float32),
                                "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "scratch", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 2048])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                                                "hblkhd", "usmblks", "fsmblks", "uordblks",
                                                "fordblks", "keepcost")]


def _heap_in_use() -> int:
    """Bytes malloc has handed out and not taken back, over every arena (glibc)."""
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("this C library has no mallinfo2 (glibc >= 2.33)")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def test_threads_that_come_and_go_leak_nothing(tmp_path):
    _matmul_model(tmp_path / "mm.onnx")
    hidetc.compile_model(tmp_path / "mm.onnx", tmp_path / "out", target="cpu")
    sources = "".join(p.read_text() for p in (tmp_path / "out/kernels/src").glob("*.c"))
    assert "hidetc_scratch_push(sizeof" in sources          # the scratch stack is used
    model = hidetc.load(tmp_path / "out")
    assert model.manifest["memory"]["scratch_bytes_per_thread"] > STACK_ALLOC_LIMIT
    x = {"x": np.random.default_rng(1).standard_normal((64, 2048)).astype(np.float32)}
    alone = model.run(x)

    def one_pass(results: list) -> None:
        results.append(_same(model.run(x), alone))       # keep no output: heap counted
    results: list = []
    for _ in range(2):                                      # warm: pools, arenas
        t = threading.Thread(target=one_pass, args=(results,))
        t.start()
        t.join()
    before = _heap_in_use()
    for _ in range(30):
        t = threading.Thread(target=one_pass, args=(results,))
        t.start()
        t.join()
    grown = _heap_in_use() - before
    # each thread's scratch stack is 512 KiB: 30 leaked would be 15 MiB and more
    assert grown < 4 << 20, f"the heap grew {grown:,} bytes over 30 short-lived threads"
    assert all(results) and len(results) == 32
    assert model._executor.pool.created == 1              # one context, reused


def _failing_hook(when: str, step: int, place) -> None:
    if step == 3:
        raise RuntimeError("the caller's hook failed mid-pass")


def test_a_failed_pass_drops_its_context_a_refused_input_does_not(tiny):
    out, proto = tiny["resnet50"]
    model = hidetc.load(out, max_contexts=1)
    pool, feeds = model._executor.pool, models.sample_inputs(proto, seed=0)
    alone = model.run(feeds)
    (first,) = pool._idle
    for bad in ({**feeds, "extra": feeds[next(iter(feeds))]}, {}):
        with pytest.raises(InputError):
            model.run(bad)
    assert pool._idle == [first] and pool.created == 1          # kept, as it was
    assert _same(model.run(feeds), alone) and pool._idle == [first]
    with pytest.raises(RuntimeError, match="mid-pass"):
        model.run_with_hook(feeds, _failing_hook)
    assert pool.created == 0 and not pool._idle                 # dropped
    assert _same(model.run(feeds), alone)
    (fresh,) = pool._idle
    assert fresh is not first and pool.created == 1


def test_an_exception_in_one_thread_leaves_the_others_correct(tiny):
    out, proto = tiny["resnet50"]
    model = hidetc.load(out, max_contexts=3)
    pool = model._executor.pool
    feeds = [models.sample_inputs(proto, seed=k) for k in range(4)]
    alone = [model.run(f) for f in feeds]
    assert pool.created == 1                                    # one thread: one context
    make, made = pool._make, []
    pool._make = lambda threads: made.append(threads) or make(threads)
    wrong, raised = [], []

    def work(k: int) -> None:
        for r in range(6):
            if k == 0:
                try:
                    model.run_with_hook(feeds[0], _failing_hook)
                except RuntimeError:
                    raised.append(r)
            elif not _same(model.run(feeds[k]), alone[k]):
                wrong.append((k, r))
    assert not in_threads(4, work)
    assert raised == list(range(6)) and not wrong
    # every failed pass closed its context: those alive are those made less those dropped
    assert pool.created == 1 + len(made) - len(raised)
    assert pool.created <= 3 and pool.idle == pool.created
    assert _same(model.run(feeds[0]), alone[0])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_split_k_in_the_emulator_from_several_threads(tmp_path):
    proto = split_k_model()
    path = tmp_path / "model.onnx"
    models.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cuda", precision="f16",
                                  gpu="a100")
    assert any("splits=1)" not in (k.get("config") or "") for k in result.manifest["kernels"]
               if k.get("template") == "cuda.matmul_tc")
    model = hidetc.load(tmp_path / "out", emulate=True)
    feeds = [models.sample_inputs(proto, seed=k) for k in range(4)]
    alone = [model.run(f) for f in feeds]
    wrong: list = []

    def work(k: int) -> None:
        for r in range(2):
            if not _same(model.run(feeds[k]), alone[k]):
                wrong.append((k, r))
    assert not in_threads(4, work)
    assert not wrong
    assert 2 <= model._executor.pool.created <= model.max_contexts
