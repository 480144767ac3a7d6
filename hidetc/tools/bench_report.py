"""What `hidetc bench` prints and draws of its rows: `format_table(rows)` the printed
table; `profile_lines(row)` the slowest launches of a `--profile` row (per-launch times:
on the cpu from the launcher's clock, on cuda from CUDA events around each launch of an
un-captured pass; with template, config and, on cuda, grid and block); `plot(rows, path)`
a bar chart of latency per model and system.

Assumes rows as `hidetc.tools.bench.bench_subject` fills them: `model`, `target`,
`precision`, `hidetc_ms` and `kernels` always there, the rest (ONNX Runtime's and the
peers' timings, ratios and errors, `sizes`, notes, `profile`) only where measured. Decides
the layout: a line per row (`err`: hidetc's `norm_error` against ONNX Runtime; "-" for
what the row lacks), then under it a line per torch peer, per peer that runs the model
file (`FILE_PEERS`), for a cuda row run without its CUDA graph, and per peer the row
says could not be timed. Reads the rows only; `plot` writes its chart, and without
matplotlib raises a one-line InputError.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from hidetc.errors import InputError


def row_label(row: dict) -> str:
    """The row's model and, for a size of a range, its sizes: "bert_base seq=128"."""
    sizes = " ".join(f"{k}={v}" for k, v in (row.get("sizes") or {}).items())
    return f"{row['model']} {sizes}" if sizes else row["model"]


# the peers that run the model file, timed in the rounds: a line each under the row
FILE_PEERS = ("openvino", "openvino_f32")


def _err(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1e}"


def format_table(rows: list[dict]) -> str:
    """The header and each row's line (`err`: hidetc's `norm_error` against ONNX Runtime),
    then a line per torch peer, per file peer (ms, ratios, inference precision, err) and
    per note."""
    head = (f"{'model':<16}{'target':<7}{'prec':<5}{'hidetc ms':>10}{'ORT ms':>9}{'ratio':>7}"
            f"{'paired':>7}{'kernels':>8}{'compile s':>10}{'peak MiB':>17}{'err':>9}  check")
    lines = [head]
    for r in rows:
        ort_ms = f"{r['onnxruntime_ms']:.2f}" if "onnxruntime_ms" in r else "-"
        ratio = f"{r['ratio_onnxruntime']:.2f}x" if "ratio_onnxruntime" in r else "-"
        paired = (f"{r['ratio_onnxruntime_paired']:.2f}x" if "ratio_onnxruntime_paired" in r
                  else "-")
        comp = f"{r['compile_s']:.1f}" if "compile_s" in r else "-"
        mem = "-"
        if r.get("hidetc_peak_mb"):
            mem = f"{r['hidetc_peak_mb']:.0f}"
            if r.get("onnxruntime_peak_mb"):
                mem += f" vs {r['onnxruntime_peak_mb']:.0f}"
        label = row_label(r) + (" " if r.get("sizes") else "")    # (a long label stays apart)
        lines.append(f"{label:<16}{r['target']:<7}{r['precision']:<5}"
                     f"{r['hidetc_ms']:>10.2f}{ort_ms:>9}{ratio:>7}{paired:>7}{r['kernels']:>8}"
                     f"{comp:>10}{mem:>17}{_err(r.get('hidetc_error')):>9}  "
                     f"{r.get('check', '-')}")
        for key in sorted(k for k in r if k.startswith("ratio_torch")):
            peer = key[len("ratio_"):]
            lines.append(f"{'':<16}{'':<12}vs {peer}: {r[peer + '_ms']:.2f} ms, "
                         f"ratio {r[key]:.2f}x")
        for peer in (p for p in FILE_PEERS if f"{p}_ms" in r):
            lines.append(f"{'':<16}{'':<12}vs {peer} ({r[peer + '_precision']}): "
                         f"{r[peer + '_ms']:.2f} ms, ratio {r['ratio_' + peer]:.2f}x, "
                         f"paired {r['ratio_' + peer + '_paired']:.2f}x, "
                         f"err {_err(r.get(peer + '_error'))}")
        if r.get("cuda_graph") is False:
            lines.append(f"{'':<16}{'':<12}no CUDA graph: stream launches "
                         f"({r.get('cuda_graph_unavailable')})")
        if r.get("onnxruntime_note"):
            lines.append(f"{'':<16}{'':<12}no ORT timing: {r['onnxruntime_note']}")
        lines += [f"{'':<16}{'':<12}no {p} timing: {r[p + '_note']}" for p in FILE_PEERS
                  if r.get(p + "_note")]
    return "\n".join(lines)


def profile_lines(row: dict, top: int = 15) -> list[str]:
    """The `top` slowest launches of a profiled row, with their share of the total."""
    entries = sorted(row.get("profile", []), key=lambda e: -e["ms"])
    total = sum(e["ms"] for e in entries) or 1.0
    lines = [f"{row_label(row)}: {len(entries)} launches, {total:.2f} ms in kernels"]
    if row.get("profile_unavailable"):
        lines[0] = f"{row_label(row)}: no profile ({row['profile_unavailable']})"
    for e in entries[:top]:
        where = f"grid {e['grid']} block {e['block']}  " if "grid" in e else ""
        how = f"{e['template']} {e.get('config') or ''}" if e.get("template") else "rule"
        lines.append(f"  {e['ms']:8.3f} ms {100 * e['ms'] / total:5.1f}%  {e['op']:<20} "
                     f"{e['kernel']:<24} {where}{how}  {e.get('node') or ''}")
    return lines


def plot(rows: list[dict], path: Path) -> None:
    """A bar chart of latency per model and system (matplotlib, an optional extra)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib (pip install matplotlib)") from None
    systems = ["hidetc"] + sorted({k[:-3] for r in rows for k in r
                                   if k.endswith("_ms") and k != "hidetc_ms"})
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(rows), 4))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        values = [r.get(f"{system}_ms") or 0.0 for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], values, width, label=system)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))])
    ax.set_xticklabels([f"{row_label(r)}\n{r['precision']}" for r in rows])
    ax.set_ylabel("latency, ms (batch 1, median)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
