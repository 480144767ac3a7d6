"""(filled in by the decomposition work; see handlers.DECOMPOSERS)"""
from __future__ import annotations

from hidetc.frontend.onnx.base import Handler

HANDLERS: dict[str, Handler] = {}
EXTRA_OPS: tuple[str, ...] = ()    # ONNX ops read only as decompositions (not in the catalogue)
CHECKED: tuple[str, ...] = ()      # ops whose schema history 1..28 this module reviewed
FIRST_VERSION: dict[str, int] = {}  # of CHECKED ops whose oldest read version is not opset 7's
