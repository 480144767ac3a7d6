"""The CUDA runtime. Without a GPU: the `cuda` manifest section, image selection, argument
packing, the one-line errors when pycuda or the GPU is missing, and the executor's whole
flow (staging, graph capture and replay, failures) against a fake pycuda driver whose
"kernels" are Python. With a GPU: test_cuda_runtime_gpu.py."""
import re
import struct
import threading

import numpy as np
import pytest
from helpers.cuda_artifact import N, artifact, expected, hammer, launch, pipeline
from helpers.fake_cuda import FakeDriver

from hidetc.backends.runtime.cuda import driver
from hidetc.backends.runtime.cuda import executor as cuda_executor
from hidetc.backends.runtime.cuda.executor import CudaExecutor
from hidetc.backends.runtime.cuda.manifest import ModuleSpec, pack_args, parse_section, select_image
from hidetc.errors import ArtifactError, InputError

# ---------------------------------------------------------------- manifest (pure)


def test_section_errors_name_the_launch():
    base = {"cuda": {"modules": [{"name": "model", "cubins": {"sm_90": "a.cubin"}}],
                     "launches": []}}
    assert parse_section(base).launches == ()
    cases = [(launch("k", [1], [2048], []), "launch 0 (k): grid [1, 1, 1] / block [2048"),
             (launch("k", [0], [1], []), "grid must be 1 to 3 positive integers"),
             (launch("k", [1], [1], [["heap", 0]]), "unknown argument kind 'heap'"),
             (launch("k", [1], [1], [["i32", 1.5]]), "i32 value must be an integer"),
             ({**launch("k", [1], [1], []), "module": "nope"}, "unknown module 'nope'")]
    for raw, message in cases:
        base["cuda"]["launches"] = [raw]
        with pytest.raises(ArtifactError, match=re.escape(message)):
            parse_section(base)
    with pytest.raises(ArtifactError, match="needs a 'cuda' section"):
        parse_section({})


def test_image_selection():
    both = ModuleSpec("m", {"sm_80": "80.cubin", "sm_90": "90.cubin"}, ("compute_90", "m.ptx"))
    assert select_image(both, (9, 0)) == ("90.cubin", "cubin sm_90")
    assert select_image(both, (8, 6))[0] == "80.cubin"          # same major, older minor
    assert select_image(both, (10, 0))[0] == "m.ptx"            # newer GPU: JIT the PTX
    with pytest.raises(ArtifactError, match="sm_75, which hidetc does not support"):
        select_image(both, (7, 5), "Tesla T4")
    only80 = ModuleSpec("m", {"sm_80": "80.cubin"})
    with pytest.raises(ArtifactError, match="artifact has sm_80 but this GPU is sm_90; "
                                            "recompile with --arch sm_90"):
        select_image(only80, (9, 0))


def test_pack_args_follows_the_c_abi():
    section = parse_section({"cuda": {"modules": [{"name": "model", "cubins": {"sm_90": "x"}}],
                                      "launches": [launch("k", [1], [1], [
                                          ["i32", 7], ["input", 0], ["weights", 64],
                                          ["f32", 0.5], ["arena", 16], ["output", 1]])]}})
    (spec,) = section.launches
    buf = pack_args(spec, [1000], [2000, 3000], (4096, 64), (8192, 128))
    assert struct.unpack("@iQQfQQ", buf) == (7, 1000, 8192 + 64, 0.5, 4096 + 16, 3000)
    assert len(buf) == 4 + 4 + 8 + 8 + 4 + 4 + 8 + 8        # padding before each pointer
    with pytest.raises(ArtifactError, match="points past the arena"):
        pack_args(spec, [1000], [2000, 3000], (4096, 8), (8192, 128))


# ---------------------------------------------------------------- missing pycuda / GPU


def test_missing_pycuda_is_one_line(tmp_path):
    try:
        import pycuda  # noqa: F401
        pytest.skip("pycuda is installed here")
    except ImportError:
        pass
    with pytest.raises(ArtifactError, match=r"^pycuda is not installed: pip install "
                                            r"'hidetc\[cuda\]'$"):
        CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "a.cubin"}))


def test_missing_driver_or_gpu_messages():
    def no_libcuda(name):
        raise ImportError("libcuda.so.1: cannot open shared object file: No such file")
    with pytest.raises(ArtifactError, match=r"^this artifact targets cuda but no CUDA GPU is "
                                            r"visible \(pycuda: libcuda.so.1: cannot open"):
        driver.import_pycuda_driver(no_libcuda)

    def no_pytools(name):
        raise ModuleNotFoundError("No module named 'pytools'", name="pytools")
    with pytest.raises(ArtifactError, match="pycuda cannot be imported"):
        driver.import_pycuda_driver(no_pytools)
    fake = FakeDriver(init_error="cuInit failed: no CUDA-capable device is detected")
    with pytest.raises(ArtifactError, match="no CUDA GPU is visible .pycuda: cuInit failed"):
        driver._open(lambda name: fake)


def test_fake_flow_graph_replay_matches_numpy(fake, tmp_path):
    ex = CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "a.cubin"}))
    assert ex.uses_graph and fake.launched == ["scale_bias", "relu_reverse"] * 2  # warm-up
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal(N, dtype=np.float32)
        np.testing.assert_array_equal(ex.run({"x": x})["y"], expected(x))
    assert ex.last_latency_ms == 0.25 and len(fake.launched) == 8
    ex.close()
    assert fake.graphs.destroyed == [100]


def test_fake_other_thread_and_measure(fake, tmp_path):
    ex = CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "a.cubin"}))
    x = np.ones(N, np.float32)
    result = {}
    worker = threading.Thread(target=lambda: result.update(ex.run({"x": x})))
    worker.start()
    worker.join()
    np.testing.assert_array_equal(result["y"], expected(x))
    assert ex.measure(repeat=3, warmup=1) == [0.25] * 3


def test_fake_threads_each_get_a_context(fake, tmp_path):
    ex = CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "a.cubin"}), max_contexts=3)
    # the first 3 uploads wait for each other: 3 passes in flight at once, whatever the
    # timing (a thread in a pass holds its context, so 3 contexts are made)
    fake.rendezvous = threading.Barrier(3)
    assert not hammer(ex, threads=6, runs=15)
    contexts = ex.pool._idle                                 # all back, the first among them
    assert ex._primary in contexts and ex.pool.created == len(contexts) == 3
    arenas = {c._shape.prepared[0][3] for c in contexts}     # packed args: own arena, I/O
    assert len(arenas) == len(contexts) and len(fake.graphs.graphs) == len(contexts)
    with ex.context() as own:                                # a caller's own: its graph
        x = np.ones(N, np.float32)
        np.testing.assert_array_equal(own.run({"x": x})["y"], expected(x))
    ex.close()
    assert sorted(fake.graphs.destroyed) == sorted(fake.graphs.graphs)


def test_fake_profile_times_each_launch_outside_the_graph(fake, tmp_path):
    ex = CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "a.cubin"}))
    fake.launched.clear()
    x = np.random.default_rng(3).standard_normal(N, dtype=np.float32)
    assert ex.profile({"x": x}, repeat=3) == [0.25, 0.25]    # the fake's event interval
    assert fake.launched == ["scale_bias", "relu_reverse"] * 4  # warm-up + 3, not replays
    np.testing.assert_array_equal(fake.read(ex._primary._outputs[0].device, 4 * N, np.float32),
                                  expected(x))
    with pytest.raises(InputError, match=r"input 'x': expected shape \[16384\], got \[7\]"):
        ex.profile({"x": x[:7]})


def test_fake_flow_without_graph_api(fake, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(driver._SESSION, "graphs", None)
    monkeypatch.setattr(driver._SESSION, "graph_unavailable", "no cuGraphLaunch")
    ex = CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "a.cubin"}))
    assert not ex.uses_graph and ex.graph_unavailable == "no cuGraphLaunch"
    x = np.ones(N, np.float32)
    np.testing.assert_array_equal(ex.run({"x": x})["y"], expected(x))


def test_fake_replay_fault_is_located_and_final(fake, tmp_path, monkeypatch):
    manifest = artifact(tmp_path, {"sm_90": "a.cubin"})
    offset = manifest["cuda"]["launches"][0]["args"][1][1]
    manifest["cuda"]["launches"] = pipeline(offset, [
        launch("trap_if_positive", [1], [1], [["input", 0]])])
    seen = []
    monkeypatch.setattr(cuda_executor, "locate_failure",
                        lambda path, m, inputs, timeout: seen.append((inputs, timeout)) or
                        "kernel launch 1 failed")
    ex = CudaExecutor(tmp_path, manifest, locate_timeout_s=42)  # zero inputs: warm-up passes
    with pytest.raises(ArtifactError, match="^kernel launch 1 failed$"):
        ex.run({"x": np.ones(N, np.float32)})
    assert seen and seen[0][0]["x"][0] == 1 and seen[0][1] == 42
    for retry in (lambda: ex.run({"x": np.ones(N, np.float32)}),
                  lambda: CudaExecutor(tmp_path, manifest)):
        with pytest.raises(ArtifactError, match="unusable in this process after a GPU fault"):
            retry()


def test_fake_warm_up_fault_names_the_kernel(fake, tmp_path):
    manifest = artifact(tmp_path, {"sm_90": "a.cubin"})
    manifest["cuda"]["launches"].insert(1, launch("trap_if_positive", [1], [1],
                                                   [["weights", 4 * (2 * N - 1)]]))
    with pytest.raises(ArtifactError, match=r"kernel launch 1 \(trap_if_positive, grid "
                                            r"\[1, 1, 1\], block \[1, 1, 1\].*launch failure"):
        CudaExecutor(tmp_path, manifest)


def test_fake_errors(fake, tmp_path):
    manifest = artifact(tmp_path, {"sm_90": "a.cubin"}, arena=1 << 40)
    with pytest.raises(ArtifactError, match=r"out of GPU memory: the activation arena needs "
                                            r"1,099,511,627,776 bytes but only 268,435,456 of"):
        CudaExecutor(tmp_path, manifest)
    manifest = artifact(tmp_path, {"sm_90": "a.cubin"})
    manifest["cuda"]["launches"][0]["kernel"] = "missing"
    with pytest.raises(ArtifactError, match="kernel 'missing' is not in module 'model'"):
        CudaExecutor(tmp_path, manifest)
    with pytest.raises(ArtifactError, match="missing.cubin: listed in the manifest but missing"):
        CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "missing.cubin"}))


def _run_in_thread(ex, x):
    """`ex.run({"x": x})` on a thread of its own: the thread and where its result lands."""
    result: dict = {}

    def work():
        try:
            result.update(ex.run({"x": x}))
        except Exception as exc:  # noqa: BLE001  (checked by the caller)
            result["error"] = exc
    worker = threading.Thread(target=work)
    worker.start()
    return worker, result


def test_fake_bad_input_keeps_the_context_and_its_graph(fake, tmp_path):
    ex = CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "a.cubin"}))
    first = ex._primary
    x = np.ones(N, np.float32)
    for bad in ({"x": x[:7]}, {"x": x.astype(np.float64)}, {"z": x}, {}):
        with pytest.raises(InputError):
            ex.run(bad)
    np.testing.assert_array_equal(ex.run({"x": x})["y"], expected(x))
    assert ex.pool.created == 1 and ex.pool._idle == [first] and first.uses_graph
    assert ex.uses_graph and fake.graphs.destroyed == []
    ex.replay()                                              # the first context still works
    ex.synchronize()
    ex.close()
    assert fake.graphs.destroyed == [100]


def test_fake_close_waits_for_a_pass_in_flight(fake, tmp_path):
    ex = CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "a.cubin"}))
    weights = ex._weights[0]
    fake.graphs.hold = threading.Event()
    x = np.random.default_rng(5).standard_normal(N, dtype=np.float32)
    worker, result = _run_in_thread(ex, x)
    assert fake.graphs.held.wait(5)                          # the pass is in its replay
    ex.close()
    assert weights in fake.blocks and fake.graphs.destroyed == []   # still in use
    with pytest.raises(ArtifactError, match="^this model was closed; load it again"):
        ex.run({"x": x})
    fake.graphs.hold.set()
    worker.join()
    np.testing.assert_array_equal(result["y"], expected(x))         # weights were there
    assert weights not in fake.blocks and fake.graphs.destroyed == [100]
    assert ex.pool.created == 0
    for call in (ex.replay, ex.synchronize, lambda: ex.measure(repeat=1)):
        with pytest.raises(ArtifactError, match="closed"):
            call()


def test_fake_callers_context_refuses_after_close_and_keeps_the_weights(fake, tmp_path):
    ex = CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "a.cubin"}))
    weights = ex._weights[0]
    x = np.ones(N, np.float32)
    own = ex.context()
    np.testing.assert_array_equal(own.run({"x": x})["y"], expected(x))
    ex.close()
    assert weights in fake.blocks                           # the caller's context lives
    with pytest.raises(ArtifactError, match="^this model was closed; load it again"):
        own.run({"x": x})
    with pytest.raises(ArtifactError, match="^this model was closed; load it again"):
        ex.context()
    own.close()
    assert weights not in fake.blocks and sorted(fake.graphs.destroyed) == [100, 101]


def test_fake_context_setups_wait_for_a_capture(fake, tmp_path):
    """A context's setup synchronizes the whole CUDA context, which CUDA refuses while
    another stream captures: contexts made on two threads at once are made in turn."""
    ex = CudaExecutor(tmp_path, artifact(tmp_path, {"sm_90": "a.cubin"}))
    fake.graphs.capture_hold = threading.Event()
    made, errors = [], []

    def make():
        try:
            made.append(ex.context())
        except Exception as exc:  # noqa: BLE001  (checked below)
            errors.append(exc)
    first = threading.Thread(target=make)
    first.start()
    assert fake.graphs.capture_held.wait(5)                  # the first one is capturing
    second = threading.Thread(target=make)
    second.start()
    second.join(0.2)
    assert second.is_alive() and not errors                  # waits for the capture
    fake.graphs.capture_hold.set()
    first.join()
    second.join()
    assert not errors and len(made) == 2
    x = np.ones(N, np.float32)
    for own in made:
        np.testing.assert_array_equal(own.run({"x": x})["y"], expected(x))
        own.close()
    ex.close()
