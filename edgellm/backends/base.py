"""The engine-backend interface: build an engine from an ONNX export, open a session on it, run one step.

A backend is one module in this package with a class decorated by ``@register_backend``; the registry is keyed
by the ``Backend`` enum. A backend that cannot run on this machine says why in ``unavailable_reason()`` and
``get_backend`` turns that into a clear error (never a silent fallback to another backend).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from edgellm.errors import BugError, ConfigurationError, UnsupportedError
from edgellm.registry import Registry
from edgellm.types import Backend, Precision

if TYPE_CHECKING:
    from edgellm.runtime.kv_cache import KVBuffer
    from edgellm.runtime.sampling import SamplingParams


@dataclass(frozen=True)
class BuildParams:
    max_batch_size: int
    max_input_len: int
    max_seq_len: int

    def __post_init__(self) -> None:
        problems = [f"{k} {v!r} must be an integer >= 1" for k, v in asdict(self).items()
                    if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if not problems and self.max_input_len > self.max_seq_len:
            problems.append(f"max_input_len {self.max_input_len} must be <= max_seq_len {self.max_seq_len}")
        if problems:
            raise ConfigurationError("; ".join(problems))


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name: int64, float32, float16
    shape: tuple[int | str, ...]  # symbolic dims are strings


class Session(ABC):
    """An open engine: named numpy inputs in, named numpy outputs out."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    # True when the graph writes a step's new keys and values into the past buffer itself: the runtime then keeps
    # a preallocated ``KVBuffer`` and steps through ``run_in_place``.
    kv_in_place: bool = False

    @abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def run_in_place(self, feeds: dict[str, np.ndarray], cache: KVBuffer) -> np.ndarray:
        """``feeds`` without the past; the step's keys and values land in ``cache``'s buffers after its
        ``length`` (the caller advances it). Returns the logits."""
        raise NotImplementedError(f"{type(self).__name__} does not update its KV cache in place")


class DeviceSession(Session):
    """A session that keeps its KV cache on its device and generates there; the runtime hands it whole steps
    and batches instead of feeding the cache through ``run``."""

    @abstractmethod
    def new_cache(self, batch_size: int) -> Any:
        """A cache handle with ``batch_size``, ``length``, ``num_layers``, ``truncate(n)`` and ``nbytes()``."""

    @abstractmethod
    def step(self, input_ids: np.ndarray, positions: np.ndarray, attention_mask: np.ndarray, cache: Any, *,
             last_only: bool) -> np.ndarray:
        """int64 [B, S] ids and positions, mask [B, cache.length + S] -> float32 logits [B, S or 1, vocab]."""

    @abstractmethod
    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray, steps: int,
                 sampling: list[SamplingParams]) -> Iterator[np.ndarray]:
        """Prefill the left-padded batch, then yield each step's chosen tokens, int64 [B]."""


class EngineBackend(ABC):
    backend: ClassVar[Backend]
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
        return (f"backend {cls.backend.value!r} does not build {precision.value} engines ({why}); it builds "
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
    BACKENDS.add(cls.backend.value, cls)
    return cls


def backend_class(name: str | Backend) -> type[EngineBackend]:
    """The implementation of a backend, whether or not it can run on this machine (its declarations)."""
    backend = Backend.parse(name, what="backend")
    _load_builtin_backends()
    if backend.value not in BACKENDS:  # every Backend member has its module here (tests/test_capabilities.py)
        raise BugError(f"backend {backend.value!r} is named by edgellm.types.Backend but no module of "
                       f"edgellm.backends registers it; registered: {', '.join(BACKENDS)}")
    return BACKENDS.get(backend.value)


def get_backend(name: str | Backend) -> EngineBackend:
    cls = backend_class(name)
    backend = cls.backend
    reason = cls.unavailable_reason()
    if reason:
        raise UnsupportedError(f"backend {backend.value!r} is not available on this machine ({reason})")
    return cls()


def registered_backends() -> dict[str, type[EngineBackend]]:
    """Every backend implemented in this package (found by importing its modules), by name."""
    _load_builtin_backends()
    return dict(BACKENDS.items())


def _load_builtin_backends() -> None:
    """Import every module of this package once: their ``@register_backend`` classes fill the registry."""
    import importlib
    import pkgutil

    import edgellm.backends as package

    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if info.name != "base":
            importlib.import_module(f"edgellm.backends.{info.name}")
