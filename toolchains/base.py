"""What a toolchain is to the farm, and the one registry of them.

A toolchain turns a checkpoint into evidence on a platform. It is one module or subpackage of this package with a
class decorated ``@register_toolchain``: the package is walked once on first use, so nothing else lists toolchains,
and the registry is the toolchain vocabulary (device types, matrices and the results database name toolchains by
these strings; adding one needs no enum and no migration).

A driver (``ToolchainDriver``) says who the toolchain is and what it can produce (precisions, LM-head and KV-cache
variants, variant features, whether it needs a GPU, its route), and is made of the parts it takes part in
(``toolchains.parts``): its host stages (quantize, export: key inputs and work; bring-up checks), its device stages
(the command of each, what it fetches back and how that is read; what it needs on a device and the validation of its
own block in a device's inventory, ``toolchains: {name: {...}}``) and its environment (whether it is installed and
how to install it, its version on the host). A toolchain without device stages (e.g. an exporter only) plans only
host-stage rows: :meth:`ToolchainDriver.device_problem` is the one place that asks. The generic stage bodies in
``tasks/`` only ask it.

This module imports only the library and the vocabulary (``registries`` hands its answers to the device
types and inventories, which check their toolchain names and blocks with them when they load); the driver modules it
discovers must stay as light. Host-stage work that needs the farm's store lives in a
module of the toolchain that the driver imports when the stage runs.
"""

from __future__ import annotations

import functools
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

# where installs get their wheels: the generic layers name these through this module, not the mirror's
from edgefarm.toolchains.mirror import Index as Index
from edgefarm.toolchains.mirror import WheelSource as WheelSource
from edgefarm.vocabulary.model import ModelShape as ModelShape
from edgefarm.vocabulary.route import Route as Route
from edgefarm.vocabulary.variant import Features
from edgefarm.vocabulary.variant import Variant as Variant
from edgellm.errors import BugError, ConfigurationError, EdgeLLMError, ErrorKind, UnsupportedError
from edgellm.registry import Registry, import_submodules
from edgellm.types import UNQUANTIZED, BenchMode, ChoiceEnum, Precision

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from edgefarm.artifacts.kinds import ArtifactKind
    from edgefarm.artifacts.store import ArtifactRef
    from edgefarm.devices.inventory import Device
    from edgefarm.devices.transport.base import CommandResult
    from edgefarm.stages.job import JobSpec
    from edgefarm.toolchains.parts import DeviceStages, HostStages, ToolchainEnvironment
    from edgellm.config import QuantConfig

ENGINE_LISTING = ".engine-listing.json"  # beside a build's read-back files: {"digest", "bytes", "files": {...}}
QUANTIZE_RECORD = "quantize.json"  # a quantizer's product: {checkpoint/, quantize.json (checkpoint_sha256, ...)}


@dataclass(frozen=True)
class DeviceRequirements:
    """What must be on a device before a toolchain's stages run there, checked by the farm's agent (``agent check``)
    at the first contact of a run and by ``edgefarm devices check``: a missing one is the device's configuration
    problem (the device is quarantined with it), never the job's. Paths are the device's (absolute)."""

    tools: dict[str, str] = field(default_factory=dict)  # name -> executable file
    lib_dirs: tuple[str, ...] = ()  # where ``libs`` are looked for
    libs: tuple[str, ...] = ()  # file globs that must match in one of ``lib_dirs`` (e.g. a runtime's .so)
    files: tuple[str, ...] = ()  # other files that must exist (e.g. a plugin library)
    build_dirs: tuple[str, ...] = ()  # CMake build dirs whose project version and source revision are recorded
    dpkg: tuple[str, ...] = ()  # package globs whose installed versions the environment records


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str | None = None  # why not, naming what is missing
    installable: bool = False  # not ok, but the driver's install() would make it so (the plan may install it)


@dataclass(frozen=True)
class DeviceStep:
    """One command of a device stage as the toolchain wants it run: an argv list (never a shell line), extra
    environment for it, and the outputs to fetch back (name -> path relative to the job dir)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    fetch: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineCheck:
    """What a build stage read back of the engine it fetched: its weight precision and a one-line account."""

    precision: str
    detail: str
    metrics: dict[str, tuple[float, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchRun:
    """One benchmark command (a mode) and how to read its fetched outputs into metrics."""

    step: DeviceStep
    mode: BenchMode


@dataclass(frozen=True)
class Environment:
    """One installed environment of a toolchain (``edgefarm toolchains list``): its version read back, health."""

    toolchain: str
    version: str | None  # read back from what is installed; None when unreadable
    healthy: bool
    path: str
    problems: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"toolchain": self.toolchain, "version": self.version, "healthy": self.healthy, "path": self.path,
                "problems": list(self.problems)}


class HostWork(Protocol):
    """What a host stage (quantize, export) of a driver gets from the farm (``tasks.host`` makes it): scratch and
    log space on the orchestrating host, the artifact store, this host's copies of quantized checkpoints, the stage's
    timeout and the host's quantize settings. A driver never opens the farm itself."""

    @property
    def timeout(self) -> int: ...

    @property
    def quantize_device(self) -> str: ...

    @property
    def max_unquantized_share(self) -> float: ...

    def scratch(self, prefix: str) -> AbstractContextManager[Path]: ...

    def log_path(self, name: str) -> Path: ...

    def put(self, data: Path | bytes, kind: ArtifactKind) -> ArtifactRef: ...

    def install_checkpoint(self, ref: ArtifactRef, made: Path) -> None: ...

    def materialize_checkpoint(self, ref: ArtifactRef) -> tuple[Path, dict[str, Any]]: ...


# --- bring-up checks (a toolchain that offers them): does it know the model, and do the weights fit its model ---

class RegistryStatus(ChoiceEnum):
    """What a toolchain's own model registry makes of a checkpoint's model_type."""

    REGISTERED = "registered"  # a model class of its own for it
    DEFAULT_FALLBACK = "default-fallback"  # no class of its own: it would load the checkpoint into its default model
    UNSUPPORTED = "unsupported"  # it refuses the checkpoint (its config reader or its model factory)


@dataclass(frozen=True)
class RegistryCheck:
    """A toolchain's registry answer for one checkpoint, asked inside the toolchain's own environment. A fallback to
    the default model passes only where ``layout_family`` names the family of ours that declares the model
    layout-identical to that default (the toolchain package keeps the declaration)."""

    toolchain: str
    toolchain_version: str
    model_type: str
    architectures: tuple[str, ...]
    status: RegistryStatus
    model_class: str | None  # the class that would load it (module.qualname); None when unsupported
    default_class: str | None = None  # the toolchain's default model, where it has one
    layout_family: str | None = None  # our family declaring the model layout-identical to ``default_class``
    reason: str | None = None  # why unsupported, or why a fallback is or is not accepted

    @property
    def ok(self) -> bool:
        return self.status is RegistryStatus.REGISTERED or (
            self.status is RegistryStatus.DEFAULT_FALLBACK and self.layout_family is not None)

    @property
    def problem(self) -> str | None:
        """One line naming the model_type, the toolchain and what would pass, or None when :attr:`ok`."""
        if self.ok:
            return None
        return (f"{self.toolchain} {self.toolchain_version} does not support model_type {self.model_type!r} "
                f"({self.status}): {self.reason}")

    def to_json(self) -> dict[str, Any]:
        return {"toolchain": self.toolchain, "toolchain_version": self.toolchain_version,
                "model_type": self.model_type, "architectures": list(self.architectures), "status": str(self.status),
                "model_class": self.model_class, "default_class": self.default_class,
                "layout_family": self.layout_family, "reason": self.reason, "ok": self.ok}


@dataclass(frozen=True)
class ShapeMismatch:
    tensor: str  # the checkpoint's name
    target: str  # the model parameter it loads into (the toolchain's name, after its key remapping)
    expected: tuple[int, ...]  # the parameter's shape
    found: tuple[int, ...]  # the checkpoint tensor's


@dataclass(frozen=True)
class WeightReconciliation:
    """A checkpoint's tensors (headers only) against the parameters of the model a toolchain loads them into, both
    ways; edgellm's own report (``edgellm.checkpoint.Reconciliation``) in the same shape, with the toolchain named."""

    toolchain: str
    toolchain_version: str
    model: str  # the model compared with: the toolchain's class, or our family
    expected: int  # parameters the model loads from a checkpoint
    matched: int
    missing: dict[str, tuple[int, ...]]  # parameter -> shape: no checkpoint tensor fills it
    unexpected: tuple[str, ...]  # checkpoint tensors no parameter takes
    shape_mismatches: tuple[ShapeMismatch, ...]
    tied: dict[str, str] = field(default_factory=dict)  # parameter -> the one it shares
    ignored: dict[str, str] = field(default_factory=dict)  # checkpoint tensor -> why it is skipped by design
    defaulted: tuple[str, ...] = ()  # parameters the toolchain fills itself when the checkpoint has none
    problems: tuple[str, ...] = ()  # one line each, naming the tensor

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"toolchain": self.toolchain, "toolchain_version": self.toolchain_version, "model": self.model,
                "expected": self.expected, "matched": self.matched,
                "missing": {name: list(shape) for name, shape in self.missing.items()},
                "unexpected": list(self.unexpected),
                "shape_mismatches": [{"name": m.tensor, "target": m.target, "expected": list(m.expected),
                                      "found": list(m.found)} for m in self.shape_mismatches],
                "tied": dict(self.tied), "ignored": dict(self.ignored), "defaulted": list(self.defaulted),
                "problems": list(self.problems), "ok": self.ok}


@dataclass(frozen=True)
class LayerExport:
    """A few-layer export (the first ``layers`` decoder layers) and what its structural check found."""

    toolchain: str
    toolchain_version: str
    layers: int
    out_dir: Path  # what the toolchain's exporter wrote
    evidence: dict[str, Any]  # the toolchain's own account: its export record and its structural report
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"toolchain": self.toolchain, "toolchain_version": self.toolchain_version, "layers": self.layers,
                "out_dir": str(self.out_dir), "evidence": self.evidence, "problems": list(self.problems),
                "ok": self.ok}


class NotOffered(UnsupportedError):
    """A toolchain does not offer a bring-up check (the bring-up records the rung as not offered by it)."""


def offering(method: str) -> str:
    """The toolchains whose host stages offer the bring-up check ``method`` (they override ``HostStages``')."""
    from edgefarm.toolchains.parts import HostStages

    found = [n for n in names() if (part := _DRIVERS.get(n).HOST_STAGES) is not None
             and getattr(part, method) is not getattr(HostStages, method)]
    return ", ".join(found) or "none"


class NotApplicable(UnsupportedError):
    """A tool cannot apply to this checkpoint at all (e.g. a block size its widths do not divide): the row is not
    applicable, with the reason, rather than failed."""


@dataclass(frozen=True)
class DocsLayout:
    """A toolchain's own documentation pages, which ``edgefarm docs`` writes from the farm's evidence in that
    toolchain's layout (``pages/docs_layout.py``): checkpoints by family with original and pre-quantized lists and
    draft tables, and a platform table. What is the toolchain's is named here; the renderer names no toolchain."""

    toolchain: str  # the toolchain whose rows its pages show (a row another toolchain proved is not its evidence)
    directory: str  # under the docs dir, beside runs/
    product: str  # how its pages name the toolchain
    sdk_column: str  # the platform table's column of the runtime SDK the toolchain builds engines with
    sdk_version: Callable[[Mapping[str, Any]], str | None]  # that SDK's version in a recorded device environment
    official: str  # what its pages' level "Official" means
    source: str  # where its layout was read


class ToolchainDriver(ABC):
    """One toolchain as the farm drives it: who it is and what it can produce, and the parts it takes part in
    (``toolchains.parts``): ``HOST_STAGES`` and ``DEVICE_STAGES`` (None: it takes no part in them) and its
    ``ENVIRONMENT``, each made with this toolchain as ``host_stages``, ``device_stages`` and ``environment``.
    Subclasses set ``name``. ``data_dir``: the farm's data dir, where toolchains keep their environments (None where
    nothing asks for them). ``pins``: the versions a matrix chose for toolchains whose version can be chosen
    (``pinned`` set); a toolchain not named runs its pinned version. The driver hands ``pins`` on to the quantizer it
    asks for."""

    name: ClassVar[str]
    # the version the farm runs unless a matrix chooses another (``toolchain_versions:``); None: not choosable
    pinned: ClassVar[str | None] = None
    needs_gpu: ClassVar[bool] = False  # its device stages need an NVIDIA GPU (a device type without ``sm`` refuses it)
    HOST_STAGES: ClassVar[type[HostStages] | None] = None
    DEVICE_STAGES: ClassVar[type[DeviceStages] | None] = None
    ENVIRONMENT: ClassVar[type[ToolchainEnvironment]]

    def __init__(self, data_dir: Path | None = None, pins: Mapping[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.pins: dict[str, str] = dict(pins or {})
        if self.name in self.pins and self.pinned is None:
            raise BugError(f"toolchain {self.name} was given version {self.pins[self.name]!r}, but its version "
                           f"cannot be chosen")
        self.host_stages: HostStages | None = None if self.HOST_STAGES is None else self.HOST_STAGES(self)
        self.device_stages: DeviceStages | None = None if self.DEVICE_STAGES is None else self.DEVICE_STAGES(self)
        self.environment: ToolchainEnvironment = self.ENVIRONMENT(self)

    @property
    def chosen_version(self) -> str | None:
        """The version this driver runs on the host: the one chosen for it, else its pinned one (None: its
        version is not choosable)."""
        return self.pins.get(self.name, self.pinned)

    def version_problem(self, version: str) -> str | None:
        """Why ``version`` cannot be chosen for this toolchain (a matrix's ``toolchain_versions``), or None."""
        choosable = ", ".join(pinned_versions()) or "none"
        return (f"toolchain {self.name} runs the farm's own version; no version of it can be chosen (toolchains "
                f"with versions: {choosable})")

    # --- what it can produce (static: the same on every machine) ---

    @abstractmethod
    def precisions(self) -> tuple[Precision, ...]:
        """Weight precisions this toolchain can produce an engine at and run."""

    @abstractmethod
    def variant_problem(self, variant: Variant) -> str | None:
        """Why this toolchain cannot give the LM head and KV cache asked for at the variant's precision (None: it
        can, and they reach its export and build). The plan records such a combination as not applicable."""

    def docs_layout(self) -> DocsLayout | None:
        """Its own documentation pages' layout, when the farm writes them (None: only the farm's own pages)."""
        return None

    # The variant features (vocabulary.variant.FEATURE_NAMES) this toolchain's stages carry out, each reaching its real
    # flags; any other is refused with FEATURE_REASONS' reason (or a generic one). The plan records it not applicable.
    FEATURES: ClassVar[frozenset[str]] = frozenset()
    FEATURE_REASONS: ClassVar[Mapping[str, str]] = {}

    def features_problem(self, features: Features) -> str | None:
        """Why this toolchain cannot run the variant's features (None: it runs every one), each refused one with
        its reason."""
        refused = [name for name in features.names() if name not in self.FEATURES]
        if not refused:
            return None
        why = "; ".join(f"{name}: {self.FEATURE_REASONS.get(name.split('.')[0], 'not offered')}" for name in refused)
        offered = ", ".join(sorted(self.FEATURES)) or "none"
        return f"toolchain {self.name} does not run {why} (its variant features: {offered})"

    def precision_problem(self, precision: Precision) -> str | None:
        """Why this toolchain cannot produce ``precision`` at all (None: it is one of :meth:`precisions`); the plan
        records such a row as not applicable with this reason. A driver that knows why says so."""
        produced = self.precisions()
        if precision in produced:
            return None
        return (f"toolchain {self.name} cannot produce {precision} (produces: "
                f"{', '.join(p.value for p in produced)})")

    def prequantized_problem(self, quant: QuantConfig) -> str | None:
        """Why this toolchain's export cannot read a checkpoint that is already quantized as ``quant`` says
        (``edgellm.config.QuantConfig``, read from the checkpoint), or None. Such a checkpoint is exported as it is:
        its rows run at its own precision and no quantize stage runs for them. Default: it reads none."""
        return (f"toolchain {self.name} exports from float checkpoints only; this checkpoint is already quantized "
                f"({quant.method.value}, {quant.source})")

    def quantizes(self) -> tuple[Precision, ...]:
        """Weight precisions this toolchain's quantize stage makes a checkpoint at, on the orchestrating host; ()
        when it has none. A (model, precision) is quantized once, whoever consumes it."""
        return ()

    def quantizes_in_export(self) -> tuple[Precision, ...]:
        """Quantized precisions this toolchain's own export makes from the float checkpoint (its quantize stage is
        then the identity); the others it exports from the checkpoint the farm's quantizer made."""
        return ()

    def takes_quantized_checkpoint(self, precision: Precision) -> bool:
        """Whether its export of ``precision`` reads a checkpoint the quantize stage made (else the source)."""
        return precision not in UNQUANTIZED and precision not in self.quantizes_in_export()

    def model_problem(self, shape: ModelShape, sm: int | None, variant: Variant) -> str | None:
        """Why this toolchain's kernels cannot run a model of ``shape`` on a GPU of compute capability ``sm`` (None:
        no GPU) at ``variant``, or None. The plan records such a row as not applicable (e.g. a head size no
        attention kernel of the toolchain takes). Default: no limit beyond its precisions."""
        return None

    def route(self, device: Device | None = None) -> Route | None:
        """How this toolchain makes its engines on ``device`` (recorded per result; None: on the devices it usually
        builds on), or None when it has one way. A route that builds from the checkpoint
        (``Route.from_checkpoint``) needs the device stages' ``check_engine_from_checkpoint`` and
        ``with_checkpoint``."""
        return None

    # --- the parts it takes part in (``toolchains.parts``) ---

    def host(self) -> HostStages:
        """Its host stages; UnsupportedError where it takes part in none."""
        if self.host_stages is None:
            raise UnsupportedError(f"toolchain {self.name} takes part in no host stage (quantize, export)")
        return self.host_stages

    def device_problem(self) -> str | None:
        """Why the farm cannot drive this toolchain's device stages (build, infer, accuracy, bench) at all, or None:
        the one place that asks whether it takes part in them."""
        if self.device_stages is None:
            return (f"toolchain {self.name} takes part in no device stage (build, infer, accuracy, bench): only its "
                    f"host stages run (a test list's stages: [quantize, export])")
        return None

    def device(self) -> DeviceStages:
        """Its device stages; UnsupportedError (:meth:`device_problem`'s reason) where it takes part in none."""
        if self.device_stages is None:
            raise UnsupportedError(str(self.device_problem()))
        return self.device_stages


def edgellm_exit(result: CommandResult) -> EdgeLLMError | None:
    """How an ``edgellm`` command ended, by its exit codes (``ErrorKind.exit_code``): None when it passed."""
    from edgellm.errors import InfrastructureError, ResourceError, TestFailure

    kind = ErrorKind.from_exit_code(result.exit_code)
    if kind is None:
        return None
    message = _last_line(result.stderr) or f"exit code {result.exit_code}"
    if kind is ErrorKind.INFRASTRUCTURE:
        return InfrastructureError(f"the device reported an infrastructure failure: {message}")
    if kind is ErrorKind.TEST_FAILURE:
        return TestFailure(message)
    if kind is ErrorKind.RESOURCE:
        return ResourceError(message)
    return EdgeLLMError(message, kind=kind)


def engine_listing(engine_dir: Path) -> dict[str, Any]:
    """The ``ENGINE_LISTING`` beside a build's read-back files: {"digest", "bytes", "files": {path: {"sha256",
    "bytes"}}} of the whole engine dir as it is on the device."""
    import json

    found = json.loads((Path(engine_dir) / ENGINE_LISTING).read_text(encoding="utf-8"))
    if not isinstance(found, dict) or not isinstance(found.get("files"), dict):
        raise ConfigurationError(f"{engine_dir}: {ENGINE_LISTING} is not an engine listing")
    return found


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:2000] if lines else ""


def pushed_path(path: Path) -> str:
    """Where a file of ``DeviceStages.device_files`` is on a device, relative to its work dir."""
    import hashlib

    return f"cache/{hashlib.sha256(Path(path).read_bytes()).hexdigest()}"


# --- the registry -------------------------------------------------------------------------------------------------

_DRIVERS: Registry[type[ToolchainDriver]] = Registry("toolchain")
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*\Z")
_loaded = threading.Lock()
_discovered = False
_assumed = threading.local()  # planning "what if the installable toolchains were installed" (assuming_installed)


def register_toolchain(cls: type[ToolchainDriver]) -> type[ToolchainDriver]:
    name = getattr(cls, "name", None)
    parts = [p for p in (cls.HOST_STAGES, cls.DEVICE_STAGES, getattr(cls, "ENVIRONMENT", None)) if p is not None]
    missing = sorted({*cls.__abstractmethods__, *([] if hasattr(cls, "ENVIRONMENT") else ["ENVIRONMENT"]),
                      *(f"{p.__qualname__}.{m}" for p in parts for m in p.__abstractmethods__)})
    if not isinstance(name, str) or not _NAME.match(name) or missing:
        raise BugError(f"toolchain driver {cls.__qualname__} must set name (lower-case letters, digits and '-', got "
                       f"{name!r}) and implement {', '.join(missing) or 'everything'}")
    _DRIVERS.add(name, cls)
    return cls


def unregister_toolchain(name: str) -> None:
    """Remove a driver (tests that register a throwaway toolchain clean up with it)."""
    _DRIVERS.remove(name)
    _instances.cache_clear()


def _discover() -> None:
    """Import every module and subpackage of ``toolchains`` once: their decorators fill the registry."""
    global _discovered
    with _loaded:
        if _discovered:
            return
        import_submodules(__package__ or "edgefarm.toolchains", skip={"base", "registries"})
        _discovered = True


def docs_layouts() -> list[DocsLayout]:
    """The documentation layouts of the registered toolchains that declare one (:meth:`ToolchainDriver.docs_layout`),
    by toolchain name."""
    return [found for name in names() if (found := driver(name).docs_layout()) is not None]


def names() -> list[str]:
    """Every registered toolchain's name (the vocabulary)."""
    _discover()
    return list(_DRIVERS)


def parse(value: str, *, what: str = "toolchain") -> str:
    """A toolchain name someone gave: a registered one, else a ConfigurationError naming the value and the valid
    ones (with a near match)."""
    _discover()
    name = str(value).strip().lower()
    if name not in _DRIVERS:
        raise ConfigurationError(_DRIVERS.unknown_message(name).replace("unknown toolchain", f"unknown {what}", 1))
    return name


def driver_class(name: str) -> type[ToolchainDriver]:
    _discover()
    return _DRIVERS.get(parse(name))


def needs_gpu(name: str) -> bool:
    """Whether toolchain ``name`` runs only where there is a GPU (a device type naming it must set ``sm``)."""
    return driver_class(name).needs_gpu


def device_config(name: str, block: Any, device_id: str) -> Any:
    """What toolchain ``name``'s driver reads of its block in device ``device_id``'s inventory file
    (``DeviceStages.device_config``)."""
    part = driver_class(name)().device_stages
    if part is None:
        return no_settings(name, block, device_id)
    return part.device_config(block, device_id)


def no_settings(name: str, block: Any, device: str) -> None:
    """A toolchain that takes no settings in a device's inventory: its block is empty (ConfigurationError else)."""
    if block not in (None, {}):
        raise ConfigurationError(f"device {device!r}: toolchain {name} takes no settings, got {block!r}")


@functools.cache
def _instances(name: str, data_dir: Path | None, pins: tuple[tuple[str, str], ...]) -> ToolchainDriver:
    return driver_class(name)(data_dir, dict(pins))


def driver(name: str, data_dir: Path | None = None, pins: Mapping[str, str] | None = None) -> ToolchainDriver:
    """Toolchain ``name``'s driver for the farm at ``data_dir``, at the versions ``pins`` chose (each toolchain's
    pinned one otherwise). One instance per arguments: stages ask it as often as they like."""
    return _instances(parse(name), None if data_dir is None else Path(data_dir), tuple(sorted((pins or {}).items())))


def job_driver(job: JobSpec, data_dir: str | Path) -> ToolchainDriver:
    """The driver of the toolchain the plan chose for ``job``, at the chosen versions (one instance per farm and
    pins)."""
    return driver(job.toolchain, Path(data_dir), job.pins)


def job_quantizer(job: JobSpec, data_dir: str | Path) -> ToolchainDriver | None:
    """The driver the plan chose to quantize ``job``'s checkpoint (None: export reads the source checkpoint)."""
    return None if job.quantizer is None else driver(job.quantizer, Path(data_dir), job.pins)


def version_probing() -> list[str]:
    """The toolchains whose versions ``edgefarm bisect`` can probe (they offer
    ``ToolchainEnvironment.probe_version``)."""
    from edgefarm.toolchains.parts import ToolchainEnvironment

    return [n for n in names()
            if _DRIVERS.get(n).ENVIRONMENT.probe_version is not ToolchainEnvironment.probe_version]


def pinned_versions() -> dict[str, str]:
    """Every toolchain whose version a matrix may choose, and the version it runs unless one does."""
    _discover()
    return {n: pinned for n in sorted(_DRIVERS) if (pinned := _DRIVERS.get(n).pinned) is not None}


def quantizer(precision: Precision, data_dir: Path | None,
              pins: Mapping[str, str] | None = None) -> ToolchainDriver | None:
    """The driver whose quantize stage makes ``precision`` checkpoints (the first by name), or None."""
    for name in names():
        found = driver(name, data_dir, pins)
        if precision in found.quantizes():
            return found
    return None


@contextmanager
def assuming_installed() -> Iterator[None]:
    """In this thread, answer as if every installable toolchain were installed (to plan what installing the
    missing ones would run)."""
    _assumed.on = True
    try:
        yield
    finally:
        _assumed.on = False


def availability(found: ToolchainDriver) -> Availability:
    """``found.environment.available()``, or ok when planning under :func:`assuming_installed` and an install would
    fix it."""
    state = found.environment.available()
    if not state.ok and state.installable and getattr(_assumed, "on", False):
        return Availability(True)
    return state


def runnable_problem(found: ToolchainDriver, precision: Precision,
                     prequantized: bool = False) -> tuple[str | None, ToolchainDriver | None]:
    """Why ``found`` cannot run ``precision`` here now (not installed; its quantizer missing or not installed), or
    None; and the toolchain that quantizes the precision for it (None: it exports from the source checkpoint, as
    it does a ``prequantized`` one)."""
    state = availability(found)
    if not state.ok:
        return f"toolchain {found.name} is not available: {state.reason}", None
    if prequantized or not found.takes_quantized_checkpoint(precision):
        return None, None
    maker = quantizer(precision, found.data_dir, found.pins)
    if maker is None:
        return (f"toolchain {found.name} builds {precision} from a quantized checkpoint, and no toolchain of this "
                f"farm quantizes {precision}"), None
    if maker.name != found.name and not (made := availability(maker)).ok:
        return f"{precision} is quantized by toolchain {maker.name}, which is not available: {made.reason}", maker
    return None, maker

