"""The KV caches an ONNX Runtime session keeps on the host: per layer, keys and values [B, kv_heads, length, head_dim].

Two kinds, one interface (``batch_size``, ``length``, ``capacity``, ``num_layers``, ``keys``, ``values``,
``truncate``, ``copy``, ``nbytes``, and ``run_step``, which runs one step of a session over the cache): ``KVCache``
holds each step's present outputs (graphs that concatenate the past with the new positions); ``KVBuffer`` is
preallocated to a capacity and the graph writes the new positions into it in place (ONNX Runtime's
GroupQueryAttention with past and present bound to one buffer), so a step copies no cache at all.

``windows`` (per layer, ``family.layer_windows``): a windowed layer's present holds its last ``window`` positions
only (the graph keeps no more: ``edgellm.models.decoder``), so its cache is that present in both kinds, never
preallocated and never longer than the window; ``length`` counts the sequence's positions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from edgellm.backends.base import truncate_problem
from edgellm.errors import BugError

if TYPE_CHECKING:
    from edgellm.backends.ort import OrtSession


class KVCache:
    def __init__(self, num_layers: int, batch_size: int, kv_heads: int, head_dim: int, dtype: np.dtype,
                 windows: tuple[int | None, ...] | None = None) -> None:
        self.batch_size = batch_size
        self.dtype = np.dtype(dtype)
        self.windows = _windows(windows, num_layers)
        self.length = 0  # positions of the sequence (a windowed layer holds the last ``window`` of them)
        empty = np.zeros((batch_size, kv_heads, 0, head_dim), dtype=self.dtype)
        self.keys: list[np.ndarray] = [empty] * num_layers
        self.values: list[np.ndarray] = [empty] * num_layers

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    @property
    def capacity(self) -> None:
        """None: the cache grows with every step."""
        return None

    def update(self, keys: list[np.ndarray], values: list[np.ndarray]) -> None:
        self.keys, self.values = keys, values

    def run_step(self, session: OrtSession, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The past fed from here, the present kept: returns the logits."""
        pasts = [k for pair in zip(self.keys, self.values, strict=True) for k in pair]  # k0, v0, k1, ...
        feeds = {**feeds, **{past: t for (past, _), t in zip(session.kv_names, pasts, strict=True)}}
        out = session.run(feeds)
        present = [out[name] for _, name in session.kv_names]
        self.update(present[0::2], present[1::2])
        self.length += feeds["input_ids"].shape[1]
        return out["logits"]

    def truncate(self, length: int) -> None:
        """Drop positions >= ``length`` (e.g. a benchmark reusing one prefilled cache). Copies: a view would be
        fed to the session non-contiguous, and copied again on every step that reads it."""
        _check_truncate(length, self.length, self.windows)
        self.keys = [np.ascontiguousarray(_first(k, self.length, length)) for k in self.keys]
        self.values = [np.ascontiguousarray(_first(v, self.length, length)) for v in self.values]
        self.length = length

    def copy(self) -> KVCache:
        new = object.__new__(KVCache)
        new.batch_size, new.dtype, new.windows, new.length = self.batch_size, self.dtype, self.windows, self.length
        new.keys = [k.copy() for k in self.keys]
        new.values = [v.copy() for v in self.values]
        return new

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values, strict=True))


class KVBuffer:
    """Keys and values preallocated to ``capacity`` positions, which the graph fills in place. ``buffers`` is
    (k0, v0, k1, v1, ...), each [B, kv_heads, capacity, head_dim]; positions >= ``length`` are stale (the graph
    attends to ``length`` + the new positions only, and overwrites them). A windowed layer's two entries are its
    last present instead, [B, kv_heads, min(length, window), head_dim], replaced at every step (its graph output
    is a slice of past + new, which cannot be written in place). ``binding`` is the session's own state over these
    buffers (ONNX Runtime: an IOBinding), made on first use and never copied."""

    def __init__(self, num_layers: int, batch_size: int, kv_heads: int, head_dim: int, dtype: np.dtype,
                 capacity: int, windows: tuple[int | None, ...] | None = None) -> None:
        self.batch_size = batch_size
        self.dtype = np.dtype(dtype)
        self.capacity = capacity
        self.windows = _windows(windows, num_layers)
        self.length = 0
        self.buffers = [np.zeros((batch_size, kv_heads, capacity if w is None else 0, head_dim), dtype=self.dtype)
                        for w in self.windows for _ in range(2)]
        self.binding: Any = None

    @property
    def num_layers(self) -> int:
        return len(self.buffers) // 2

    def _held(self, buffers: list[np.ndarray]) -> list[np.ndarray]:
        return [b if w is not None else b[:, :, :self.length] for b, w in zip(buffers, self.windows, strict=True)]

    @property
    def keys(self) -> list[np.ndarray]:
        """Views [B, kv_heads, length, head_dim] (not contiguous); a windowed layer's last ``window`` positions."""
        return self._held(self.buffers[0::2])

    @property
    def values(self) -> list[np.ndarray]:
        return self._held(self.buffers[1::2])

    def run_step(self, session: OrtSession, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The graph writes the step's keys and values into the buffers after ``length``: returns the logits."""
        logits = session.run_in_place(feeds, self)
        self.advance(feeds["input_ids"].shape[1])
        return logits

    def advance(self, positions: int) -> None:
        """Count ``positions`` the graph has just written after ``length``."""
        if not 0 <= self.length + positions <= self.capacity:
            raise ValueError(f"{self.length} + {positions} positions exceed the KV buffer's capacity {self.capacity}")
        self.length += positions

    def truncate(self, length: int) -> None:
        """Drop positions >= ``length`` (they become stale; the next step overwrites them)."""
        _check_truncate(length, self.length, self.windows)
        for j, w in enumerate(w for w in self.windows for _ in range(2)):  # in the list ``binding`` reads
            if w is not None:
                self.buffers[j] = np.ascontiguousarray(_first(self.buffers[j], self.length, length))
        self.length = length

    def copy(self) -> KVBuffer:
        new = object.__new__(KVBuffer)
        new.batch_size, new.dtype, new.capacity, new.length = self.batch_size, self.dtype, self.capacity, self.length
        new.windows = self.windows
        new.buffers = [b.copy() for b in self.buffers]
        new.binding = None
        return new

    def nbytes(self) -> int:
        """Bytes allocated (the whole capacity; a windowed layer's last ``window`` positions)."""
        return sum(b.nbytes for b in self.buffers)


def _windows(windows: tuple[int | None, ...] | None, num_layers: int) -> tuple[int | None, ...]:
    if windows is None:
        return (None,) * num_layers
    if len(windows) != num_layers:
        raise BugError(f"{len(windows)} layer windows for {num_layers} layers")
    return tuple(windows)


def _first(held: np.ndarray, length: int, new_length: int) -> np.ndarray:
    """The positions < ``new_length`` of a layer's cache ``held`` [B, kv_heads, n, head_dim], which holds the last
    n of ``length`` positions (all of them, or a windowed layer's last ``window``)."""
    return held[:, :, :new_length - (length - held.shape[2])]


def _check_truncate(length: int, held: int, windows: tuple[int | None, ...]) -> None:
    problem = truncate_problem(held, length, windows)
    if problem is not None:
        raise ValueError(problem)
