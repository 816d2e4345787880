"""The parts a toolchain takes part in, each its own small interface: its host stages (:class:`HostStages`: quantize,
export and the bring-up checks, on the orchestrating host), its device stages (:class:`DeviceStages`: the command of
each stage on a device, what it fetches back and how that is read, and what it needs there) and its environment
(:class:`ToolchainEnvironment`: whether it is installed here, how to install it, its version on this host and its
other versions' environments).

A toolchain (``toolchains.base.ToolchainDriver``) answers who it is and what it can produce, and names the part
classes it takes part in (``HOST_STAGES``, ``DEVICE_STAGES``, ``ENVIRONMENT``); each part is made with the toolchain
(``part.toolchain``) and a part it does not take part in is None. The generic stage bodies in ``tasks/`` ask the
toolchain for the part (``toolchain.host()``, ``toolchain.device()``, ``toolchain.environment``).

Like ``toolchains.base``, this module imports only the library and the vocabulary: a toolchain's parts live in its
driver module (or a light module beside it) and import heavy work when a stage runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefarm.toolchains.base import (
    Availability,
    BenchRun,
    DeviceRequirements,
    DeviceStep,
    EngineCheck,
    Environment,
    LayerExport,
    NotOffered,
    RegistryCheck,
    WeightReconciliation,
    edgellm_exit,
    no_settings,
    offering,
    pinned_versions,
    version_probing,
)
from edgellm.errors import BugError, EdgeLLMError, UnsupportedError
from edgellm.types import Precision

if TYPE_CHECKING:
    from edgefarm.artifacts.store import ArtifactRef
    from edgefarm.devices.inventory import Device
    from edgefarm.devices.transport.base import CommandResult
    from edgefarm.stages.job import CheckpointRef, JobSpec
    from edgefarm.stages.outcome import Keyed, StageOutcome
    from edgefarm.toolchains.base import HostWork, ToolchainDriver
    from edgefarm.toolchains.mirror import WheelSource


class Part:
    """One part of a toolchain, made with the toolchain it is part of (its name, data dir and chosen versions)."""

    def __init__(self, toolchain: ToolchainDriver) -> None:
        self.toolchain = toolchain

    @property
    def name(self) -> str:
        """The toolchain's name."""
        return self.toolchain.name


class HostStages(Part, ABC):
    """Its host stages on the orchestrating host: the key inputs of each and its work (export always; quantize where
    :meth:`ToolchainDriver.quantizes` names precisions), and the bring-up checks it offers (optional; see
    :class:`RegistryCheck`, :class:`WeightReconciliation`)."""

    def _not_a_stage_of_it(self, what: str) -> UnsupportedError:
        return UnsupportedError(f"toolchain {self.name} does not take part in the {what} stage")

    def quantize_key_inputs(self, job: JobSpec, quantize_device: str, version: str) -> dict[str, Any]:
        """What a checkpoint this toolchain's quantize stage makes for ``job`` is the product of (its cache key)."""
        raise self._not_a_stage_of_it("quantize")

    def quantize(self, work: HostWork, job: JobSpec, keyed: Keyed) -> StageOutcome:
        """A quantize cache miss: make the checkpoint (``work.install_checkpoint``), store it, ``keyed.made(ref)``,
        and hand it on as :meth:`judge_quantized` does."""
        raise self._not_a_stage_of_it("quantize")

    def judge_quantized(self, work: HostWork, job: JobSpec, version: str, ref: ArtifactRef) -> StageOutcome:
        """The outcome of a stored checkpoint this quantizer made (a cache hit is judged like a new one):
        ``outputs["checkpoint"]`` the checkpoint export reads, ``outputs["quantized_linears"]`` its count."""
        raise self._not_a_stage_of_it("quantize")

    def common_export_key(self, checkpoint_sha: str, job: JobSpec, version: str) -> dict[str, Any]:
        """The export key inputs every toolchain shares: the checkpoint, what is asked of it, by whom."""
        lm_head, kv_cache = job.lm_head_precision, job.kv_cache_precision
        return {"stage": "export", "checkpoint_sha256": checkpoint_sha, "precision": job.precision.value,
                "lm_head_precision": lm_head and lm_head.value, "kv_cache_precision": kv_cache and kv_cache.value,
                "toolchain": self.name, "toolchain_version": version}

    @abstractmethod
    def export_key_inputs(self, checkpoint_sha: str, job: JobSpec, version: str) -> dict[str, Any]:
        """What this toolchain's export of ``checkpoint_sha`` for ``job`` is the product of (its cache key):
        :meth:`common_export_key` and what else its exporter depends on."""

    @abstractmethod
    def export(self, work: HostWork, job: JobSpec, checkpoint: CheckpointRef, quantized_linears: int,
               keyed: Keyed) -> StageOutcome:
        """An export cache miss: export, check, store, ``keyed.made(ref)``; ``outputs["onnx"]`` the stored export.
        ``quantized_linears``: how many linears the quantize stage's report counts quantized (0: none)."""

    def registry_check(self, checkpoint: Path) -> RegistryCheck:
        """Whether this toolchain's own model registry takes the checkpoint's model_type (asked where the toolchain
        runs). ConfigurationError for a config.json that is not a readable model config; :class:`NotOffered` when
        the toolchain has no registry to ask."""
        raise NotOffered(f"toolchain {self.name} offers no registry check (toolchains that do: "
                         f"{offering('registry_check')})")

    def reconcile(self, checkpoint: Path) -> WeightReconciliation:
        """The checkpoint's tensors (headers only) against the parameters of this toolchain's model for it, both
        ways, without allocating weights; :class:`NotOffered` when the toolchain cannot say."""
        raise NotOffered(f"toolchain {self.name} offers no weight reconciliation (toolchains that do: "
                         f"{offering('reconcile')})")

    def export_layers(self, checkpoint: Path, out_dir: Path, layers: int) -> LayerExport:
        """Export the first ``layers`` decoder layers of the checkpoint into ``out_dir`` (must not exist) and check
        the result structurally; :class:`NotOffered` where the toolchain has no few-layer export."""
        raise NotOffered(f"toolchain {self.name} offers no few-layer export (toolchains that do: "
                         f"{offering('export_layers')})")

class DeviceStages(Part, ABC):
    """Its device stages (build, infer, accuracy, bench): what each runs on a device and how its outputs are read,
    what it needs on a device and reads there, and its block in a device's inventory file (``toolchains: {name:
    {...}}``)."""

    @abstractmethod
    def device_version(self, device: Device, env: Mapping[str, Any]) -> str:
        """The toolchain's version on ``device`` (``env``: the device's ``edgellm env`` JSON)."""

    def device_files(self) -> tuple[Path, ...]:
        """Files the farm pushes to every device this toolchain runs on before its commands (e.g. a self-contained
        runner script): each lands in the device cache as ``cache/<its sha256>`` (:func:`pushed_path`)."""
        return ()

    def probe_step(self, device: Device) -> DeviceStep | None:
        """A command printing the toolchain's facts on ``device`` as JSON (its version there), run once per device
        and run after :meth:`device_files` are staged; what it printed reaches :meth:`device_version` as
        ``env["toolchains"][name]``. None: the device's ``edgellm env`` says enough."""
        return None

    def device_requirements(self, device: Device) -> DeviceRequirements | None:
        """What must be on ``device`` for this toolchain's stages (checked by the agent; see
        :class:`DeviceRequirements`); what the agent read back (tools, libraries, build versions, packages) reaches
        :meth:`device_version` as ``env["toolchains"][name]``. None: nothing beyond :meth:`probe_step`."""
        return None

    def device_facts_problem(self, device: Device, facts: Mapping[str, Any]) -> str | None:
        """Why what the agent read of the toolchain on ``device`` (``facts``: its check's JSON) contradicts the
        inventory (e.g. a build of another release than listed), or None. A problem quarantines the device."""
        return None

    def runtime_key_inputs(self, facts: Mapping[str, Any]) -> dict[str, Any]:
        """Engine-cache key inputs from what the device's probe read (e.g. the runtime library's release)."""
        return {}

    def engine_readback(self) -> tuple[str, ...]:
        """Files of a built engine dir (relative) that :meth:`check_engine` reads: only these come back from the
        device (the engine stays there, in its cache). The farm adds ``ENGINE_LISTING`` (every file's size and
        sha256) beside them."""
        return ()

    def device_config(self, block: Any, device: str) -> Any:
        """Validate this toolchain's block of a device's inventory (ConfigurationError naming what is wrong) and
        return what the driver reads of it. Default: the toolchain takes no settings (an empty block)."""
        return no_settings(self.name, block, device)

    def device_builds(self, device: Device) -> list[str | None]:
        """The releases of this toolchain a device's inventory lists (one build each; the health check checks
        each), or ``[None]`` when the toolchain keeps no builds per release there."""
        return [None]

    def drives(self, device: Device) -> bool:
        """Whether this toolchain's device stages can run on ``device`` (e.g. it has the toolchain's install)."""
        return True

    def devices_problem(self, platform: str, devices: Sequence[Device]) -> str | None:
        """Why none of the platform's ``devices`` (at least one) can run this toolchain's device stages, or None."""
        return None

    def classify_exit(self, result: CommandResult) -> EdgeLLMError | None:
        """How a device command of this toolchain ended, by the toolchain's own conventions: None when it passed,
        else the error it stands for: ``TestFailure`` (the tool ran and failed: the message its last lines),
        ``ResourceError`` (out of memory, a full disk: with the figures), ``DeviceConfigurationError`` (a tool or
        library missing on the device: the device is quarantined, the job moves on), ``InfrastructureError``.
        A timeout never reaches it (the farm's). Default: the exit codes of edgellm's commands
        (``ErrorKind.exit_code``)."""
        return edgellm_exit(result)

    def standin(self, device: Device) -> bool:
        """True when ``device`` runs test stand-ins of the toolchain's tools: its results are never evidence."""
        return False

    def build_key_inputs(self, device: Device) -> dict[str, Any]:
        """Extra engine-cache key inputs the device's install contributes (e.g. a stand-in never shares a key)."""
        return {}

    @abstractmethod
    def build_step(self, device: Device, onnx_dir: str, engine_dir: str, params: Mapping[str, int]) -> DeviceStep:
        """The build command; it must leave the engine in ``engine_dir`` and fetch it as ``engine``."""

    @abstractmethod
    def check_engine(self, engine_dir: Path, onnx_dir: Path | None, params: Mapping[str, int]) -> EngineCheck:
        """Read back the fetched engine: its weight precision (the stage fails when it is not what was built for).
        ``onnx_dir``: the export it was built from, extracted locally (None unless :meth:`needs_onnx_for_check`)."""

    def needs_onnx_for_check(self) -> bool:
        return False

    def check_engine_from_checkpoint(self, engine_dir: Path, checkpoint_dir: Path,
                                     params: Mapping[str, int]) -> EngineCheck:
        """Read back an engine built straight from the checkpoint (a route with ``from_checkpoint``): its weight
        precision, read from what the builder reads (``checkpoint_dir``, the checkpoint on this host)."""
        raise BugError(f"toolchain {self.name} built an engine from the checkpoint but cannot read one back")

    def with_checkpoint(self, step: DeviceStep, checkpoint_dir: str) -> DeviceStep:
        """``step`` (infer, accuracy or bench on an engine built from the checkpoint) given the checkpoint the engine
        reads its weights from at run time (``checkpoint_dir``: staged on the device)."""
        raise BugError(f"toolchain {self.name} built an engine from the checkpoint but cannot run it with one")

    @abstractmethod
    def infer_step(self, device: Device, engine_dir: str, request_file: str, job_dir: str) -> DeviceStep:
        """The inference command on a staged request file (what :meth:`infer_request` made); it fetches its
        output as ``out.json``."""

    def infer_request(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        """The request file the device's tool reads, from ours (``edgellm infer``'s format)."""
        return {"requests": requests}

    def infer_responses(self, output: Mapping[str, Any], requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tool's output file -> our responses, in request order (id, text, output_ids, timings or None)."""
        return list(output["responses"])

    @abstractmethod
    def bench_runs(self, device: Device, engine_dir: str, job_dir: str, *, prompt_len: int, past_len: int,
                   warmup: int, iterations: int) -> list[BenchRun]:
        """One command per benchmark mode, in the order they run (prefill, then decode)."""

    @abstractmethod
    def bench_metrics(self, run: BenchRun, fetched: Mapping[str, Path]) -> dict[str, tuple[float, str]]:
        """Metrics of one benchmark command from its fetched outputs."""

    # Accuracy against the host's transformers reference (``tasks.reference``); the report has edgellm eval's shape:
    # {"passed": bool, "checks": {name: {"value": ...}}, "failed_checks": [...], "metrics": {...}}.

    def accuracy_request(self, reference: Path) -> list[dict[str, Any]] | None:
        """Our requests the device generates for a host-side comparison, from the local reference; None when the
        reference file itself is staged on the device and the device command compares."""
        return None

    def accuracy_reads_reference(self) -> bool:
        """Whether the host reads the reference to judge the device's output (it is then fetched locally)."""
        return False

    @abstractmethod
    def accuracy_step(self, device: Device, engine_dir: str, reference_file: str | None, request_file: str | None,
                      job_dir: str, thresholds: Mapping[str, float]) -> DeviceStep:
        """The accuracy command on the device (``reference_file`` staged unless requests are given)."""

    @abstractmethod
    def accuracy_report(self, fetched: Mapping[str, Path], *, reference: Path | None, checkpoint: Path,
                        precision: Precision, thresholds: Mapping[str, float],
                        requests: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The accuracy report from what the command wrote (and, for host-side comparison, the local reference)."""

    def accuracy_judged_on_host(self) -> bool:
        """True: the report decides pass/fail (the device command only produced); False: the device command's
        exit code does, and the report must agree with it."""
        return False

class ToolchainEnvironment(Part, ABC):
    """Where it runs on the orchestrating host: whether it is installed, how to install it, its version here, and
    the environments of its other versions (``edgefarm toolchains``, ``edgefarm bisect --toolchain``)."""

    @abstractmethod
    def available(self) -> Availability:
        """Whether the orchestrating host can drive this toolchain now (its tools installed), and if not why
        (``installable`` when :meth:`install` would fix it)."""

    def install(self, wheels: WheelSource | None = None) -> str | None:
        """Install what :meth:`available` lacks, once (minutes); None when usable afterwards, else why not.
        ``wheels``: where its packages may come from (``toolchains.mirror``; None: the package registry)."""
        return self.available().reason

    def install_version(self, version: str, wheels: WheelSource | None = None) -> Environment:
        """Install ``version`` into an environment of its own under the data dir (``edgefarm toolchains install``);
        a healthy one already there is reused. ``wheels`` as for :meth:`install`."""
        raise self._no_environment()

    def requirements(self, version: str) -> tuple[str, ...]:
        """The pip requirements an environment of ``version`` is installed from (what ``edgefarm toolchains
        mirror`` stores, dependencies resolved, for hosts without a registry)."""
        raise self._no_environment()

    def _no_environment(self) -> UnsupportedError:
        return UnsupportedError(f"toolchain {self.name} has no environment of its own to install (it runs in the "
                                f"farm's; toolchains with environments: {', '.join(pinned_versions()) or 'none'})")

    def environments(self) -> list[Environment]:
        """Its installed environments under the data dir, each read back (none for a toolchain without any)."""
        return []

    def sweep_dead_installs(self) -> list[Path]:
        """Remove what installs of its environments left under the data dir when they were killed (never what a
        running install is making); returns what was removed."""
        return []

    def installable_versions(self) -> list[str]:
        """Every version an environment of it can be installed at (:meth:`install_version`), oldest first: what its
        package source offers (pip's index: the registry, or the local index or wheelhouse pip is configured
        with). InfrastructureError when the source cannot be reached."""
        raise self._no_environment()

    def probe_version(self, env: Environment, checkpoint: Path, work: Path, precision: Precision) -> None:
        """One probe of a version bisection: this toolchain's stages of a row that this host can run, with the
        installed version ``env`` (:meth:`install_version`'s), on ``checkpoint``, working in the empty directory
        ``work``. Returns when they pass; raises the EdgeLLMError of what failed (its kind says whether the version
        is bad or was not judged: infrastructure and resource errors are not judged). :class:`NotOffered` where the
        toolchain has no stages that run from an environment of its own."""
        raise NotOffered(f"toolchain {self.name} offers no version probe (toolchains that do: "
                         f"{', '.join(version_probing()) or 'none'})")

    @abstractmethod
    def host_version(self) -> str:
        """The version on the orchestrating host (the host stages' product: quantize, export)."""
