"""The runtime: open a built engine and generate (see engine_contract in the project notes)."""

from edgellm.runtime.engine import Engine
from edgellm.runtime.kv_cache import KVBuffer, KVCache
from edgellm.runtime.requests import GenerationRequest, GenerationResult

__all__ = ["Engine", "GenerationRequest", "GenerationResult", "KVBuffer", "KVCache"]
