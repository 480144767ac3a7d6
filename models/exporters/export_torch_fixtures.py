"""Export the exporter-fixture models under tests/data/exporters/ with PyTorch.

Run by hand (PyTorch is NOT a dependency of hidetc; the .onnx files and their npz
inputs/outputs are committed so the tests need neither torch nor onnxscript):

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install torch==2.13.0 onnxscript==0.7.2 onnx==1.23.2 \\
        onnxruntime numpy
    /tmp/torchenv/bin/python models/exporters/export_torch_fixtures.py [OUT_DIR]

The committed fixtures were made with torch 2.13.0+cpu, onnxscript 0.7.2, onnx 1.23.2
(manifest.json records the versions, and per file its size, opset, local functions and
op types). Seeds are fixed, but a different torch may export a different graph.

Five tiny models (a few channels wide; every file well under 300 KB), each exported
with the TorchScript exporter (`dynamo=False`, opset 17 unless said, `dynamic_axes`) as
`<name>_ts.onnx` and with the dynamo exporter (`dynamo=True`, its default opset, 20
here, `dynamic_shapes`) as `<name>_dynamo.onnx`:

- `cnn`: conv-bn-relu, a residual block, maxpool, adaptive avgpool, flatten, linear;
  symbolic batch. Also `cnn_tsfunc.onnx`: TorchScript with the ConvBNReLU and
  Residual modules exported as ONNX local functions (`export_modules_as_functions`;
  ConvBNReLU takes its stride as a referenced attribute).
- `encoder`: embedding lookup, pre-norm transformer block (nn.MultiheadAttention with
  a float causal mask from torch.triu, LayerNorm, GELU MLP) and a hand-written causal
  attention (view/permute chains, bool triu mask with masked_fill, softmax, plus
  F.scaled_dot_product_attention(is_causal=True)); symbolic batch and sequence. The
  TorchScript export of nn.MultiheadAttention bakes the traced batch and sequence into
  a Reshape, so `encoder_ts.onnx` only runs at the traced dims (ONNX Runtime rejects
  others too); the dynamo export is truly dynamic.
- `lstm`: nn.LSTM(batch_first=True, 2 layers) and a linear head on every step, and the
  last hidden state; symbolic batch and sequence. (The dynamo export declares output
  `y` as [batch, 5, 3]: the traced length leaks into the declared output shape, which
  an importer must not trust; ONNX Runtime only warns.)
- `gpt`: a GPT-2 style block as Hugging Face writes it (see TinyGPT), inputs `ids` and
  an int64 padding `mask`, both [batch, seq]; its TorchScript export uses opset 14
  (LayerNormalization and Gelu then come decomposed, as in older exports).
- `unet`: GroupNorm, depthwise conv, InstanceNorm, SiLU, hardswish, PReLU,
  ConvTranspose, bilinear and nearest resize, concat skip, cumsum, argmax.

`<name>.npz` holds the inputs used at export (`in_<input name>`) and torch's outputs
(`out_<i>`, in the model's output order), and a second set at other dynamic dims
(`b_in_<input name>`, `b_out_<i>`). Input and output names are the same in every export
of a model.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxscript
import torch
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "data" / "exporters"


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__(nn.Conv2d(cin, cout, 3, stride, 1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU())


class Residual(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.a = ConvBNReLU(c, c)
        self.b = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        return torch.relu(x + self.b(self.a(x)))


class TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = ConvBNReLU(3, 8, stride=2)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.block = Residual(8)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

    def forward(self, x):
        return self.head(self.block(self.pool(self.stem(x))))


class HandAttention(nn.Module):
    """One causal attention head written out: view/permute, matmul, masked softmax."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.dh).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / (self.dh ** 0.5)
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj((out + fused).permute(0, 2, 1, 3).reshape(b, s, d))


class TinyEncoder(nn.Module):
    def __init__(self, vocab: int = 32, d: int = 16, heads: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.ln1 = nn.LayerNorm(d)
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.ln3 = nn.LayerNorm(d)
        self.hand = HandAttention(d, heads)
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        s = ids.shape[1]
        causal = torch.triu(torch.full((s, s), float("-inf"), device=ids.device), diagonal=1)
        h = self.ln1(x)
        x = x + self.mha(h, h, h, attn_mask=causal, need_weights=False)[0]
        x = x + self.mlp(self.ln2(x))
        x = x + self.hand(self.ln3(x))
        return self.out(x)


class TinyLSTM(nn.Module):
    def __init__(self, features: int = 4, hidden: int = 8):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, 3)

    def forward(self, x):
        y, (h, c) = self.lstm(x)
        return self.head(y), h


class TinyUNet(nn.Module):
    """Vision ops beyond the CNN: GroupNorm, depthwise conv, InstanceNorm, SiLU,
    hardswish, PReLU, ConvTranspose, bilinear/nearest resize, concat skip, cumsum,
    argmax, reductions over several axes."""

    def __init__(self):
        super().__init__()
        self.inc = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.dw = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 16, 1)
        self.inorm = nn.InstanceNorm2d(16, affine=True)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.prelu = nn.PReLU(8)
        self.out = nn.Conv2d(16, 4, 1)

    def forward(self, x):
        a = F.silu(self.gn(self.inc(x)))
        b = F.hardswish(self.inorm(self.pw(self.dw(a))))
        u = self.prelu(self.up(b))
        bi = F.interpolate(b, scale_factor=2.0, mode="bilinear", align_corners=False)
        y = self.out(torch.cat([a, u], dim=1)) + bi[:, :4]
        pooled = F.interpolate(y, size=(4, 4), mode="nearest").amax(dim=(2, 3))
        return (y, pooled.softmax(-1), torch.cumsum(y.mean(dim=1), dim=-1),
                y.argmax(dim=1))


class TinyGPT(nn.Module):
    """GPT-2 style, as Hugging Face models are written: token + arange position
    embeddings, fused qkv split, einsum scores, a registered tril buffer sliced to the
    sequence, an int64 padding mask turned additive, tanh GELU; then a few tensor ops
    exporters lower to Pad, ReduceL2, TopK, GatherElements, CumSum, flipping Slices."""

    def __init__(self, vocab: int = 40, d: int = 16, heads: int = 4, maxlen: int = 32):
        super().__init__()
        self.heads = heads
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(maxlen, d)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("bias", torch.tril(torch.ones(maxlen, maxlen))[None, None])

    def _heads(self, t, b, s):
        return t.view(b, s, self.heads, -1).transpose(1, 2)

    def forward(self, ids, mask):
        b, s = ids.shape
        pos = torch.arange(0, s, dtype=torch.long, device=ids.device).unsqueeze(0)
        x = self.wte(ids) + self.wpe(pos)
        h = self.ln1(x)
        q, k, v = (self._heads(t, b, s) for t in self.c_attn(h).split(h.size(-1), dim=2))
        att = torch.einsum("bhqd,bhkd->bhqk", q, k) * (1.0 / k.size(-1) ** 0.5)
        att = att.masked_fill(self.bias[:, :, :s, :s] == 0, torch.finfo(att.dtype).min)
        att = att + (1.0 - mask[:, None, None, :].to(att.dtype)) * -10000.0
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, s, -1)
        x = x + self.c_proj(y)
        x = F.normalize(x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh")), dim=-1)
        x = F.pad(x, (0, 0, 1, 0))[:, 1:]
        top, idx = torch.topk(x @ self.wte.weight.t(), 3, dim=-1)
        first = torch.gather(x, 1, torch.zeros(b, 1, x.size(-1), dtype=torch.long))
        return top, idx, x.flip(1).cumsum(1) + first, x.chunk(2, dim=-1)[1].amax(-1)


def _specs():
    """(name, module, inputs at export, inputs at other dims, input names, output names,
    dynamic axes per input)."""
    gen = torch.Generator().manual_seed(0)
    return [
        ("cnn", TinyCNN(), (torch.randn(2, 3, 16, 16, generator=gen),),
         (torch.randn(5, 3, 16, 16, generator=gen),), ["x"], ["logits"], {"x": {0: "batch"}}),
        ("encoder", TinyEncoder(), (torch.randint(0, 32, (2, 7), generator=gen),),
         (torch.randint(0, 32, (3, 4), generator=gen),), ["ids"], ["logits"],
         {"ids": {0: "batch", 1: "seq"}}),
        ("lstm", TinyLSTM(), (torch.randn(2, 5, 4, generator=gen),),
         (torch.randn(3, 9, 4, generator=gen),), ["x"], ["y", "h"],
         {"x": {0: "batch", 1: "seq"}}),
        ("unet", TinyUNet(), (torch.randn(2, 3, 8, 8, generator=gen),),
         (torch.randn(3, 3, 8, 8, generator=gen),), ["x"], ["y", "probs", "csum", "arg"],
         {"x": {0: "batch"}}),
        ("gpt", TinyGPT(), (torch.randint(0, 40, (2, 7), generator=gen),
                            torch.tensor([[1] * 7, [1] * 5 + [0] * 2])),
         (torch.randint(0, 40, (3, 4), generator=gen), torch.tensor([[1] * 4] * 2 + [[1, 0] * 2])),
         ["ids", "mask"], ["top", "idx", "csum", "amax"],
         {"ids": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}),
    ]


def _randomize_bn(module: nn.Module, gen: torch.Generator) -> None:
    """Non-trivial running statistics so the BatchNorm folding is exercised."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


def _export_ts(module, args, path, inputs, outputs, axes) -> None:
    opset = 14 if isinstance(module, TinyGPT) else 17
    torch.onnx.export(module, args, str(path), dynamo=False, opset_version=opset,
                      input_names=inputs, output_names=outputs, dynamic_axes=axes)


def _export_ts_functions(module, args, path, inputs, outputs, axes) -> None:
    """TorchScript with the conv-bn-relu and residual modules as ONNX local functions."""
    torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17,
                      input_names=inputs, output_names=outputs, dynamic_axes=axes,
                      export_modules_as_functions={ConvBNReLU, Residual})


def _export_dynamo(module, args, path, inputs, outputs, axes) -> None:
    dims = {"batch": torch.export.Dim("batch", min=1, max=64),
            "seq": torch.export.Dim("seq", min=2, max=32)}
    shapes = tuple({i: dims[n] for i, n in axes[name].items()} for name in inputs)
    program = torch.onnx.export(module, args, dynamo=True, input_names=inputs,
                                output_names=outputs, dynamic_shapes=shapes,
                                external_data=False)
    program.save(str(path))


EXPORTS = (("ts", _export_ts), ("tsfunc", _export_ts_functions), ("dynamo", _export_dynamo))


def _summary(path: Path) -> dict:
    model = onnx.load(str(path))
    ops = sorted({n.op_type for n in model.graph.node}
                 | {n.op_type for f in model.functions for n in f.node})
    return {"bytes": path.stat().st_size,
            "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            "functions": [f.name for f in model.functions], "ops": ops}


def _run(module, args) -> tuple:
    with torch.no_grad():
        result = module(*args)
    return result if isinstance(result, tuple) else (result,)


def _arrays(tag: str, names, args, result) -> dict:
    arrays = {f"{tag}in_{n}": a.numpy() for n, a in zip(names, args)}
    arrays.update({f"{tag}out_{i}": r.numpy() for i, r in enumerate(result)})
    return arrays


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    manifest = {"torch": torch.__version__, "onnx": onnx.__version__,
                "onnxscript": onnxscript.__version__, "models": {}}
    for name, module, args, other, inputs, outputs, axes in _specs():
        _randomize_bn(module, gen)
        module.eval()
        arrays = _arrays("", inputs, args, _run(module, args))
        arrays.update(_arrays("b_", inputs, other, _run(module, other)))
        np.savez(out / f"{name}.npz", **arrays)
        entry = {"dynamic": {n: {str(k): v for k, v in a.items()} for n, a in axes.items()},
                 "files": {}}
        for suffix, export in EXPORTS:
            if suffix == "tsfunc" and name != "cnn":
                continue
            path = out / f"{name}_{suffix}.onnx"
            with torch.no_grad():
                export(module, args, path, inputs, outputs, axes)
            entry["files"][path.name] = _summary(path)
        manifest["models"][name] = entry
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
