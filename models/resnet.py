"""ResNet-50 (torchvision layout, Bottleneck v1.5: stride on the 3x3 conv)."""

from __future__ import annotations

import onnx

from ._builder import FLOAT, GraphBuilder

FULL = dict(image=224, stem=64, widths=(64, 128, 256, 512), blocks=(3, 4, 6, 3), classes=1000)
# Two blocks in layer1 so the tiny model also has an identity (non-downsample) shortcut.
TINY = dict(image=32, stem=8, widths=(4, 8, 16, 32), blocks=(2, 1, 1, 1), classes=10)
EXPANSION = 4
# Measured second moments used to pick BN running_var so activations stay O(1):
M2_STEM = 2.8  # E[x^2] after conv1/bn1/relu/maxpool for a N(0, 1) image
M2_DOWNSAMPLE = 0.8  # E[relu(bn3 + downsample)^2]
M2_IDENTITY = 0.8  # E[relu(bn3 + x)^2] / (1 + E[x^2]) (x >= 0, so relu passes most of it)


def _relu(b: GraphBuilder, x: str) -> str:
    with b.scope("relu"):
        return b.op("Relu", [x])


def _bottleneck(b: GraphBuilder, x: str, cin: int, width: int, stride: int, fold: bool,
                m2: float) -> tuple[str, float]:
    """torchvision Bottleneck; ``m2`` is the estimated E[x^2] of the input (so that the
    BN running stats keep activations O(1)); returns the output and its estimate."""
    cout = width * EXPANSION
    out = _relu(b, b.conv_bn(x, cin, width, 1, names=("conv1", "bn1"), fold=fold, in_m2=m2))
    out = _relu(b, b.conv_bn(out, width, width, 3, stride, 1, names=("conv2", "bn2"), fold=fold))
    out = b.conv_bn(out, width, cout, 1, names=("conv3", "bn3"), fold=fold)
    identity = x
    if stride != 1 or cin != cout:
        with b.scope("downsample"):
            identity = b.conv_bn(x, cin, cout, 1, stride, names=("0", "1"), fold=fold, in_m2=m2)
        m2_out = M2_DOWNSAMPLE
    else:
        m2_out = M2_IDENTITY * (1.0 + m2)
    out = b.op("Add", [out, identity])
    return _relu(b, out), m2_out


def build_resnet50(tiny: bool = False, seed: int = 0, fold_bn: bool = False,
                   dynamic: bool = False) -> onnx.ModelProto:
    """ResNet-50; ``fold_bn=False`` keeps BatchNormalization after bias-less Convs
    (the compiler has to fold them), ``fold_bn=True`` emits Convs with folded biases;
    ``dynamic``: the batch axis is the symbolic dimension "batch"."""
    cfg = TINY if tiny else FULL
    b = GraphBuilder("resnet50", seed)
    batch = "batch" if dynamic else 1
    x = b.input("input", FLOAT, [batch, 3, cfg["image"], cfg["image"]])
    x = _relu(b, b.conv_bn(x, 3, cfg["stem"], 7, 2, 3, names=("conv1", "bn1"), fold=fold_bn,
                           in_m2=1.0))
    with b.scope("maxpool"):
        x = b.op("MaxPool", [x], ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
                 pads=[1, 1, 1, 1], strides=[2, 2])
    cin, m2 = cfg["stem"], M2_STEM
    for i, (width, n) in enumerate(zip(cfg["widths"], cfg["blocks"])):
        with b.scope(f"layer{i + 1}"):
            for j in range(n):
                with b.scope(str(j)):
                    stride = 2 if (j == 0 and i > 0) else 1
                    x, m2 = _bottleneck(b, x, cin, width, stride, fold_bn, m2)
                cin = width * EXPANSION
    with b.scope("avgpool"):
        x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x], axis=1)
    with b.scope("fc"):
        b.gemm(x, cin, cfg["classes"], outputs=["output"])
    b.output("output", FLOAT, [batch, cfg["classes"]])
    meta = dict(model="resnet50", tiny=int(tiny), seed=seed, fold_bn=int(fold_bn))
    return b.make_model(meta, doc="ResNet-50 (torchvision layout), random weights")
