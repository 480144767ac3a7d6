"""The graph optimization pipeline: ONE explicit, ordered list of named passes.

Reading `PASSES` tells the story:
  1. remove_identity      Identity/Dropout out of the way first, so that patterns
                          (Conv -> BN, Reshape -> Reshape, duplicates) are adjacent.
  2. fold_constants       Shape/Size and all-constant nodes become constants: exporter
                          shape arithmetic collapses, weights computed from constants
                          (Transpose/Cast of a weight) become plain constants, which
                          the canonicalizations below require.
  3. eliminate_dead_code  drop what folding orphaned, so that use counts are honest
                          ("Conv output used only by the BN").
  4. canonicalize_gemm    Gemm -> MatMul (+ Mul) (+ Add), transposes folded into weights.
  5. fold_batchnorm       Conv + BN -> Conv; other BN -> Mul + Add.
  6. canonicalize_shapes  Flatten/Squeeze/Unsqueeze/Reshape -> Reshape(static shape),
                          chains merged, no-ops removed, Split -> Slices.
  7. fold_constants       canonicalization may leave all-constant nodes behind.
  8. simplify_pow         Pow(x, c), c a constant in {1, 2, 3, 4, 0.5, -1} -> x, Mul(s),
                          Sqrt, Reciprocal (GELU's Pow(x, 3): libm powf keeps the fused
                          loop scalar); after folding, so computed exponents are constants.
  9. flatten_concats      Concat(a, Concat(b, c)) on one axis -> Concat(a, b, c) when the
                          inner one has no other reader: every input a branch output
                          its producer can write into (concat without copies).
 10. eliminate_common_subexpressions
                          after canonicalization, equal things look equal (shape
                          constants, duplicated branches).
 11. eliminate_dead_code  sweep everything the passes above orphaned.

Then, once the graph is optimized, the precision lowering `PRECISION_PASSES[precision]`
(run by `lower_precision`, after `optimize`, by the compile):
  f32: nothing.
  f16: to_float16      float32 tensors -> float16 storage (weights converted), the
                       interface kept float32 by Casts after the inputs and before the
                       outputs, parameter inputs untouched. The graph verifier always
                       runs after it (the types are all rewritten).
  bf16: nothing here: the targets differ (the cpu keeps float32 tensors, cuda stores
                       bfloat16), so each backend lists its own.
Then the target's passes, which its backend lists (`hidetc.driver.backend`, its
`graph_passes(precision)`), from the pieces here:
  cpu:  widen_half_cpu  MatMul/Conv on float16/bfloat16 -> float32 between Casts (the
                        CPU templates are float32-only; numpy sums half products in f32).
        layout_passes(wants_nhwc_cpu)
                        choose_layout: Conv with one group or C/G >= 8, and depthwise
                        Conv -> ConvNHWC (channels-last kernels, OHWI weights),
                        transposes sunk through elementwise ops, channel Concats, pools
                        and global pools, so CNNs stay NHWC from the first convolution
                        to the head; hoist_transposes: the NHWC transpose before a
                        convolution moved above channel Concats and spatial Resizes of
                        NCHW values (SegFormer's head); fold_movement_chains:
                        Transpose/Reshape chains that move no element (what the layout
                        pass leaves where NHWC meets the model's reshuffles) -> Reshape.
  cuda: to_bfloat16     bf16 only (`CUDA_BF16_PASSES`): `to_float16.run` with dtype
                        bfloat16, float32 tensors -> bfloat16 storage as f16's above;
        layout_passes(wants_nhwc), for f16 and bf16: Conv with C/G % 8 == 0 -> NHWC
                        (ConvNHWC on tensor cores), depthwise Conv on a multiple of 8
                        channels too (the channel-vector kernel); f32 cuda graphs stay
                        NCHW (the SIMT GEMM is NCHW);
        fuse_attention  float16 or bfloat16 MatMul -> [scale, mask, bias]* -> Softmax -> MatMul
                        chains -> one FusedAttention node (the tensor-core flash-style
                        kernel, `schedules/cuda/attention.py`).
`lower_precision(..., layout="nchw")` (`--layout nchw`) leaves `choose_layout` out.
Kept apart from PASSES so the optimizations see the model's own dtypes (folding in
float32) and each precision's list stays explicit.

`optimize(graph, verify=..., dump_dir=...)` runs them; with `verify` the verifier runs
on the input and after every pass; with `dump_dir` the listing `str(graph)` is written
to `dump_dir/00_input.txt` and then `dump_dir/NN_<pass>.txt` after pass NN.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Collection

from hidetc.graph.ir import Graph
from hidetc.graph.passes import (
    canonicalize_gemm,
    canonicalize_shapes,
    choose_layout,
    compute_bf16,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    flatten_concats,
    fold_batchnorm,
    fold_constants,
    fold_movement_chains,
    fuse_attention,
    hoist_transposes,
    remove_identity,
    simplify_pow,
    to_float16,
    widen_half_cpu,
)
from hidetc.graph.verify import GraphVerifyError, verify_graph

Pass = Callable[[Graph], Graph]

PASSES: tuple[tuple[str, Pass], ...] = (
    ("remove_identity", remove_identity.run),
    ("fold_constants", fold_constants.run),
    ("eliminate_dead_code", eliminate_dead_code.run),
    ("canonicalize_gemm", canonicalize_gemm.run),
    ("fold_batchnorm", fold_batchnorm.run),
    ("canonicalize_shapes", canonicalize_shapes.run),
    ("fold_constants", fold_constants.run),
    ("simplify_pow", simplify_pow.run),
    ("flatten_concats", flatten_concats.run),
    ("eliminate_common_subexpressions", eliminate_common_subexpressions.run),
    ("eliminate_dead_code", eliminate_dead_code.run),
)


PRECISION_PASSES: dict[str, tuple[tuple[str, Pass], ...]] = {
    "f32": (),
    "f16": (("to_float16", to_float16.run),),
    "bf16": (),        # f32 tensors; the cpu backend marks its GEMM anchors (compute_bf16)
}
LAYOUT_PASS = "choose_layout"   # skipped by `lower_precision(..., layout="nchw")`


def layout_passes(policy: choose_layout.Policy) -> tuple[tuple[str, Pass], ...]:
    """The layout passes of a target whose convolutions `policy` picks go NHWC: the
    rewrite, the NHWC transposes hoisted above Concats and Resizes, and the movement
    chains that move no element folded."""
    return (("choose_layout", lambda graph: choose_layout.run(graph, policy)),
            ("hoist_transposes", hoist_transposes.run),
            ("fold_movement_chains", fold_movement_chains.run))


CPU_HALF_PASSES: tuple[tuple[str, Pass], ...] = (("widen_half_cpu", widen_half_cpu.run),)


# cuda bf16: bfloat16 storage, the float16 lowering with another target type
CUDA_BF16_PASSES: tuple[tuple[str, Pass], ...] = (
    ("to_bfloat16", lambda graph: to_float16.run(graph, "bfloat16")),)


def bf16_passes(keep_f32: Collection[str] = ()) -> tuple[tuple[str, Pass], ...]:
    """The cpu's bf16 marking (`compute_bf16`), leaving the nodes `keep_f32` names f32."""
    return (("compute_bf16", lambda graph: compute_bf16.run(graph, keep_f32)),)
ATTENTION_PASSES: tuple[tuple[str, Pass], ...] = (("fuse_attention", fuse_attention.run),)


def optimize(graph: Graph, *, verify: bool = False, dump_dir: str | None = None,
             passes: tuple[tuple[str, Pass], ...] = PASSES) -> Graph:
    """Run `passes` in order and return the optimized graph."""
    dump = Path(dump_dir) if dump_dir is not None else None
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / "00_input.txt").write_text(str(graph) + "\n")
    if verify:
        checked(graph, "input")
    return _run(graph, passes, 1, verify, dump)


def lower_precision(graph: Graph, precision: str, *, dump_dir: str | None = None,
                    passes: tuple[tuple[str, Pass], ...] = (), layout: str = "auto"
                    ) -> Graph:
    """Run `PRECISION_PASSES[precision]`, then the target's `passes` (its backend's
    `graph_passes`; none without a target) on an optimized graph. The verifier runs
    after each of them (always: they retype the graph); dumps continue the numbering
    of `optimize`'s (`dump_dir/12_to_float16.txt`). `layout="nchw"` leaves out
    `choose_layout` (the graph keeps the model's NCHW convolutions)."""
    dump = Path(dump_dir) if dump_dir is not None else None
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
    passes = PRECISION_PASSES[precision] + tuple(passes)
    if layout == "nchw":
        passes = tuple(p for p in passes if p[0] != LAYOUT_PASS)
    return _run(graph, passes, len(PASSES) + 1, True, dump)


def _run(graph: Graph, passes: tuple[tuple[str, Pass], ...], start: int, verify: bool,
         dump: Path | None) -> Graph:
    for index, (name, run_pass) in enumerate(passes, start=start):
        graph = run_pass(graph)
        if verify:
            checked(graph, f"pass {index} {name}")
        if dump is not None:
            (dump / f"{index:02d}_{name}.txt").write_text(str(graph) + "\n")
    return graph


def checked(graph: Graph, stage: str) -> None:
    try:
        verify_graph(graph)
    except GraphVerifyError as error:
        raise GraphVerifyError(f"after {stage}: {error}") from error
