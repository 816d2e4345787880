"""Engine backends: ONNX Runtime on the CPU (``ort``) and torch on an NVIDIA GPU (``torch-cuda``); a new one is one more
module here with an ``EngineBackend`` class decorated by ``@register_backend``."""

from edgellm.backends.base import BACKENDS, BuildParams, EngineBackend, Session, TensorSpec, get_backend

__all__ = ["BACKENDS", "BuildParams", "EngineBackend", "Session", "TensorSpec", "get_backend"]
