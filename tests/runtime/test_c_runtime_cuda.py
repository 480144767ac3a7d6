"""The C runtime's cuda path (`runtime/c/cuda*.c`) without a GPU, on hand-made static and
dynamic artifacts run against the fake CUDA driver (`helpers.c_runtime_cuda`). Checked: the
trace holds the plan's launches in order with their grids, blocks, shared bytes and packed
arguments (pointers = the staged input/output buffers, arena + offset, weights + offset;
scalars as a C struct); a graph captured on the first pass (thread-local capture mode) and
replayed after; a dynamic artifact's grids and size arguments at the sizes set, its empty
launches skipped, its graphs in a bounded LRU, its kept-zero region zeroed on a variant
change; io_on_device with the caller's pointers (plain launches until a pointer set
repeats); the caller's stream; a caller's workspace; weights uploaded once per model
whatever the contexts; contexts used from other threads; nothing leaked (the fake counts)."""
from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np
from helpers.c_runtime_cuda import (
    ARENA,
    IMAGES,
    MEMORY,
    OK,
    SHAPE,
    C,
    N,
    W,
    _staging,
    allocations,
    dynamic_artifact,
    host_outputs,
    launch,
    launches,
    needs_gcc,
    static_artifact,
)

from hidetc.backends.runtime.plan_file import write_plan

pytestmark = needs_gcc


# ---------------------------------------------------------------- static artifact


def test_static_pass_launches_the_plan_with_its_arguments_then_replays(cuda, tmp_path):
    root = tmp_path / "static"
    manifest = static_artifact(root)
    w_off = manifest["weights"]["entries"]["w"]["offset"]
    model = cuda.model(root)
    weight_bytes = (root / "weights.bin").stat().st_size
    [(weights, wb)] = allocations(cuda)
    assert wb == weight_bytes
    assert [(kv["dst"], int(kv["bytes"])) for kv in cuda.calls("cuMemcpyHtoD")] == \
        [(hex(weights), weight_bytes)]
    # one module (the sm_90 cubin on the default sm_90 fake); 64 KiB opted in once
    [module] = cuda.calls("cuModuleLoadData")
    assert module["head"] == IMAGES["sm_90"][:16].hex()
    assert [(kv["name"], kv["attribute"], kv["value"]) for kv in
            cuda.calls("cuFuncSetAttribute")] == [("fake_copy", "8", str(64 * 1024))]

    cuda.clear()
    context = cuda.context(model)
    (arena, arena_bytes), (io, nbytes) = allocations(cuda)
    ins, outs, total = _staging(manifest, {})
    assert (arena_bytes, nbytes) == (ARENA, total)
    assert {(int(kv["dst"], 16), int(kv["bytes"])) for kv in cuda.calls("cuMemsetD8")} == \
        {(arena, ARENA), (io, nbytes)}                             # zeroed once
    x_dev, y_dev = io + ins[0], io + outs[0]

    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    for run in range(3):
        cuda.clear()
        outputs = host_outputs()
        assert cuda.run(context, [x], outputs) == OK, cuda.error()
        np.testing.assert_array_equal(outputs[0], x + W[:N])
        np.testing.assert_array_equal(outputs[1], x)
        np.testing.assert_array_equal(outputs[2], C)
        np.testing.assert_array_equal(outputs[3], x + W[:N])
        heads = [h for h, _ in cuda.lines()]
        got = launches(cuda)
        assert [kv["kernel"] for kv in got] == ["fake_add", "scalars", "fake_copy"]
        assert [(kv["grid"], kv["block"], kv["shared"]) for kv in got] == [
            ("4,1,1", "64,1,1", "0"), ("2,3,4", "8,4,2", "0"), ("1,1,1", "32,1,1", "65536")]
        args = [bytes.fromhex(kv["args"]) for kv in got]
        assert args[0] == struct.pack("@QQQq", arena + 256, x_dev, weights + w_off, N)
        assert args[1] == struct.pack("@ifQIdqQ", -7, 0.5, x_dev, 3, 1.25, -1, 2**63 + 5)
        assert args[2] == struct.pack("@QQqi", y_dev, arena + 256, N, 4)
        assert all(kv["graph"] != "-" for kv in got)                  # replayed graphs
        assert len({kv["graph"] for kv in got}) == 1
        # copies: x in, y back (the other outputs are filled on the host)
        assert [(kv["dst"], kv["bytes"]) for kv in cuda.calls("cuMemcpyHtoD")] == \
            [(hex(x_dev), str(4 * N))]
        assert [(kv["src"], kv["bytes"]) for kv in cuda.calls("cuMemcpyDtoH")] == \
            [(hex(y_dev), str(4 * N))]
        assert heads[-1] == "cuStreamSynchronize"
        if run == 0:      # captured on the first pass, thread-local mode, then launched
            [begin] = cuda.calls("cuStreamBeginCapture")
            assert begin["mode"] == "1"
            assert [kv["kernel"] for kv in cuda.calls("capture")] == \
                ["fake_add", "scalars", "fake_copy"]
            assert heads.index("cuStreamEndCapture") < heads.index("cuGraphLaunch")
            graph = got[0]["graph"]
        else:             # later passes: the same graph, nothing captured
            assert "cuStreamBeginCapture" not in heads and "capture" not in heads
            assert [kv["exec"] for kv in cuda.calls("cuGraphLaunch")] == [graph]
    assert cuda.lib.hidetc_context_last_latency_ms(context) == 0.25
    cuda.assert_released()


def test_weights_are_uploaded_once_per_model_whatever_the_contexts(cuda, tmp_path):
    root = tmp_path / "static"
    static_artifact(root)
    model = cuda.model(root)
    weight_bytes = (root / "weights.bin").stat().st_size
    contexts = [cuda.context(model) for _ in range(3)]
    x = np.ones(N, np.float32)
    for context in contexts * 2:
        outputs = host_outputs()
        assert cuda.run(context, [x], outputs) == OK, cuda.error()
        np.testing.assert_array_equal(outputs[0], x + W[:N])
    uploads = [kv for kv in cuda.calls("cuMemcpyHtoD") if int(kv["bytes"]) == weight_bytes]
    assert len(uploads) == 1
    assert len(cuda.calls("cuModuleLoadData")) == 1
    assert len(cuda.calls("cuStreamBeginCapture")) == 3             # a graph per context
    assert cuda.live("streams") == 3 and cuda.live("execs") == 3
    for context in contexts:
        cuda.free_context(context)
    assert cuda.live("execs") == 0 and cuda.live("streams") == 0
    assert cuda.live("allocations") == 1                            # the weights
    cuda.assert_released()


def test_contexts_run_from_other_threads_at_once(cuda, tmp_path):
    """Contexts made on this thread, run on others (the fake's current context is per
    thread: each entry point makes it current), two threads at once."""
    root = tmp_path / "static"
    static_artifact(root)
    model = cuda.model(root)
    contexts = [cuda.context(model) for _ in range(2)]
    problems = []

    def work(k):
        x = np.full(N, float(k + 1), np.float32)
        for _ in range(20):
            outputs = host_outputs()
            status = cuda.run(contexts[k], [x], outputs)
            if status != OK or not np.array_equal(outputs[0], x + W[:N]):
                problems.append((k, status, cuda.error()))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    assert {kv["mode"] for kv in cuda.calls("cuStreamBeginCapture")} == {"1"}
    cuda.assert_released()


def test_caller_stream_runs_the_passes(cuda, tmp_path):
    root = tmp_path / "static"
    static_artifact(root)
    model = cuda.model(root)
    cuda.clear()
    stream = cuda.stream()
    [created] = cuda.calls("cuStreamCreate")
    cuda.clear()
    context = cuda.context(model, stream=stream)
    [own] = cuda.calls("cuStreamCreate")                   # setup work stays on its own
    assert own["stream"] != created["stream"]
    for _ in range(2):
        cuda.clear()
        outputs = host_outputs()
        assert cuda.run(context, [np.zeros(N, np.float32)], outputs) == OK, cuda.error()
        np.testing.assert_array_equal(outputs[0], W[:N])
        assert {kv["stream"] for kv in launches(cuda)} == {created["stream"]}
        assert {kv["stream"] for kv in cuda.calls("cuStreamSynchronize")} == {created["stream"]}
    cuda.assert_released()


def test_io_on_device_uses_the_callers_pointers(cuda, tmp_path):
    """Device pointers in and out; outputs no kernel writes copied device to device; a
    pointer set captured on its second pass, replayed after; new pointers launch plainly."""
    root = tmp_path / "static"
    manifest = static_artifact(root)
    c_off = manifest["weights"]["entries"]["c"]["offset"]
    model = cuda.model(root)
    [(weights, _)] = allocations(cuda)
    context = cuda.context(model, io_on_device=1)
    assert len(allocations(cuda)) == 2                      # weights, arena: no staging
    x = np.arange(N, dtype=np.float32)
    x_dev = cuda.device_alloc(4 * N)
    ctypes.memmove(x_dev, x.ctypes.data, 4 * N)
    sets = [[cuda.device_alloc(4 * N), cuda.device_alloc(4 * N), cuda.device_alloc(32),
             cuda.device_alloc(4 * N)] for _ in range(2)]

    def host(ptr, n):
        return np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr)).copy()

    expect_graph = ["-", "captured", "replayed", "-", "captured"]
    for run, outs in enumerate([sets[0], sets[0], sets[0], sets[1], sets[1]]):
        cuda.clear()
        assert cuda.run(context, [x_dev], outs) == OK, cuda.error()
        np.testing.assert_array_equal(host(outs[0], N), x + W[:N])
        np.testing.assert_array_equal(host(outs[1], N), x)
        np.testing.assert_array_equal(host(outs[2], 8), C)
        np.testing.assert_array_equal(host(outs[3], N), x + W[:N])
        got = launches(cuda)
        assert bytes.fromhex(got[0]["args"])[8:16] == struct.pack("@Q", x_dev)
        assert bytes.fromhex(got[2]["args"])[:8] == struct.pack("@Q", outs[0])
        assert not cuda.calls("cuMemcpyHtoD") and not cuda.calls("cuMemcpyDtoH")
        assert [(int(kv["dst"], 16), int(kv["src"], 16)) for kv in cuda.calls("cuMemcpyDtoD")] \
            == [(outs[1], x_dev), (outs[2], weights + c_off), (outs[3], outs[0])]
        captured = bool(cuda.calls("cuStreamBeginCapture"))
        mode = "-" if got[0]["graph"] == "-" else "captured" if captured else "replayed"
        assert mode == expect_graph[run], run
    cuda.assert_released()


def test_caller_workspace_replaces_the_arena(cuda, tmp_path):
    root = tmp_path / "static"
    static_artifact(root)
    model = cuda.model(root)
    context = cuda.context(model)
    (arena, _), _ = allocations(cuda)[1:]
    x = np.ones(N, np.float32)
    assert cuda.run(context, [x], host_outputs()) == OK
    workspace = cuda.device_alloc(ARENA)
    cuda.clear()
    assert cuda.lib.hidetc_context_set_workspace(context, workspace, ARENA) == OK, cuda.error()
    assert [(int(kv["dst"], 16), int(kv["bytes"])) for kv in cuda.calls("cuMemsetD8")] == \
        [(workspace, ARENA)]                                        # zeroed when set
    assert [int(kv["ptr"], 16) for kv in cuda.calls("cuMemFree")] == [arena]
    assert len(cuda.calls("cuGraphExecDestroy")) == 1               # held the old arena
    cuda.clear()
    outputs = host_outputs()
    assert cuda.run(context, [x], outputs) == OK, cuda.error()
    np.testing.assert_array_equal(outputs[0], x + W[:N])
    assert bytes.fromhex(launches(cuda)[0]["args"])[:8] == struct.pack("@Q", workspace + 256)
    assert cuda.calls("cuStreamBeginCapture")                       # captured again
    # too small for the pass: refused at run
    assert cuda.lib.hidetc_context_set_workspace(context, workspace, 1024) == OK
    assert cuda.run(context, [x], host_outputs()) == MEMORY
    assert "1024" in cuda.error() and str(ARENA) in cuda.error()
    # back to an arena of its own: allocated and zeroed again
    cuda.clear()
    assert cuda.lib.hidetc_context_set_workspace(context, None, 0) == OK, cuda.error()
    [(arena2, size)] = allocations(cuda)
    assert size == ARENA
    assert [int(kv["dst"], 16) for kv in cuda.calls("cuMemsetD8")] == [arena2]
    outputs = host_outputs()
    assert cuda.run(context, [x], outputs) == OK, cuda.error()
    np.testing.assert_array_equal(outputs[0], x + W[:N])
    cuda.assert_released()


# ---------------------------------------------------------------- dynamic artifact


def test_dynamic_grids_sizes_variants_and_graph_cache(cuda, tmp_path):
    root = tmp_path / "dynamic"
    manifest = dynamic_artifact(root, graph_cache=2)
    w_off = manifest["weights"]["entries"]["w"]["offset"]
    model = cuda.model(root)
    [(weights, _)] = allocations(cuda)
    context = cuda.context(model)
    (arena, _), (io, nbytes) = allocations(cuda)[1:]
    assert nbytes == 2 * 1024                       # x and y at n = 256
    x_dev, y_dev = io, io + 1024
    execs = {}
    # the kept-zero region of the pass's variant is zeroed when the variant changes (the
    # first pass: the arena is all zero already)
    zeroed_regions = [[], [(1024, 64)], [(3072, 512)], [], [(1024, 64)]]
    for n, regions in zip((100, 5, 100, 200, 5), zeroed_regions):
        cuda.clear()
        assert cuda.set_shape(context, n) == OK, cuda.error()
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        y = np.full(n, np.nan, np.float32)
        assert cuda.run(context, [x], [y]) == OK, cuda.error()
        np.testing.assert_array_equal(y, x + W[:n])
        at = 0 if n <= 64 else 2048
        got = launches(cuda)
        expected = [("fake_add", f"{(63 + n) // 64},1,1"), ("fake_copy", "1,1,1")]
        if n >= 128:                                      # n // 128 == 0: skipped
            expected.insert(1, ("tail", f"{n // 128},2,1"))
        assert [(kv["kernel"], kv["grid"]) for kv in got] == expected
        assert bytes.fromhex(got[0]["args"]) == struct.pack("@QQQq", arena + at, x_dev,
                                                            weights + w_off, n)
        assert bytes.fromhex(got[-1]["args"]) == struct.pack("@QQqi", y_dev, arena + at, n, 4)
        assert [kv["bytes"] for kv in cuda.calls("cuMemcpyHtoD")] == [str(4 * n)]
        assert [kv["bytes"] for kv in cuda.calls("cuMemcpyDtoH")] == [str(4 * n)]
        assert [(int(kv["dst"], 16) - arena, int(kv["bytes"]))
                for kv in cuda.calls("cuMemsetD8")] == regions, n
        execs.setdefault(n, []).append(got[0]["graph"])
    # graph cache of 2: 100, 5 captured; 100 replayed; 200 evicts 5; 5 again evicts 100
    assert execs[100][0] == execs[100][1]
    assert execs[5][0] != execs[5][1]
    assert cuda.live("execs") == 2
    cuda.assert_released()


def test_a_pass_with_every_launch_empty_launches_nothing(cuda, tmp_path):
    root = tmp_path / "dynamic"
    manifest = dynamic_artifact(root)
    manifest["cuda"]["launches"] = [launch("tail", ["n//128"], [32], [["size", 0]])]
    write_plan(root, manifest)
    context = cuda.context(cuda.model(root))
    for _ in range(2):
        cuda.clear()
        assert cuda.set_shape(context, 5) == OK
        y = np.full(5, np.nan, np.float32)
        assert cuda.run(context, [np.ones(5, np.float32)], [y]) == OK, cuda.error()
        heads = {h for h, _ in cuda.lines()}
        assert not heads & {"launch", "cuStreamBeginCapture", "cuGraphLaunch"}
        np.testing.assert_array_equal(y, 0)          # the staged buffer, zeroed once
    cuda.assert_released()


def test_dynamic_shape_outside_its_range_is_refused(cuda, tmp_path):
    root = tmp_path / "dynamic"
    dynamic_artifact(root)
    context = cuda.context(cuda.model(root))
    assert cuda.set_shape(context, 257) == SHAPE
    assert "257" in cuda.error()
    cuda.assert_released()
