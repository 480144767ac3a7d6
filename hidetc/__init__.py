"""hidetc: a deep-learning model compiler. ONNX in; a packaged, verified artifact out.

The Python API: `compile_model(model_path, out_dir, ...)` and `load(out_dir)`, imported
on first use (so `python -m hidetc.driver.tune.worker` and other light entry points do not pay
for the whole compiler).
"""
__version__ = "0.1.0"

__all__ = ["compile_model", "load", "__version__"]


def __getattr__(name: str):
    if name in ("compile_model", "load"):
        from hidetc.driver import api
        return getattr(api, name)
    raise AttributeError(f"module 'hidetc' has no attribute {name!r}")
