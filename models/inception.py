"""Inception-V3 (torchvision layout, eval mode: no AuxLogits, no transform_input)."""

from __future__ import annotations

from typing import Callable

import onnx

from ._builder import FLOAT, GraphBuilder

BN_EPS = 1e-3  # torchvision BasicConv2d uses BatchNorm2d(eps=0.001)
M2_MAXPOOL = 3.0  # measured E[maxpool3x3(x)^2] / E[x^2] for post-ReLU activations

# Full model: 299x299, all Mixed blocks, channel divisor 1.
FULL = dict(image=299, div=1, classes=1000,
            blocks=(("Mixed_5b", "A", 32), ("Mixed_5c", "A", 64), ("Mixed_5d", "A", 64),
                    ("Mixed_6a", "B", 0), ("Mixed_6b", "C", 128), ("Mixed_6c", "C", 160),
                    ("Mixed_6d", "C", 160), ("Mixed_6e", "C", 192), ("Mixed_7a", "D", 0),
                    ("Mixed_7b", "E", 0), ("Mixed_7c", "E", 0)))
# Tiny model: 75x75 is the smallest input with valid spatial sizes (Mixed_7a -> 1x1);
# one block of each type, channels divided by 8.
TINY = dict(image=75, div=8, classes=10,
            blocks=(("Mixed_5b", "A", 32), ("Mixed_6a", "B", 0), ("Mixed_6b", "C", 128),
                    ("Mixed_7a", "D", 0), ("Mixed_7b", "E", 0)))


class _Net:
    """Holds the builder, the channel divisor and the BN-folding flag."""

    def __init__(self, b: GraphBuilder, div: int, fold: bool):
        self.b, self.div, self.fold = b, div, fold
        self.m2 = 0.5  # estimated E[x^2] of the current block input (for BN running stats)

    def ch(self, n: int) -> int:
        return max(2, n // self.div)

    def basic(self, x: str, name: str, cin: int, cout: int, k, stride=1, pad=0,
              in_m2: float = 0.5) -> str:
        """BasicConv2d: conv (no bias) + bn + F.relu.  ``cout`` is the *unscaled* count;
        ``in_m2`` the estimated E[x^2] of the input."""
        b = self.b
        with b.scope(name):
            y = b.conv_bn(x, cin, self.ch(cout), k, stride, pad, eps=BN_EPS, fold=self.fold,
                          in_m2=in_m2)
            return b.op("Relu", [y])

    def avg_pool(self, x: str) -> str:
        """F.avg_pool2d(x, kernel_size=3, stride=1, padding=1) (count_include_pad=True)."""
        return self.b.op("AveragePool", [x], ceil_mode=0, count_include_pad=1,
                         kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])

    def max_pool(self, x: str) -> str:
        """nn.MaxPool2d(3, 2) / F.max_pool2d(x, kernel_size=3, stride=2)."""
        return self.b.op("MaxPool", [x], ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
                         pads=[0, 0, 0, 0], strides=[2, 2])

    def concat(self, xs: list[str]) -> str:
        return self.b.op("Concat", xs, axis=1)

    def first(self, x: str, name: str, cin: int, cout: int, k=1, stride=1, pad=0) -> str:
        """A BasicConv2d that reads the block input (whose E[x^2] is ``self.m2``)."""
        return self.basic(x, name, cin, cout, k, stride, pad, in_m2=self.m2)

    def after_max_pool(self, c_conv: int, c_pool: int) -> None:
        """Block output = concat(relu branches, max-pooled input): update ``self.m2``."""
        self.m2 = (0.5 * c_conv + M2_MAXPOOL * self.m2 * c_pool) / (c_conv + c_pool)


def _block_a(n: _Net, x: str, cin: int, pool_features: int) -> tuple[str, int]:
    b1 = n.first(x, "branch1x1", cin, 64, 1)
    b5 = n.first(x, "branch5x5_1", cin, 48, 1)
    b5 = n.basic(b5, "branch5x5_2", n.ch(48), 64, 5, pad=2)
    b3 = n.first(x, "branch3x3dbl_1", cin, 64, 1)
    b3 = n.basic(b3, "branch3x3dbl_2", n.ch(64), 96, 3, pad=1)
    b3 = n.basic(b3, "branch3x3dbl_3", n.ch(96), 96, 3, pad=1)
    bp = n.first(n.avg_pool(x), "branch_pool", cin, pool_features, 1)
    n.m2 = 0.5
    return n.concat([b1, b5, b3, bp]), n.ch(64) * 2 + n.ch(96) + n.ch(pool_features)


def _block_b(n: _Net, x: str, cin: int, _: int) -> tuple[str, int]:
    b3 = n.first(x, "branch3x3", cin, 384, 3, stride=2)
    bd = n.first(x, "branch3x3dbl_1", cin, 64, 1)
    bd = n.basic(bd, "branch3x3dbl_2", n.ch(64), 96, 3, pad=1)
    bd = n.basic(bd, "branch3x3dbl_3", n.ch(96), 96, 3, stride=2)
    bp = n.max_pool(x)
    n.after_max_pool(n.ch(384) + n.ch(96), cin)
    return n.concat([b3, bd, bp]), n.ch(384) + n.ch(96) + cin


def _block_c(n: _Net, x: str, cin: int, c7: int) -> tuple[str, int]:
    m = n.ch(c7)
    b1 = n.first(x, "branch1x1", cin, 192, 1)
    b7 = n.first(x, "branch7x7_1", cin, c7, 1)
    b7 = n.basic(b7, "branch7x7_2", m, c7, (1, 7), pad=(0, 3))
    b7 = n.basic(b7, "branch7x7_3", m, 192, (7, 1), pad=(3, 0))
    bd = n.first(x, "branch7x7dbl_1", cin, c7, 1)
    bd = n.basic(bd, "branch7x7dbl_2", m, c7, (7, 1), pad=(3, 0))
    bd = n.basic(bd, "branch7x7dbl_3", m, c7, (1, 7), pad=(0, 3))
    bd = n.basic(bd, "branch7x7dbl_4", m, c7, (7, 1), pad=(3, 0))
    bd = n.basic(bd, "branch7x7dbl_5", m, 192, (1, 7), pad=(0, 3))
    bp = n.first(n.avg_pool(x), "branch_pool", cin, 192, 1)
    n.m2 = 0.5
    return n.concat([b1, b7, bd, bp]), n.ch(192) * 4


def _block_d(n: _Net, x: str, cin: int, _: int) -> tuple[str, int]:
    b3 = n.first(x, "branch3x3_1", cin, 192, 1)
    b3 = n.basic(b3, "branch3x3_2", n.ch(192), 320, 3, stride=2)
    b7 = n.first(x, "branch7x7x3_1", cin, 192, 1)
    b7 = n.basic(b7, "branch7x7x3_2", n.ch(192), 192, (1, 7), pad=(0, 3))
    b7 = n.basic(b7, "branch7x7x3_3", n.ch(192), 192, (7, 1), pad=(3, 0))
    b7 = n.basic(b7, "branch7x7x3_4", n.ch(192), 192, 3, stride=2)
    bp = n.max_pool(x)
    n.after_max_pool(n.ch(320) + n.ch(192), cin)
    return n.concat([b3, b7, bp]), n.ch(320) + n.ch(192) + cin


def _block_e(n: _Net, x: str, cin: int, _: int) -> tuple[str, int]:
    b1 = n.first(x, "branch1x1", cin, 320, 1)
    b3 = n.first(x, "branch3x3_1", cin, 384, 1)
    b3 = n.concat([n.basic(b3, "branch3x3_2a", n.ch(384), 384, (1, 3), pad=(0, 1)),
                   n.basic(b3, "branch3x3_2b", n.ch(384), 384, (3, 1), pad=(1, 0))])
    bd = n.first(x, "branch3x3dbl_1", cin, 448, 1)
    bd = n.basic(bd, "branch3x3dbl_2", n.ch(448), 384, 3, pad=1)
    bd = n.concat([n.basic(bd, "branch3x3dbl_3a", n.ch(384), 384, (1, 3), pad=(0, 1)),
                   n.basic(bd, "branch3x3dbl_3b", n.ch(384), 384, (3, 1), pad=(1, 0))])
    bp = n.first(n.avg_pool(x), "branch_pool", cin, 192, 1)
    n.m2 = 0.5
    return n.concat([b1, b3, bd, bp]), n.ch(320) + n.ch(384) * 4 + n.ch(192)


_BLOCKS: dict[str, Callable[[_Net, str, int, int], tuple[str, int]]] = {
    "A": _block_a, "B": _block_b, "C": _block_c, "D": _block_d, "E": _block_e}


def _stem(n: _Net, x: str) -> tuple[str, int]:
    x = n.basic(x, "Conv2d_1a_3x3", 3, 32, 3, stride=2, in_m2=1.0)
    x = n.basic(x, "Conv2d_2a_3x3", n.ch(32), 32, 3)
    x = n.basic(x, "Conv2d_2b_3x3", n.ch(32), 64, 3, pad=1)
    with n.b.scope("maxpool1"):
        x = n.max_pool(x)
    x = n.basic(x, "Conv2d_3b_1x1", n.ch(64), 80, 1, in_m2=0.5 * M2_MAXPOOL)
    x = n.basic(x, "Conv2d_4a_3x3", n.ch(80), 192, 3)
    with n.b.scope("maxpool2"):
        x = n.max_pool(x)
    n.m2 = 0.5 * M2_MAXPOOL
    return x, n.ch(192)


def build_inception_v3(tiny: bool = False, seed: int = 0, fold_bn: bool = False) -> onnx.ModelProto:
    cfg = TINY if tiny else FULL
    b = GraphBuilder("inception_v3", seed)
    n = _Net(b, cfg["div"], fold_bn)
    x = b.input("input", FLOAT, [1, 3, cfg["image"], cfg["image"]])
    x, c = _stem(n, x)
    for name, kind, arg in cfg["blocks"]:
        with b.scope(name):
            x, c = _BLOCKS[kind](n, x, c, arg)
    with b.scope("avgpool"):  # nn.AdaptiveAvgPool2d((1, 1))
        x = b.op("GlobalAveragePool", [x])
    with b.scope("dropout"):  # kept as an inference Dropout (no ratio / training_mode inputs)
        x = b.op("Dropout", [x])
    x = b.op("Flatten", [x], axis=1)
    with b.scope("fc"):
        b.gemm(x, c, cfg["classes"], outputs=["output"])
    b.output("output", FLOAT, [1, cfg["classes"]])
    meta = dict(model="inception_v3", tiny=int(tiny), seed=seed, fold_bn=int(fold_bn))
    return b.make_model(meta, doc="Inception-V3 (torchvision layout), random weights")
