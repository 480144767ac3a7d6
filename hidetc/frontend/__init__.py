"""Model frontends. Only ONNX today: `load_model(path, shapes=None) -> Graph`."""
from hidetc.frontend.onnx import OPSET_RANGE, import_model, load_model

__all__ = ["OPSET_RANGE", "import_model", "load_model"]
