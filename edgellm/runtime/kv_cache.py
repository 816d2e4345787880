"""The KV cache the runtime feeds back into the graph: per layer, keys and values [B, kv_heads, length, head_dim]."""

from __future__ import annotations

import numpy as np


class KVCache:
    def __init__(self, num_layers: int, batch_size: int, kv_heads: int, head_dim: int, dtype: np.dtype) -> None:
        self.batch_size = batch_size
        self.dtype = np.dtype(dtype)
        empty = np.zeros((batch_size, kv_heads, 0, head_dim), dtype=self.dtype)
        self.keys: list[np.ndarray] = [empty] * num_layers
        self.values: list[np.ndarray] = [empty] * num_layers

    @property
    def length(self) -> int:
        """Positions currently held."""
        return int(self.keys[0].shape[2]) if self.keys else 0

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def update(self, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        self.keys, self.values = keys, values

    def truncate(self, length: int) -> None:
        """Drop positions >= ``length`` (e.g. a benchmark reusing one prefilled cache)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"truncate length {length} must be between 0 and the cache length {self.length}")
        self.keys = [k[:, :, :length] for k in self.keys]
        self.values = [v[:, :, :length] for v in self.values]

    def copy(self) -> KVCache:
        new = object.__new__(KVCache)
        new.batch_size, new.dtype = self.batch_size, self.dtype
        new.keys = [k.copy() for k in self.keys]
        new.values = [v.copy() for v in self.values]
        return new

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values, strict=True))
