"""ONNX builders for the Hidet-paper benchmark models (batch 1, random weights).

Each builder writes the graph directly with ``onnx.helper`` in the op patterns of
PyTorch's TorchScript ONNX exporter (opset 17), with weights drawn deterministically
from ``numpy.random.default_rng(seed)`` and scaled so activations stay O(1).

    >>> import models
    >>> m = models.build("resnet50", tiny=True)
    >>> feeds = models.sample_inputs(m)
    >>> models.save(m, "resnet50_tiny.onnx")

``tiny=True`` gives a seconds-to-compile variant with the same graph structure and
op types.  Extra keyword options: ``fold_bn`` (resnet50, inception_v3, mobilenet_v2;
default False keeps BatchNormalization nodes), ``lm_head`` (gpt2; default True) and
``dynamic`` (default False; resnet50: the batch axis is the symbolic dimension "batch",
bert_base and gpt2: the sequence axis is "seq", as torch.onnx exports dynamic axes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import helper

from . import bert, gpt2, inception, mobilenet, resnet

__all__ = ["REGISTRY", "build", "save", "input_specs", "sample_inputs"]

REGISTRY: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet50": resnet.build_resnet50,
    "inception_v3": inception.build_inception_v3,
    "mobilenet_v2": mobilenet.build_mobilenet_v2,
    "bert_base": bert.build_bert_base,
    "gpt2": gpt2.build_gpt2,
}


def build(name: str, tiny: bool = False, seed: int = 0, **options) -> onnx.ModelProto:
    """Build model ``name`` (see ``REGISTRY``); ``options`` go to the builder."""
    try:
        builder = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(REGISTRY)}") from None
    return builder(tiny=tiny, seed=seed, **options)


def save(model: onnx.ModelProto, path: str | os.PathLike, external_data: bool = False) -> None:
    """Save ``model`` to ``path``.

    With ``external_data=True`` all weights go to one side file ``<stem>.data`` next
    to ``path`` (e.g. ``resnet50.onnx`` -> ``resnet50.data``).  Missing parent
    directories are created; ``model`` itself is left unchanged.  Load either form
    with ``onnx.load(path)``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not external_data:
        onnx.save_model(model, str(path))
        return
    location = path.stem + ".data"
    data_file = path.parent / location
    if data_file.exists():
        data_file.unlink()  # onnx appends to an existing data file
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # save_model(save_as_external_data=True) rewrites its argument
    onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=1024)


def input_specs(model: onnx.ModelProto) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """Graph inputs (excluding initializers): name -> (numpy dtype, static shape)."""
    inits = {t.name for t in model.graph.initializer}
    specs = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        specs[vi.name] = (dtype, tuple(int(d.dim_value) for d in tt.shape.dim))
    return specs


def _vocab_size(model: onnx.ModelProto, input_name: str) -> int:
    """Vocabulary size from the metadata, else from the embedding Gather of ``input_name``."""
    props = {p.key: p.value for p in model.metadata_props}
    if "vocab_size" in props:
        return int(props["vocab_size"])
    dims = {t.name: t.dims for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[1] == input_name and node.input[0] in dims:
            return int(dims[node.input[0]][0])
    raise ValueError(f"cannot determine the vocabulary size for {input_name!r}")


def sample_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Valid random inputs: images ~ N(0, 1), token ids within the vocabulary, and an
    attention mask of ones whose last ``seq // 8`` (at least 1) positions are zero."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (dtype, shape) in input_specs(model).items():
        if name == "attention_mask":
            mask = np.ones(shape, dtype=dtype)
            mask[..., shape[-1] - max(1, shape[-1] // 8):] = 0
            feeds[name] = mask
        elif np.issubdtype(dtype, np.integer):
            feeds[name] = rng.integers(0, _vocab_size(model, name), size=shape, dtype=dtype)
        else:
            feeds[name] = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    return feeds
