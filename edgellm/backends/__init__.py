"""Engine backends (ONNX Runtime here; TensorRT is one more implementation of ``EngineBackend`` later)."""

from edgellm.backends.base import BACKENDS, BuildParams, EngineBackend, Session, TensorSpec, get_backend

__all__ = ["BACKENDS", "BuildParams", "EngineBackend", "Session", "TensorSpec", "get_backend"]
