"""The engine-backend interface: build an engine from an ONNX export, open a session on it, run one step.

This package is the layer under ``edgellm.runtime``: the runtime imports backends, never the reverse (a test walks
the imports). A session owns its KV cache strategy, so the runtime's engine treats every backend alike.

A backend is one module (or subpackage) of this package with a class decorated by ``@register_backend``; the
registry is the backend vocabulary (``edgellm build --backend``, ``edgellm capabilities`` and the farm's toolchains
name backends by its names): adding one is that module, nothing else. A backend that cannot run on this machine
says why in ``unavailable_reason()`` and ``get_backend`` turns that into a clear error (never a silent fallback to
another backend).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from edgellm.backends.sampling import SamplingParams, choose
from edgellm.errors import BugError, ConfigurationError, UnsupportedError
from edgellm.registry import Registry
from edgellm.types import Precision

# The largest engine any backend builds: far past every edge model's context and a board's memory (the KV cache alone
# of 2^20 positions is gigabytes per row), small enough that a typo (1e20, a billion rows) is refused as bad input.
MAX_SEQ_LEN = 1 << 20
MAX_BATCH_SIZE = 1024


@dataclass(frozen=True)
class BuildParams:
    max_batch_size: int
    max_input_len: int
    max_seq_len: int

    def __post_init__(self) -> None:
        top = {"max_batch_size": MAX_BATCH_SIZE, "max_input_len": MAX_SEQ_LEN, "max_seq_len": MAX_SEQ_LEN}
        problems = []
        for k, v in asdict(self).items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                problems.append(f"{k} {v!r} must be an integer >= 1")
            elif v > top[k]:
                problems.append(f"{k} {v} must be <= {top[k]}")
        if not problems and self.max_input_len > self.max_seq_len:
            problems.append(f"max_input_len {self.max_input_len} must be <= max_seq_len {self.max_seq_len}")
        if problems:
            raise ConfigurationError("; ".join(problems))


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: int64, float32, float16
    shape: tuple[int | str, ...]  # symbolic dims are strings


class KVCacheHandle(Protocol):
    """What the runtime holds of a session's KV cache: ``batch_size`` rows, ``length`` positions held (a windowed
    layer keeps the last ``window`` of them), room for ``capacity`` (None: it grows as needed); ``truncate(n)`` drops
    positions >= n (``truncate_problem`` says when a windowed layer no longer holds what that needs)."""

    batch_size: int

    @property
    def length(self) -> int: ...

    @property
    def capacity(self) -> int | None: ...

    @property
    def num_layers(self) -> int: ...

    def truncate(self, length: int) -> None: ...

    def nbytes(self) -> int: ...


def truncate_problem(length: int, new_length: int, windows: tuple[int | None, ...]) -> str | None:
    """Why a cache holding ``length`` positions cannot go back to ``new_length`` (dropping the positions after it),
    or None. A windowed layer's cache holds only its last ``min(length, window)`` positions (``edgellm.models.
    decoder``): going back is possible while it still holds the window - 1 positions before ``new_length`` that the
    next query needs (back over one decode step, or to an empty cache)."""
    if not 0 <= new_length <= length:
        return f"truncate length {new_length} must be between 0 and the cache length {length}"
    for window in sorted({w for w in windows if w is not None}):
        need, held = max(0, new_length - window + 1), max(0, length - window)
        if need < new_length and need < held:
            return (f"truncate length {new_length}: layers of attention window {window} hold positions {held}.."
                    f"{length - 1} only, and going back to {new_length} needs {need}..{new_length - 1} (a windowed "
                    f"cache goes back over one decode step at most, or to 0)")
    return None


def position_ids(attention_mask: np.ndarray, new: int) -> np.ndarray:
    """Position ids int64 [B, new] of the last ``new`` columns of a left-padded mask [B, T]: each row counts its real
    tokens only (padding takes position 0)."""
    return np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0)[:, -new:]


class Session(ABC):
    """An open engine. The runtime asks it for a KV cache (``new_cache``), for steps over that cache (``step``) and
    for whole left-padded batches (``generate``); where the cache lives and how a step reads and writes it is the
    session's own strategy (host arrays for ONNX Runtime, the GPU for torch-cuda). ``run`` takes the export's
    signature (named numpy inputs, past keys and values among them; named numpy outputs)."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    @abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def new_cache(self, batch_size: int, capacity: int) -> KVCacheHandle:
        """An empty cache for ``batch_size`` rows and at least ``capacity`` positions (the caller checked both
        against the engine's limits)."""

    @abstractmethod
    def step(self, input_ids: np.ndarray, positions: np.ndarray, attention_mask: np.ndarray, cache: Any, *,
             last_only: bool) -> np.ndarray:
        """int64 [B, S] ids and positions, mask [B, cache.length + S] -> float32 logits [B, S, vocab] ([B, 1, vocab]
        with ``last_only``); the S positions are appended to ``cache``."""

    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray, steps: int,
                 sampling: list[SamplingParams], finished: np.ndarray) -> Iterator[np.ndarray]:
        """Prefill the left-padded batch (ids and mask int64 [B, S]), then yield each step's chosen tokens, int64
        [B], ``steps`` times. ``finished`` bool [B] is the caller's: it marks rows that have ended, whose tokens are
        no longer chosen (the caller ignores them). Here the tokens are chosen on the host from ``step``'s logits,
        with one numpy Generator per sampling row; a session that samples on its device overrides this."""
        b, s = input_ids.shape
        cache = self.new_cache(b, s + steps)
        rngs = [np.random.default_rng(p.seed) if p.temperature > 0 else None for p in sampling]
        mask = attention_mask
        logits = self.step(input_ids, position_ids(mask, s), mask, cache, last_only=True)[:, -1]
        tokens = np.zeros((b, 1), dtype=np.int64)
        ones = np.ones((b, 1), dtype=np.int64)
        for n in range(steps):
            for i, (p, rng) in enumerate(zip(sampling, rngs, strict=True)):
                if not finished[i]:
                    tokens[i, 0] = choose(logits[i], temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                          rng=rng)
            yield tokens[:, 0].copy()
            if n + 1 < steps:
                mask = np.concatenate([mask, ones], axis=1)
                logits = self.step(tokens, position_ids(mask, 1), mask, cache, last_only=True)[:, -1]


class EngineBackend(ABC):
    backend: ClassVar[str]  # its name (lower-case letters, digits and '-')
    precisions: ClassVar[tuple[Precision, ...]]  # weight precisions it can build an engine at and run
    # why it refuses precisions the project exports but it does not build (capabilities and the build say it)
    refused: ClassVar[Mapping[Precision, str]] = {}
    # where its engines run ("cpu" or "cuda"): eval runs the transformers reference there unless told otherwise
    device: ClassVar[str]

    @classmethod
    def precision_problem(cls, precision: Precision) -> str | None:
        """None when this backend builds ``precision`` engines; else one line saying why not and what it builds."""
        if precision in cls.precisions:
            return None
        why = cls.refused.get(precision, "not implemented")
        return (f"backend {cls.backend!r} does not build {precision.value} engines ({why}); it builds "
                f"{', '.join(p.value for p in cls.precisions)}")

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when the backend can build and run here; else why not (what is missing)."""
        return None

    @classmethod
    def available(cls) -> tuple[bool, str | None]:
        reason = cls.unavailable_reason()
        return reason is None, reason

    @abstractmethod
    def version(self) -> str: ...

    @abstractmethod
    def build(self, onnx_model: Path, out_dir: Path, params: BuildParams) -> dict[str, Any]:
        """Write the engine's files into ``out_dir``; return backend-specific manifest fields, including
        ``engine_files`` (relative names), ``io`` (signature) and ``precision`` read back from the built engine."""

    @abstractmethod
    def open(self, engine_dir: Path, manifest: dict[str, Any], *, num_threads: int | None = None) -> Session: ...


BACKENDS: Registry[type[EngineBackend]] = Registry("backend")


def register_backend(cls: type[EngineBackend]) -> type[EngineBackend]:
    name = getattr(cls, "backend", None)
    if not isinstance(name, str) or not re.match(r"^[a-z0-9][a-z0-9-]*\Z", name):
        raise BugError(f"backend class {cls.__qualname__} must set backend to a lower-case name, got {name!r}")
    BACKENDS.add(name, cls)
    return cls


def backend_names() -> list[str]:
    """Every backend's name (the vocabulary), sorted."""
    _load_builtin_backends()
    return list(BACKENDS)


def parse_backend(name: str, *, what: str = "backend") -> str:
    """A backend name someone gave: a registered one, else a ConfigurationError naming it and the valid ones."""
    _load_builtin_backends()
    found = str(name).strip().lower()
    if found not in BACKENDS:
        raise ConfigurationError(BACKENDS.unknown_message(found).replace("unknown backend", f"unknown {what}", 1))
    return found


def backend_class(name: str) -> type[EngineBackend]:
    """The implementation of a backend, whether or not it can run on this machine (its declarations)."""
    return BACKENDS.get(parse_backend(name))


def get_backend(name: str) -> EngineBackend:
    cls = backend_class(name)
    reason = cls.unavailable_reason()
    if reason:
        raise UnsupportedError(f"backend {cls.backend!r} is not available on this machine ({reason})")
    return cls()


def registered_backends() -> dict[str, type[EngineBackend]]:
    """Every backend implemented in this package (found by importing its modules), by name."""
    _load_builtin_backends()
    return dict(BACKENDS.items())


def _load_builtin_backends() -> None:
    """Import every module of this package once: their ``@register_backend`` classes fill the registry."""
    from edgellm.registry import import_submodules

    import_submodules("edgellm.backends", skip={"base"})
