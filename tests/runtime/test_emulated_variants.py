"""The emulator's contexts across dispatch variants: each variant lays out its own arena,
so a variant's kept-zero region (split-K's arrival counters, `sizes.kept_zero`) may sit
where another variant's activations were; a pass that changes the variant zeroes its
region first, as the cuda context and the C runtime do. A hand-made artifact: variant 0
(n <= 64) writes x + 1 into the arena at 0; variant 1 keeps an arrival counter there
(add one, read the old value, reset to zero, as split-K's last block does) and writes
x + the old value: x itself whenever the counter started at zero."""
from __future__ import annotations

import numpy as np
import pytest
from helpers.cuda_artifact import artifact, launch

from hidetc.backends.runtime.emulated import EmulatedCudaExecutor

SOURCE = r"""
#include "hidetc_cuda.h"

extern "C" __global__ void fill(const float *x, float *a, long long n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = x[i] + 1.0f;
}

extern "C" __global__ void copy_out(const float *a, float *y, long long n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] - 1.0f;
}

extern "C" __global__ void arrive(unsigned *counter, const float *x, float *y, long long n) {
  __shared__ unsigned old;
  if (threadIdx.x == 0) {
    old = atomicAdd(counter, 1u);
    *counter = 0u;
  }
  __syncthreads();
  for (long long i = threadIdx.x; i < n; i += blockDim.x) y[i] = x[i] + (float)old;
}

#ifdef HIDETC_EMULATE
extern "C" void fill_emu_entry(void **a) {
  fill((const float *)a[0], (float *)a[1], *(long long *)a[2]);
}
extern "C" void copy_out_emu_entry(void **a) {
  copy_out((const float *)a[0], (float *)a[1], *(long long *)a[2]);
}
extern "C" void arrive_emu_entry(void **a) {
  arrive((unsigned *)a[0], (const float *)a[1], (float *)a[2], *(long long *)a[3]);
}
#endif
"""


def two_variant_artifact(root) -> dict:
    (root / "kernels" / "src").mkdir(parents=True)
    (root / "kernels" / "src" / "model.cu").write_text(SOURCE)
    manifest = artifact(root, {"sm_90": "a.cubin"}, arena=1024)
    manifest["inputs"][0]["shape"] = ["n"]
    manifest["outputs"][0]["shape"] = ["n"]
    manifest["cuda"]["launches"] = [
        launch("fill", ["((63 + n)//64)"], [64], [["input", 0], ["arena", 0], ["size", 0]]),
        launch("copy_out", ["((63 + n)//64)"], [64], [["arena", 0], ["output", 0],
                                                      ["size", 0]])]
    manifest["cuda"]["variant_launches"] = [[
        launch("arrive", [1], [128], [["arena", 0], ["input", 0], ["output", 0],
                                      ["size", 0]])]]
    manifest["dynamic"] = {"symbols": {"n": {"min": 1, "max": 256, "opts": [16]}},
                           "order": ["n"], "graph_cache": 4,
                           "variants": [{"guards": ["-64 + n <= 0"], "forward": "v0"},
                                        {"guards": ["-65 + n >= 0"], "forward": "v1",
                                         "memory": {"offsets": {"scratch.zeroed": 0},
                                                    "bytes": {"scratch.zeroed": 4}}}]}
    return manifest


@pytest.mark.parametrize("order", [(8, 100, 64, 200, 100), (100, 100, 5, 256)])
def test_a_variant_change_zeroes_the_new_variants_counters(tmp_path, order):
    ex = EmulatedCudaExecutor(tmp_path, two_variant_artifact(tmp_path))
    rng = np.random.default_rng(0)
    for n in order:
        x = rng.uniform(1, 2, n).astype(np.float32)
        y = ex.run({"x": x})["y"]
        np.testing.assert_allclose(y, x, rtol=1e-6, err_msg=f"n = {n}")
    ex.close()
