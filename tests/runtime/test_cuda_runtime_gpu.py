"""The CUDA runtime on a real GPU (`pytest -m gpu`; the GPU check's runtime step):
hand-written kernels compiled by hidetc.backends.toolchain.nvcc, run through CudaExecutor and
compared with numpy: graph capture and replay, dynamic shared memory above 48 KB, the
per-launch profile, module load per arch (cubin and PTX JIT), fault location, errors."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers.cuda_artifact import N, artifact, expected, hammer, launch, pipeline

from hidetc.backends.runtime.cuda import driver
from hidetc.backends.runtime.cuda.executor import CudaExecutor
from hidetc.backends.toolchain.cache import BuildCache
from hidetc.backends.toolchain.nvcc import compile_cubins
from hidetc.errors import ArtifactError

ROOT = str(Path(__file__).resolve().parents[2])


# ---------------------------------------------------------------- on a real GPU

CUDA_SOURCE = r"""
extern "C" __global__ void scale_bias(const float *x, const float *w, float *tmp, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) tmp[i] = x[i] * w[i] + w[n + i];
}
extern "C" __global__ void relu_reverse(const float *tmp, float *y, int n) {
  extern __shared__ float s[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = tmp[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = s[n - 1 - i];
    y[i] = v > 0.f ? v : 0.f;
  }
}
extern "C" __global__ void trap_if_positive(const float *x) { if (x[0] > 0.f) __trap(); }
"""


@pytest.fixture(scope="module")
def gpu_kernels(tmp_path_factory):
    reason = None
    try:
        gpu = driver.session()
    except ArtifactError as exc:
        reason = str(exc)
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("cuda_artifact")
    built = compile_cubins({"model": CUDA_SOURCE}, [gpu.arch], root / "kernels",
                           cache=BuildCache(root / "cache"))
    rel = str(built[gpu.arch]["model"].relative_to(root))
    return root, gpu, {gpu.arch: rel}


def _child(code: str, *args: str, env=None) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               **(env or {}))
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=300, env=env)
    return proc.stdout + proc.stderr


CHILD = """
import json, sys
from pathlib import Path
import numpy as np
from hidetc.errors import HidetcError
from hidetc.backends.runtime.cuda import CudaExecutor
try:
    ex = CudaExecutor(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))
    for _ in range(2):
        ex.run({"x": np.ones(%d, np.float32)})
except HidetcError as exc:
    print("ERROR:", exc)
""" % N


@pytest.mark.gpu
def test_gpu_graph_matches_numpy_and_replays_cheaply(gpu_kernels):
    root, gpu, cubins = gpu_kernels
    ex = CudaExecutor(root, artifact(root, cubins))
    assert ex.uses_graph, ex.graph_unavailable
    eager = CudaExecutor(root, artifact(root, cubins), use_graph=False)
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal(N, dtype=np.float32)
        np.testing.assert_allclose(ex.run({"x": x})["y"], expected(x), rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(eager.run({"x": x})["y"], ex.run({"x": x})["y"])
        assert ex.last_latency_ms > 0
    host = []
    for i in range(1000):
        start = time.perf_counter_ns()
        ex.replay()
        host.append(time.perf_counter_ns() - start)
        if i % 50 == 49:
            ex.synchronize()
    ex.synchronize()
    runs = []
    for _ in range(200):
        start = time.perf_counter_ns()
        ex.run({"x": x})
        runs.append((time.perf_counter_ns() - start) / 1e3 - ex.last_latency_ms * 1e3)
    print(f"replay host {np.median(host) / 1e3:.1f} us, run() host overhead "
          f"{np.median(runs):.1f} us on {gpu.describe()}")
    assert np.median(host) / 1e3 < 20


@pytest.mark.gpu
def test_gpu_threads_each_get_a_context(gpu_kernels):
    """Passes from 8 threads on one loaded model: each on its own stream, arena, I/O and
    graph (contexts made on other threads than the session's), the same bits as numpy."""
    root, gpu, cubins = gpu_kernels
    ex = CudaExecutor(root, artifact(root, cubins))
    assert not hammer(ex, threads=8, runs=50)
    assert 1 <= ex.pool.created <= ex.pool.limit
    assert all(c.uses_graph for c in ex.pool._idle), ex.graph_unavailable
    start = time.perf_counter()
    assert not hammer(ex, threads=4, runs=200)
    print(f"4 threads x 200 runs: {800 / (time.perf_counter() - start):.0f} runs/s on "
          f"{gpu.describe()} ({ex.pool.created} contexts)")
    ex.close()


@pytest.mark.gpu
def test_gpu_profile_times_every_launch(gpu_kernels):
    root, gpu, cubins = gpu_kernels
    ex = CudaExecutor(root, artifact(root, cubins))
    x = np.random.default_rng(4).standard_normal(N, dtype=np.float32)
    times = ex.profile({"x": x}, repeat=20)
    assert len(times) == 2 and all(t > 0 for t in times), times
    np.testing.assert_allclose(ex.run({"x": x})["y"], expected(x), rtol=1e-6, atol=1e-6)
    print(f"profile ms {times} on {gpu.describe()}")


@pytest.mark.gpu
def test_gpu_module_load_per_arch(gpu_kernels, tmp_path):
    """The cubin for this GPU, and the PTX of an older compute capability JIT-compiled by
    the driver (the image a GPU newer than the artifact's archs gets), both run the
    pipeline (test_gpu_errors: a cubin of the other family is refused)."""
    root, gpu, cubins = gpu_kernels
    ptx_arch = "sm_80"
    built = compile_cubins({"model": CUDA_SOURCE}, [ptx_arch], root / "kernels_ptx",
                           cache=BuildCache(root / "cache"), ptx=True)
    ptx = next(files["model"] for key, files in built.items() if key.startswith("compute_"))
    ptx_key = next(key for key in built if key.startswith("compute_"))
    x = np.random.default_rng(5).standard_normal(N, dtype=np.float32)
    for cubin_map, extra in ((cubins, None),
                             ({}, {"arch": ptx_key, "file": str(ptx.relative_to(root))})):
        ex = CudaExecutor(root, artifact(root, cubin_map, ptx=extra))
        np.testing.assert_allclose(ex.run({"x": x})["y"], expected(x), rtol=1e-6, atol=1e-6)
        ex.close()


@pytest.mark.gpu
def test_gpu_kernel_faults_name_the_kernel(gpu_kernels):
    root, gpu, cubins = gpu_kernels
    manifest = artifact(root, cubins)
    offset = manifest["cuda"]["launches"][0]["args"][1][1]
    manifest["cuda"]["launches"] = pipeline(offset, [
        launch("trap_if_positive", [1], [1], [["input", 0]])])
    (root / "trap.json").write_text(json.dumps(manifest))
    out = _child(CHILD, str(root), str(root / "trap.json"))   # faults at replay: located
    assert "ERROR: kernel launch 1 (trap_if_positive, grid [1, 1, 1]" in out, out
    manifest["cuda"]["launches"][1]["args"] = [["weights", offset + 4 * (2 * N - 1)]]
    (root / "trap.json").write_text(json.dumps(manifest))
    out = _child(CHILD, str(root), str(root / "trap.json"))   # faults at warm-up
    assert "ERROR: kernel launch 1 (trap_if_positive" in out, out


@pytest.mark.gpu
def test_gpu_errors(gpu_kernels):
    root, gpu, cubins = gpu_kernels
    other = "sm_90" if gpu.capability[0] == 8 else "sm_80"
    with pytest.raises(ArtifactError, match=f"artifact has {other} but .* is {gpu.arch}; "
                                            f"recompile with --arch {gpu.arch}"):
        CudaExecutor(root, artifact(root, {other: next(iter(cubins.values()))}))
    with pytest.raises(ArtifactError, match=r"out of GPU memory: the activation arena needs "
                                            r"1,125,899,906,842,624 bytes but only"):
        CudaExecutor(root, artifact(root, cubins, arena=1 << 50))
    (root / "ok.json").write_text(json.dumps(artifact(root, cubins)))
    out = _child(CHILD, str(root), str(root / "ok.json"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert "ERROR: this artifact targets cuda but no CUDA GPU is visible (pycuda:" in out, out
