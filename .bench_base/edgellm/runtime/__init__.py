"""The runtime: open a built engine and generate (see engine_contract in the project notes). It sits on
``edgellm.backends`` (whose sessions own the KV caches; ``KVBuffer`` and ``KVCache`` are ONNX Runtime's host caches,
re-exported here) and is imported by nothing there."""

from edgellm.backends.kv_cache import KVBuffer, KVCache
from edgellm.runtime.engine import Engine
from edgellm.runtime.requests import GenerationRequest, GenerationResult

__all__ = ["Engine", "GenerationRequest", "GenerationResult", "KVBuffer", "KVCache"]
