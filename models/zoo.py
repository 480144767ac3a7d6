"""A zoo of tiny Hugging Face ``transformers`` models for exporter-to-hidetc tests.

PyTorch and transformers are NOT dependencies of hidetc: ``make test-slow`` installs
them (torch 2.13.0, onnxscript 0.7.2, transformers 5.25) into the venv, and
tests/zoo/test_transformers_zoo.py exports every entry here with both torch.onnx
exporters, compiles it with hidetc and compares with PyTorch eager.

28 entries (ENTRIES): encoders (BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA, DeBERTa-v2,
ModernBERT), decoders (GPT-2, GPT-Neo, OPT, Llama, Mistral, Qwen2, Phi-3, Gemma),
encoder-decoders (T5 encoder, BART), vision (ViT, DeiT, BEiT, Swin, ConvNeXt, ResNet,
MobileNetV2, SegFormer) and speech (Wav2Vec2, HuBERT, Whisper encoder). Each builds its
model from a transformers config class at a tiny size (hidden 32; 2 layers, ModernBERT
3 for global, local, global attention; a 128-token vocabulary, 32x32 images, 0.1 s of
16 kHz audio), with random weights (``torch.manual_seed(SEED)`` before construction, so
the library's own initializers draw them; the ConvNets then get He-normal convolutions
and random BatchNorm statistics, see ``_conv_weights``) in eval mode, wrapped so that
``forward`` takes the example inputs positionally and returns a tuple of tensors
(``last_hidden_state``, ``logits``, ...). Attention is the library's default (``sdpa``
where a model has it). Decoders run without KV cache (``use_cache=False``) on
``input_ids`` and ``attention_mask``; token inputs are [2, 16] with the second row
right-padded (its last 4 positions masked).

    >>> from models import zoo
    >>> module, inputs = zoo.build("bert")
    >>> zoo.export("bert", "dynamo", "/tmp/bert_dynamo.onnx")
    >>> outputs = zoo.eager_outputs(module, inputs)      # [np.ndarray, ...]

``export`` uses the TorchScript exporter (``dynamo=False``) at opset 17, and the
dynamo exporter (``dynamo=True``) at its default opset, both with static shapes (the
example inputs' shapes) and the weights inside the .onnx file.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import nn

SEED = 0
BATCH, SEQ, VOCAB, PAD = 2, 16, 128, 4     # token inputs; PAD: masked positions of row 1
IMAGE = 32                                 # images are [1, 3, IMAGE, IMAGE]
AUDIO = 1600                               # raw audio is [1, AUDIO] (0.1 s at 16 kHz)
EXPORTERS = ("ts", "dynamo")
TS_OPSET = 17


@functools.cache
def _wrapper_class() -> type:
    from torch import nn

    class Wrapped(nn.Module):
        """`model(**dict(zip(names, args)), **extra)` as a tuple of the outputs `keys`."""

        def __init__(self, model: nn.Module, names: tuple[str, ...], keys: tuple[str, ...],
                     extra: dict | None = None):
            super().__init__()
            self.model, self.names, self.keys = model, names, keys
            self.extra = dict(extra or {})

        def forward(self, *args):
            out = self.model(**dict(zip(self.names, args)), **self.extra, return_dict=True)
            return tuple(out[k] for k in self.keys)

    return Wrapped


@dataclass(frozen=True)
class Entry:
    name: str
    family: str                          # encoder | decoder | seq2seq | vision | speech
    model: Callable[[], nn.Module]       # the bare transformers model, random weights
    inputs: Callable[[], dict]           # example inputs: name -> tensor
    outputs: tuple[str, ...]             # the model output keys the wrapper returns
    extra: tuple = ()                    # fixed keyword arguments, as (key, value) pairs
    post: Callable[[nn.Module], None] | None = None   # adjusts the weights after init

    def build(self) -> tuple[nn.Module, dict[str, torch.Tensor]]:
        """(the wrapped module in eval mode, the example inputs); seeded, so every call
        gives the same weights and inputs."""
        import torch
        torch.manual_seed(SEED)
        model = self.model().eval()
        if self.post is not None:
            self.post(model)
        inputs = self.inputs()
        module = _wrapper_class()(model, tuple(inputs), self.outputs, dict(self.extra)).eval()
        return module, inputs


# ----------------------------------------------------------------------------- inputs

def _gen(salt: int = 0) -> torch.Generator:
    import torch
    return torch.Generator().manual_seed(SEED + salt)


def _tokens(mask: bool = True, token_types: bool = False, low: int = 3) -> Callable[[], dict]:
    """input_ids [BATCH, SEQ] in [low, VOCAB) (ids below `low` are the special tokens),
    attention_mask with row 1 right-padded, optionally token_type_ids."""
    def make():
        import torch
        g = _gen(1)
        ids = torch.randint(low, VOCAB, (BATCH, SEQ), generator=g)
        inputs = {"input_ids": ids}
        if mask:
            m = torch.ones(BATCH, SEQ, dtype=torch.long)
            m[1, SEQ - PAD:] = 0
            inputs["attention_mask"] = m
        if token_types:
            t = torch.zeros(BATCH, SEQ, dtype=torch.long)
            t[:, SEQ // 2:] = 1
            inputs["token_type_ids"] = t
        return inputs
    return make


def _seq2seq_tokens() -> dict:
    import torch
    inputs = _tokens()()
    g = _gen(2)
    inputs["decoder_input_ids"] = torch.randint(3, VOCAB, (BATCH, SEQ // 2), generator=g)
    return inputs


def _image(name: str = "pixel_values", size: int = IMAGE) -> Callable[[], dict]:
    def make():
        import torch
        return {name: torch.randn(1, 3, size, size, generator=_gen(3))}
    return make


def _audio() -> dict:
    import torch
    return {"input_values": torch.randn(1, AUDIO, generator=_gen(4))}


def _mel(bins: int, frames: int) -> Callable[[], dict]:
    def make():
        import torch
        return {"input_features": torch.randn(1, bins, frames, generator=_gen(5))}
    return make


def _conv_weights(model: nn.Module) -> None:
    """ConvNet weights that keep activations O(1): He-normal convolutions (the library
    draws them at std 0.02, which leaves a 17-block MobileNetV2's logits at 1e-30) and
    non-trivial BatchNorm statistics and affine parameters (so that folding them is
    exercised)."""
    import torch
    from torch import nn
    g = _gen(6)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5)
            elif isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                m.bias.copy_(torch.randn(n, generator=g) * 0.1)


# ----------------------------------------------------------------------------- configs

TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64)
DECODER = dict(TEXT, num_key_value_heads=2, use_cache=False, pad_token_id=0, bos_token_id=1,
               eos_token_id=2, tie_word_embeddings=False)
VIT = dict(image_size=IMAGE, patch_size=8, num_channels=3, hidden_size=32,
           num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
SPEECH = dict(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=64, conv_dim=(16, 16, 16), conv_stride=(5, 2, 2),
              conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
              num_conv_pos_embedding_groups=4, mask_time_prob=0.0)


def _tf() -> Any:
    import transformers
    return transformers


def _m(model_cls: str, config_cls: str, **kw) -> Callable[[], nn.Module]:
    """A builder of transformers' `model_cls` from `config_cls(**kw)` (looked up when
    called: importing this module needs neither torch nor transformers)."""
    return lambda: getattr(_tf(), model_cls)(getattr(_tf(), config_cls)(**kw))


def _whisper_encoder() -> nn.Module:
    tf = _tf()
    cfg = tf.WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=32, encoder_layers=2,
                           encoder_attention_heads=4, decoder_layers=2,
                           decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                           max_source_positions=16, max_target_positions=32,
                           pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           decoder_start_token_id=1)
    return tf.WhisperModel(cfg).get_encoder()


ENTRIES: tuple[Entry, ...] = (
    # ---- encoders
    Entry("bert", "encoder", _m("BertModel", "BertConfig", **TEXT),
          _tokens(token_types=True), ("last_hidden_state", "pooler_output")),
    Entry("roberta", "encoder",
          _m("RobertaModel", "RobertaConfig", **dict(TEXT, max_position_embeddings=66),
             pad_token_id=1), _tokens(), ("last_hidden_state",)),
    Entry("distilbert", "encoder",
          _m("DistilBertModel", "DistilBertConfig", vocab_size=VOCAB, dim=32, n_layers=2,
             n_heads=4, hidden_dim=64, max_position_embeddings=64),
          _tokens(), ("last_hidden_state",)),
    Entry("albert", "encoder",
          _m("AlbertModel", "AlbertConfig", **TEXT, embedding_size=16),
          _tokens(token_types=True), ("last_hidden_state", "pooler_output")),
    Entry("electra", "encoder",
          _m("ElectraModel", "ElectraConfig", **TEXT, embedding_size=16),
          _tokens(), ("last_hidden_state",)),
    Entry("deberta_v2", "encoder",
          _m("DebertaV2Model", "DebertaV2Config", **TEXT, relative_attention=True,
             position_buckets=16, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
             position_biased_input=False),
          _tokens(), ("last_hidden_state",)),
    Entry("modernbert", "encoder",
          _m("ModernBertModel", "ModernBertConfig", **dict(TEXT, num_hidden_layers=3),
             global_attn_every_n_layers=2, local_attention=8, pad_token_id=0,
             bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2),
          _tokens(), ("last_hidden_state",)),
    # ---- decoders (no KV cache)
    Entry("gpt2", "decoder",
          _m("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_positions=64, n_embd=32,
             n_layer=2, n_head=4, n_inner=64, use_cache=False, bos_token_id=1,
             eos_token_id=2),
          _tokens(), ("logits",), (("use_cache", False),)),
    Entry("gpt_neo", "decoder",
          _m("GPTNeoForCausalLM", "GPTNeoConfig", vocab_size=VOCAB,
             max_position_embeddings=64, hidden_size=32, num_layers=2, num_heads=4,
             intermediate_size=64, attention_types=[[["global", "local"], 1]], window_size=8,
             use_cache=False, bos_token_id=1, eos_token_id=2),
          _tokens(), ("logits",), (("use_cache", False),)),
    Entry("opt", "decoder",
          _m("OPTForCausalLM", "OPTConfig", vocab_size=VOCAB, hidden_size=32,
             num_hidden_layers=2, num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32,
             max_position_embeddings=64, use_cache=False, pad_token_id=0, bos_token_id=1,
             eos_token_id=2),
          _tokens(), ("logits",), (("use_cache", False),)),
    Entry("llama", "decoder", _m("LlamaForCausalLM", "LlamaConfig", **DECODER),
          _tokens(), ("logits",), (("use_cache", False),)),
    Entry("mistral", "decoder",
          _m("MistralForCausalLM", "MistralConfig", **DECODER, sliding_window=8),
          _tokens(), ("logits",), (("use_cache", False),)),
    Entry("qwen2", "decoder", _m("Qwen2ForCausalLM", "Qwen2Config", **DECODER),
          _tokens(), ("logits",), (("use_cache", False),)),
    Entry("phi3", "decoder",
          _m("Phi3ForCausalLM", "Phi3Config", **DECODER, original_max_position_embeddings=64),
          _tokens(), ("logits",), (("use_cache", False),)),
    Entry("gemma", "decoder",
          _m("GemmaForCausalLM", "GemmaConfig", **DECODER, head_dim=8),
          _tokens(), ("logits",), (("use_cache", False),)),
    # ---- encoder-decoder
    Entry("t5_encoder", "seq2seq",
          _m("T5EncoderModel", "T5Config", vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
             num_layers=2, num_heads=4, relative_attention_num_buckets=8,
             relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1,
             decoder_start_token_id=0),
          _tokens(), ("last_hidden_state",)),
    Entry("bart", "seq2seq",
          _m("BartModel", "BartConfig", vocab_size=VOCAB, d_model=32, encoder_layers=2,
             decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
             use_cache=False, pad_token_id=1, bos_token_id=0, eos_token_id=2,
             decoder_start_token_id=2),
          _seq2seq_tokens, ("last_hidden_state", "encoder_last_hidden_state"),
          (("use_cache", False),)),
    # ---- vision
    Entry("vit", "vision", _m("ViTModel", "ViTConfig", **VIT), _image(),
          ("last_hidden_state", "pooler_output")),
    Entry("deit", "vision",
          _m("DeiTForImageClassificationWithTeacher", "DeiTConfig", **VIT, num_labels=10),
          _image(), ("logits",)),
    Entry("beit", "vision",
          _m("BeitModel", "BeitConfig", **VIT, use_relative_position_bias=True,
             use_mean_pooling=True),
          _image(), ("last_hidden_state", "pooler_output")),
    Entry("swin", "vision",
          _m("SwinModel", "SwinConfig", image_size=IMAGE, patch_size=2, num_channels=3,
             embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4, mlp_ratio=2.0),
          _image(), ("last_hidden_state", "pooler_output")),
    Entry("convnext", "vision",
          _m("ConvNextForImageClassification", "ConvNextConfig", num_channels=3,
             patch_size=4, num_stages=2, hidden_sizes=[16, 32], depths=[2, 2], image_size=IMAGE,
             num_labels=10),
          _image(), ("logits",), post=_conv_weights),
    Entry("resnet", "vision",
          _m("ResNetForImageClassification", "ResNetConfig", num_channels=3,
             embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck",
             num_labels=10),
          _image(), ("logits",), post=_conv_weights),
    Entry("mobilenet_v2", "vision",
          _m("MobileNetV2ForImageClassification", "MobileNetV2Config", num_channels=3,
             image_size=IMAGE, depth_multiplier=0.35, num_labels=10),
          _image(), ("logits",), post=_conv_weights),
    Entry("segformer", "vision",
          _m("SegformerForSemanticSegmentation", "SegformerConfig", num_channels=3,
             num_encoder_blocks=2, depths=[1, 1], sr_ratios=[4, 2], hidden_sizes=[16, 32],
             patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
             mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=5),
          _image(), ("logits",), post=_conv_weights),
    # ---- speech
    Entry("wav2vec2", "speech", _m("Wav2Vec2Model", "Wav2Vec2Config", **SPEECH),
          _audio, ("last_hidden_state",)),
    Entry("hubert", "speech", _m("HubertModel", "HubertConfig", **SPEECH),
          _audio, ("last_hidden_state",)),
    Entry("whisper_encoder", "speech", _whisper_encoder, _mel(16, 32),
          ("last_hidden_state",)),
)

REGISTRY: dict[str, Entry] = {e.name: e for e in ENTRIES}


def build(name: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """(the wrapped module, its example inputs) of entry `name`."""
    try:
        entry = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown zoo model {name!r}; choose from {sorted(REGISTRY)}") from None
    return entry.build()


def output_names(name: str) -> list[str]:
    return list(REGISTRY[name].outputs)


def export(name: str, exporter: str, path: str | os.PathLike,
           built: tuple[nn.Module, dict] | None = None) -> Path:
    """Export entry `name` with `exporter` ("ts": TorchScript, opset 17; "dynamo": the
    dynamo exporter at its default opset) to `path`, static shapes, weights inline.
    `built` reuses a `build(name)` result."""
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter: expected one of {EXPORTERS}, got {exporter!r}")
    import torch
    module, inputs = built or build(name)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    args = tuple(inputs.values())
    names, outputs = list(inputs), output_names(name)
    with torch.no_grad():
        if exporter == "ts":
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=TS_OPSET,
                              input_names=names, output_names=outputs)
        else:
            program = torch.onnx.export(module, args, dynamo=True, input_names=names,
                                        output_names=outputs, external_data=False)
            program.save(str(path))
    return path


def eager_outputs(module: nn.Module, inputs: dict[str, torch.Tensor]) -> list[np.ndarray]:
    """PyTorch eager's outputs of `module` on `inputs`, as numpy arrays."""
    import torch
    with torch.no_grad():
        result = module(*inputs.values())
    return [r.detach().cpu().numpy() for r in result]


def numpy_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in inputs.items()}
