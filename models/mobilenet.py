"""MobileNet-V2 (torchvision layout: Conv2dNormActivation with ReLU6 exported as Clip)."""

from __future__ import annotations

import onnx

from ._builder import FLOAT, GraphBuilder

# (expand ratio t, output channels c, repeats n, first stride s)
FULL = dict(image=224, stem=32, last=1280, classes=1000,
            settings=((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                      (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)))
TINY = dict(image=32, stem=8, last=64, classes=10,
            settings=((1, 8, 1, 1), (6, 8, 2, 2), (6, 16, 2, 2), (6, 24, 1, 1)))


def _relu6(b: GraphBuilder, x: str) -> str:
    """nn.ReLU6 -> hardtanh(0, 6) -> Clip with min/max Constant inputs (opset >= 11)."""
    return b.op("Clip", [x, b.f32(0.0), b.f32(6.0)])


def _conv_bn_act(b: GraphBuilder, x: str, cin: int, cout: int, k: int, stride: int = 1,
                 groups: int = 1, fold: bool = False, in_m2: float = 0.5) -> str:
    """Conv2dNormActivation: Sequential(Conv2d "0", BatchNorm2d "1", ReLU6 "2")."""
    x = b.conv_bn(x, cin, cout, k, stride, (k - 1) // 2, groups, names=("0", "1"), fold=fold,
                  in_m2=in_m2)
    with b.scope("2"):
        return _relu6(b, x)


def _inverted_residual(b: GraphBuilder, x: str, cin: int, cout: int, stride: int, t: int,
                       fold: bool, m2: float) -> tuple[str, float]:
    """InvertedResidual; ``m2`` is the estimated E[x^2] of the input (used to pick BN
    running stats that keep activations O(1)); returns the output and its estimate."""
    hidden = cin * t
    idx = 0
    with b.scope("conv"):
        y = x
        if t != 1:
            with b.scope(str(idx)):
                y = _conv_bn_act(b, y, cin, hidden, 1, fold=fold, in_m2=m2)
            idx += 1
        with b.scope(str(idx)):  # depthwise
            y = _conv_bn_act(b, y, hidden, hidden, 3, stride, groups=hidden, fold=fold)
        y = b.conv_bn(y, hidden, cout, 1, names=(str(idx + 1), str(idx + 2)), fold=fold)
    if stride == 1 and cin == cout:
        return b.op("Add", [x, y]), 1.0 + m2
    return y, 1.0


def build_mobilenet_v2(tiny: bool = False, seed: int = 0, fold_bn: bool = False) -> onnx.ModelProto:
    cfg = TINY if tiny else FULL
    b = GraphBuilder("mobilenet_v2", seed)
    x = b.input("input", FLOAT, [1, 3, cfg["image"], cfg["image"]])
    cin = cfg["stem"]
    with b.scope("features"):
        with b.scope("0"):
            x = _conv_bn_act(b, x, 3, cin, 3, 2, fold=fold_bn, in_m2=1.0)
        idx, m2 = 1, 0.5
        for t, c, n, s in cfg["settings"]:
            for i in range(n):
                with b.scope(str(idx)):
                    x, m2 = _inverted_residual(b, x, cin, c, s if i == 0 else 1, t, fold_bn, m2)
                cin, idx = c, idx + 1
        with b.scope(str(idx)):
            x = _conv_bn_act(b, x, cin, cfg["last"], 1, fold=fold_bn, in_m2=m2)
    x = b.op("GlobalAveragePool", [x])  # nn.functional.adaptive_avg_pool2d(x, (1, 1))
    x = b.op("Flatten", [x], axis=1)
    with b.scope("classifier"), b.scope("1"):  # classifier.0 is Dropout (elided in eval)
        b.gemm(x, cfg["last"], cfg["classes"], outputs=["output"])
    b.output("output", FLOAT, [1, cfg["classes"]])
    meta = dict(model="mobilenet_v2", tiny=int(tiny), seed=seed, fold_bn=int(fold_bn))
    return b.make_model(meta, doc="MobileNet-V2 (torchvision layout), random weights")
