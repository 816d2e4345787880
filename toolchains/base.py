"""What a toolchain is to the farm, and the one registry of them.

A toolchain turns a checkpoint into evidence on a platform: it produces engines at some precisions, runs them, and
has a version. Device types name the toolchains their devices run (``toolchains:`` in ``devices/types/*.yaml``);
the plan asks this registry which of them can run a (model, precision) here and records why none can.

A toolchain is one module (or subpackage) of this package with a class decorated ``@register_toolchain``; the
package is walked once on first use, so nothing else lists them. This module imports only the library (device
types import the ``Toolchain`` enum from here).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgellm.errors import BugError, UnsupportedError
from edgellm.registry import Registry
from edgellm.types import UNQUANTIZED, KVCachePrecision, LMHeadPrecision, Precision, _ChoiceEnum

if TYPE_CHECKING:
    from devices.inventory import Device


class Toolchain(_ChoiceEnum):
    """Every toolchain name the farm knows (a column of every result); a driver may or may not be installed."""

    EDGELLM_ORT = "edgellm-ort"  # this library, engines built and run with ONNX Runtime
    EDGELLM_TORCH_CUDA = "edgellm-torch-cuda"  # this library, the torch-CUDA backend
    TENSORRT_EDGELLM = "tensorrt-edgellm"  # NVIDIA's TensorRT Edge-LLM


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str | None = None  # why not, naming what is missing


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
    mode: str


class ToolchainDriver(ABC):
    """One toolchain as the farm drives it. Subclasses set ``name`` and say what they can produce. ``data_dir``:
    the farm's data dir, where vendor toolchains keep their environments (None where nothing asks for them).
    ``pins``: the versions a matrix chose for toolchains whose version can be chosen (``pinned`` set); a toolchain
    not named runs its pinned version. The driver hands ``pins`` on to the quantizer it asks for."""

    name: ClassVar[Toolchain]
    # the version the farm runs unless a matrix chooses another (``toolchain_versions:``); None: not choosable
    pinned: ClassVar[str | None] = None

    def __init__(self, data_dir: Path | None = None, pins: Mapping[Toolchain, str] | None = None) -> None:
        self.data_dir = data_dir
        self.pins: dict[Toolchain, str] = dict(pins or {})
        if self.name in self.pins and self.pinned is None:
            raise BugError(f"toolchain {self.name} was given version {self.pins[self.name]!r}, but its version "
                           f"cannot be chosen")

    @property
    def chosen_version(self) -> str | None:
        """The version this driver runs on the host: the one chosen for it, else its pinned one (None: its
        version is not choosable)."""
        return self.pins.get(self.name, self.pinned)

    def version_problem(self, version: str) -> str | None:
        """Why ``version`` cannot be chosen for this toolchain (a matrix's ``toolchain_versions``), or None."""
        choosable = ", ".join(t for t, v in pinned_versions().items()) or "none"
        return (f"toolchain {self.name} runs the farm's own version; no version of it can be chosen (toolchains "
                f"with versions: {choosable})")

    @abstractmethod
    def precisions(self) -> tuple[Precision, ...]:
        """Weight precisions this toolchain can produce an engine at and run."""

    @abstractmethod
    def variant_problem(self, precision: Precision, lm_head: LMHeadPrecision | None,
                        kv_cache: KVCachePrecision | None) -> str | None:
        """Why this toolchain cannot give the LM head and KV cache asked for at ``precision`` (None: it can, and
        they reach its export and build). The plan records such a combination as not applicable."""

    @abstractmethod
    def available(self) -> Availability:
        """Whether the orchestrating host can drive this toolchain at all (its tools installed), and if not why."""

    @abstractmethod
    def version(self, env: Mapping[str, Any]) -> str:
        """The toolchain's version on a machine, from that machine's ``edgellm env`` JSON."""

    @abstractmethod
    def build_command(self, interpreter: str, onnx_dir: str, engine_dir: str,
                      params: Mapping[str, int]) -> list[str]:
        """argv that builds an engine on a device from a staged ONNX dir (params: max_batch_size, max_input_len,
        max_seq_len)."""

    def quantizes(self) -> tuple[Precision, ...]:
        """Weight precisions this toolchain's quantizer makes a checkpoint at, on the orchestrating host (the
        quantize stage); () when it has no quantizer. Any toolchain that builds such a precision takes that
        checkpoint: a (model, precision) is quantized once, whoever consumes it."""
        return ()

    def device_problem(self) -> str | None:
        """Why the farm cannot drive this toolchain's device stages (build, infer, accuracy, bench) at all, or None."""
        return None

    # --- device stages: what each stage runs on a device and how its outputs are read (one home per toolchain) ---
    # A driver that does not override them cannot run device stages (a host-only or planning driver).

    def _no_device_stages(self, what: str) -> UnsupportedError:
        return UnsupportedError(f"toolchain {self.name} does not drive device stages ({what} not implemented)")

    def drives(self, device: Device) -> bool:
        """Whether this toolchain's device stages can run on ``device`` (e.g. it has the toolchain's install)."""
        return True

    def devices_problem(self, platform: str, devices: Sequence[Device]) -> str | None:
        """Why none of the platform's ``devices`` (at least one) can run this toolchain's device stages, or None."""
        return None

    def standin(self, device: Device) -> bool:
        """True when ``device`` runs test stand-ins of the toolchain's tools: its results are never evidence."""
        return False

    def route(self) -> str | None:
        """How this toolchain makes its engines (recorded per result: onnx | direct), or None when it has one."""
        return None

    def device_version(self, device: Device, env: Mapping[str, Any]) -> str:
        """The toolchain's version on ``device`` (its ``edgellm env`` JSON ``env``)."""
        return self.version(env)

    def build_key_inputs(self, device: Device) -> dict[str, Any]:
        """Extra engine-cache key inputs the device's install contributes (e.g. a stand-in never shares a key)."""
        return {}

    def build_step(self, device: Device, onnx_dir: str, engine_dir: str, params: Mapping[str, int]) -> DeviceStep:
        """The build command; it must leave the engine in ``engine_dir`` (fetched and stored as the engine)."""
        return DeviceStep(self.build_command(device.interpreter, onnx_dir, engine_dir, params))

    def check_engine(self, engine_dir: Path, onnx_dir: Path | None, params: Mapping[str, int]) -> EngineCheck:
        """Read back the fetched engine: its weight precision (TestFailure when it is not what was built for).
        ``onnx_dir``: the export it was built from, extracted locally (None when the toolchain does not need it)."""
        raise self._no_device_stages("check_engine")

    def needs_onnx_for_check(self) -> bool:
        return False

    def infer_step(self, device: Device, engine_dir: str, request_file: str, output_file: str) -> DeviceStep:
        """The inference command on a staged request file (what :meth:`infer_request` made)."""
        raise self._no_device_stages("infer_step")

    def infer_request(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        """The request file the device's tool reads, from ours (``edgellm infer``'s format)."""
        return {"requests": requests}

    def infer_responses(self, output: Mapping[str, Any], requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tool's output file -> our responses, in request order (id, text, output_ids, timings or None)."""
        return list(output["responses"])

    def bench_runs(self, device: Device, engine_dir: str, job_dir: str, *, prompt_len: int, past_len: int,
                   warmup: int, iterations: int) -> list[BenchRun]:
        """One command per benchmark mode (prefill, decode)."""
        raise self._no_device_stages("bench_runs")

    def bench_metrics(self, run: BenchRun, fetched: Mapping[str, Path]) -> dict[str, tuple[float, str]]:
        """Metrics of one benchmark command from its fetched outputs."""
        raise self._no_device_stages("bench_metrics")

    # Accuracy against the host's transformers reference (``tasks.reference``); the report has edgellm eval's shape:
    # {"passed": bool, "checks": {name: {"value": ...}}, "failed_checks": [...]}.

    def accuracy_stages_reference(self) -> bool:
        """True: the reference file is staged on the device and the device command compares (edgellm eval);
        False: the device only generates (:meth:`accuracy_request`) and the host compares."""
        return True

    def accuracy_request(self, reference: Path) -> list[dict[str, Any]] | None:
        """Our requests the device generates for the comparison (None when the device compares itself)."""
        return None

    def accuracy_step(self, device: Device, engine_dir: str, reference_file: str | None, request_file: str | None,
                      job_dir: str, thresholds: Mapping[str, float]) -> DeviceStep:
        """The accuracy command on the device."""
        raise self._no_device_stages("accuracy_step")

    def accuracy_report(self, fetched: Mapping[str, Path], *, reference: Path | None, checkpoint: Path,
                        precision: Precision, thresholds: Mapping[str, float],
                        requests: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The accuracy report from what the command wrote (and, for host-side comparison, the local reference)."""
        raise self._no_device_stages("accuracy_report")

    def host_version(self) -> str:
        """The version on the orchestrating host (stages that run there: quantize, export)."""
        return self.version(_host_env())

    def accepts(self, precision: Precision) -> tuple[bool, str]:
        """``(True, "")`` when this toolchain can run ``precision`` here; else ``(False, reason)``. A quantized
        precision also needs the toolchain that quantizes it to be available."""
        state = self.available()
        if not state.ok:
            return False, f"toolchain {self.name} is not available: {state.reason}"
        produced = self.precisions()
        if precision not in produced:
            return False, (f"toolchain {self.name} cannot produce {precision} yet "
                           f"(produces: {', '.join(p.value for p in produced)})")
        if precision not in UNQUANTIZED:
            maker = quantizer(precision, self.data_dir, self.pins)
            if maker is None:
                return False, (f"toolchain {self.name} builds {precision} from a quantized checkpoint, and no "
                               f"toolchain of this farm quantizes {precision}")
            if maker.name is not self.name and not (made := maker.available()).ok:
                return False, (f"{precision} is quantized by toolchain {maker.name}, which is not available: "
                               f"{made.reason}")
        return True, ""


@functools.cache
def _host_env() -> dict[str, Any]:
    """``edgellm env`` of this process, once (package versions do not change while it runs)."""
    from edgellm.cli.env import collect

    return collect()


_DRIVERS: Registry[type[ToolchainDriver]] = Registry("toolchain")
_loaded = threading.Lock()
_discovered = False


def register_toolchain(cls: type[ToolchainDriver]) -> type[ToolchainDriver]:
    if not isinstance(getattr(cls, "name", None), Toolchain) or cls.__abstractmethods__:
        raise BugError(f"toolchain driver {cls.__qualname__} must set name to a Toolchain member and implement "
                       f"{', '.join(sorted(cls.__abstractmethods__)) or 'everything'}")
    _DRIVERS.add(cls.name.value, cls)
    return cls


def _discover() -> None:
    """Import every module and subpackage of ``toolchains`` once: their decorators fill the registry."""
    global _discovered
    with _loaded:
        if _discovered:
            return
        import toolchains

        for info in sorted(pkgutil.iter_modules(toolchains.__path__), key=lambda m: m.name):
            if info.name != "base":
                importlib.import_module(f"toolchains.{info.name}")
        _discovered = True


def driver(name: Toolchain | str, data_dir: Path | None = None,
           pins: Mapping[Toolchain, str] | None = None) -> ToolchainDriver | None:
    """The installed driver of toolchain ``name`` for the farm at ``data_dir`` (at the version ``pins`` chose for
    it, else its pinned one); None when the farm has none (the plan says so)."""
    _discover()
    key = Toolchain.parse(name, what="toolchain")
    return _DRIVERS.get(key.value)(data_dir, pins) if key.value in _DRIVERS else None


def require(name: Toolchain | str, data_dir: Path | None = None,
            pins: Mapping[Toolchain, str] | None = None) -> ToolchainDriver:
    """Like :func:`driver`, but a missing driver is an UnsupportedError naming the installed ones."""
    found = driver(name, data_dir, pins)
    if found is None:
        raise UnsupportedError(f"toolchain {name!s} has no driver in this farm; installed: {', '.join(_DRIVERS)}")
    return found


def installed() -> list[str]:
    _discover()
    return list(_DRIVERS)


def pinned_versions() -> dict[Toolchain, str]:
    """Every toolchain whose version a matrix may choose, and the version it runs unless one does."""
    _discover()
    return {Toolchain(n): pinned for n in sorted(_DRIVERS) if (pinned := _DRIVERS.get(n).pinned) is not None}


def quantizer(precision: Precision, data_dir: Path | None,
              pins: Mapping[Toolchain, str] | None = None) -> ToolchainDriver | None:
    """The driver (for the farm at ``data_dir``, at the version ``pins`` chose) whose quantizer makes ``precision``
    checkpoints (the first by name), or None."""
    _discover()
    for name in sorted(_DRIVERS):
        found = _DRIVERS.get(name)(data_dir, pins)
        if precision in found.quantizes():
            return found
    return None


def choose(candidates: tuple[Toolchain, ...], precision: Precision, data_dir: Path,
           pins: Mapping[Toolchain, str] | None = None) -> tuple[Toolchain | None, list[str]]:
    """The first of ``candidates`` (a device type's toolchains, in its order) that can run ``precision`` in the
    farm at ``data_dir`` (at the versions ``pins`` chose), and the reason each one before it could not."""
    reasons: list[str] = []
    for name in candidates:
        found = driver(name, data_dir, pins)
        if found is None:
            reasons.append(f"toolchain {name} is not installed in this farm (no driver registered)")
            continue
        ok, why = found.accepts(precision)
        if ok:
            return name, reasons
        reasons.append(why)
    return None, reasons
