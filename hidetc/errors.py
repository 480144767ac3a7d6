"""User-facing errors. Every error a user can cause is a `HidetcError` whose message is
one line naming the problem (file, node, op, input, expected vs got). The CLI prints it
and exits with code 2; anything else is a bug and shows a traceback."""


class HidetcError(Exception):
    """Base class: the message is shown to the user as is."""


class ModelError(HidetcError):
    """The model file is missing, unreadable, not ONNX, or outside the supported opsets."""


class UnsupportedOpError(ModelError):
    """The model uses operators hidetc does not implement."""


class ShapeError(HidetcError):
    """Shapes or dtypes of an operator's inputs are inconsistent."""


class ArtifactError(HidetcError):
    """An artifact directory is missing, corrupted, or from a newer format."""


class InputError(HidetcError):
    """A run input is missing or has the wrong name, shape or dtype."""


class ToolchainError(HidetcError):
    """A compiler (gcc, nvcc) is missing or failed; the message holds the command."""


class VerificationError(HidetcError):
    """The compiled artifact does not match ONNX Runtime within tolerance."""


class ReferenceUnavailable(HidetcError):
    """ONNX Runtime cannot load or run the model (an op or type it does not implement);
    `reason` is ORT's own message, on one line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class ConfigError(HidetcError):
    """A compile configuration file or option is invalid."""


class RecordsError(HidetcError):
    """A tuning records store or an exported records file is unreadable or malformed."""
