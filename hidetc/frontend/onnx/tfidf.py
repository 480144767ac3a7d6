"""TfIdfVectorizer (opset 9) over integer inputs, read as batch-wide n-gram matching with
constant windows and pools.

X is [C] or [B, C] int32/int64; the pool (`pool_int64s`, grouped by length from
`ngram_counts`) holds the n-grams, `ngram_indexes` the output column of each. onnx's
reference (and ONNX Runtime) count, per row, for every pool n-gram g of length n within
[min_gram_length, max_gram_length]: unigrams once per position where x == g; longer
n-grams once per skip distance d in 1..max_skip_count + 1 and start i with i + d(n - 1)
< C and x[i + k d] == g[k] for every k. Here, per length n and distance d, the windows
x[i + k d] are one Gather with a constant index [P, n]; Equal against the pool's
n-grams [m, n] broadcast to [B, P, m, n], ReduceMin over k (all equal), ReduceSum over
the starts P; the counts of every pool entry (zero for lengths outside the range) are
summed into their output columns by a MatMul with a constant 0/1 matrix [entries,
columns] (exact: counts are small integers). Weighting, per pool entry j (the spec's
and ONNX Runtime's: weights has one value per n-gram of the pool, i.e. per
ngram_indexes entry; onnx's reference reads weights[column], the same when
ngram_indexes is the identity): TF the count; IDF weights[j] (or 1) where the count is
positive; TFIDF the count times weights[j] (or 1). The output is float32 [B,
max(ngram_indexes) + 1] ([columns] for a 1-D X). String pools (`pool_strings`) are
refused: hidetc has no string tensors.
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, label

MODES = ("TF", "IDF", "TFIDF")


def _pool_by_length(node: OnnxNode, pool: np.ndarray, starts: list[int]
                    ) -> dict[int, tuple[int, np.ndarray]]:
    """n -> (index of its first entry among all pool entries, its n-grams [m, n])."""
    out: dict[int, tuple[int, np.ndarray]] = {}
    entry = 0
    for n, start in enumerate(starts, 1):
        end = starts[n] if n < len(starts) else len(pool)
        if end < start or (end - start) % n:
            raise ModelError(f"{label(node)}: ngram_counts {starts} does not split the pool "
                             f"of {len(pool)} integers into whole {n}-grams")
        out[n] = (entry, pool[start:end].reshape(-1, n))
        entry += (end - start) // n
    return out


def tfidf_vectorizer(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    where = label(node)
    if "pool_strings" in node.attrs:
        raise ModelError(f"{where}: pool_strings: string tensors are not supported (an "
                         f"integer pool, pool_int64s, is)")
    if x.dtype not in ("int32", "int64") or x.rank not in (1, 2):
        raise ModelError(f"{where}: input X is {x.dtype} {list(x.shape)}, expected int32 or "
                         f"int64 [C] or [B, C]")
    mode = node.attrs.get("mode", "TF")
    if mode not in MODES:
        raise ModelError(f"{where}: mode '{mode}' is not TF, IDF or TFIDF")
    low = int(node.attrs.get("min_gram_length", 1))
    high = int(node.attrs.get("max_gram_length", 1))
    max_skip = int(node.attrs.get("max_skip_count", 0))
    if not 1 <= low <= high or max_skip < 0:
        raise ModelError(f"{where}: min_gram_length {low}, max_gram_length {high}, "
                         f"max_skip_count {max_skip}: expected 1 <= min <= max, skip >= 0")
    pool = np.asarray(node.attrs.get("pool_int64s", []), np.int64)
    columns_of = [int(i) for i in node.attrs.get("ngram_indexes", [])]
    grams = _pool_by_length(node, pool, [int(s) for s in node.attrs.get("ngram_counts", [])])
    entries = sum(len(g) for _, g in grams.values())
    if len(columns_of) != entries or min(columns_of, default=0) < 0:
        raise ModelError(f"{where}: ngram_indexes has {len(columns_of)} entries for the "
                         f"pool's {entries} n-grams (each a column index >= 0)")
    width = max(columns_of, default=-1) + 1
    weights = node.attrs.get("weights")
    scale = (np.ones(entries, np.float32) if weights is None
             else np.asarray(weights, np.float32))
    if len(scale) != entries:
        raise ModelError(f"{where}: weights has {len(scale)} values for the pool's "
                         f"{entries} n-grams")
    rows, length = (1, x.shape[0]) if x.rank == 1 else x.shape
    build = Builder(node, ctx)
    out_shape = np.array([width] if x.rank == 1 else [rows, width], np.int64)
    if width == 0 or entries == 0 or length == 0:
        return Converted((), {node.outputs[0]: np.zeros(out_shape, np.float32)})
    xs = node.inputs[0] if x.rank == 2 else build.add(
        "Reshape", [node.inputs[0], build.const("rows", np.array([1, length], np.int64))])
    counts = []
    for n, (first, table) in sorted(grams.items()):
        if not table.size:
            continue
        if not low <= n <= high:
            counts.append(build.const("none", np.zeros((rows, len(table)), np.float32)))
            continue
        total = None
        for d in ([1] if n == 1 else range(1, max_skip + 2)):
            starts = length - d * (n - 1)
            if starts <= 0:
                continue
            index = np.arange(starts)[:, None] + d * np.arange(n)[None, :]
            windows = build.add("Gather", [xs, build.const("taps", index.astype(np.int64))],
                                axis=1)                               # [B, P, n]
            windows = build.add("Unsqueeze", [windows, build.const("axis", np.array(
                [2], np.int64))])                                     # [B, P, 1, n]
            same = build.add("Equal", [windows, build.const("grams", table.astype(
                np.dtype(x.dtype))[None, None])])                     # [B, P, m, n]
            whole = build.add("ReduceMin", [build.add("Cast", [same], to="int32"),
                                            build.const("k", np.array([3], np.int64))],
                              keepdims=0)                             # [B, P, m]
            found = build.add("ReduceSum", [whole, build.const("p", np.array([1], np.int64))],
                              keepdims=0)                             # [B, m]
            total = found if total is None else build.add("Add", [total, found])
        counts.append(build.add("Cast", [total], to="float32") if total is not None else
                      build.const("none", np.zeros((rows, len(table)), np.float32)))
    every = counts[0] if len(counts) == 1 else build.add("Concat", counts, axis=1)
    if mode == "IDF":                                                  # [B, entries]
        every = build.add("Where", [build.add("Greater", [every, build.const(
            "0", np.float32(0))]), build.const("weights", scale), build.const(
            "0", np.float32(0))])
    elif mode == "TFIDF" and weights is not None:
        every = build.add("Mul", [every, build.const("weights", scale)])
    place = np.zeros((entries, width), np.float32)
    place[np.arange(entries), columns_of] = 1.0
    y = build.add("MatMul", [every, build.const("columns", place)])   # [B, width]
    build.add("Reshape", [y, build.const("shape", out_shape)], out=node.outputs[0])
    return build.done()


HANDLERS = {"TfIdfVectorizer": tfidf_vectorizer}
EXTRA_OPS = ("TfIdfVectorizer",)
CHECKED: tuple[str, ...] = ("TfIdfVectorizer",)   # one schema version (9) up to opset 28
FIRST_VERSION: dict[str, int] = {"TfIdfVectorizer": 9}
