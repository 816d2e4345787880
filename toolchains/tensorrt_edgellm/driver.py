"""The ``tensorrt-edgellm`` toolchain as the farm drives it: the pinned version's environment under the data dir
(installed on first use), its quantizer (the farm's quantizer for the precisions it declares: every consumer of such
a precision takes its checkpoint) and its ONNX exporter on the orchestrating host (``host_stages``), and its device
stages on a TensorRT device whose inventory has a ``toolchains: {tensorrt-edgellm: {...}}`` block: ``llm_build`` on
the exported ``llm/`` dir, ``llm_inference`` with our requests translated to its input file and its output translated
back, ``llm_bench`` prefill and decode, accuracy as greedy text agreement with the host's reference (``accuracy``).
The device stages: ``device_stages``; their argument lists, environment and file formats: ``device``. The route is
ONNX (export -> llm_build), or direct where the device's build names its ``direct_builder``: ``tensorrt-edgellm-build``
from the checkpoint (quantize's, else the source), the engine then run with that checkpoint (``--checkpointDir``). A
device whose block says ``standin: true`` runs test stand-ins of the tools: its results are recorded as stand-in and
never count as evidence.

``make nightly`` and ``edgefarm run`` install the pinned version on first use (:meth:`TrtEnvironment.install`); when
that fails (e.g. the package registry is unreachable) the reason is remembered for this process, and every row that
needs the toolchain is skipped with it. A matrix may choose other versions (``toolchain_versions:``, to compare
them): each runs from its own environment ``<data dir>/toolchains/tensorrt-edgellm-<version>``, which is never
installed on first use (a comparison is deliberate; installing a version takes minutes and the registry): a row
whose version is not installed is skipped naming ``edgefarm toolchains install tensorrt-edgellm==<version>``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgefarm.toolchains.base import (
    Availability,
    DocsLayout,
    Environment,
    LayerExport,
    RegistryCheck,
    Route,
    ToolchainDriver,
    Variant,
    WeightReconciliation,
    register_toolchain,
)
from edgefarm.toolchains.parts import HostStages, ToolchainEnvironment
from edgefarm.toolchains.tensorrt_edgellm import DEFAULT_VERSION, TOOLCHAIN, variants
from edgefarm.toolchains.tensorrt_edgellm import device as trt
from edgefarm.toolchains.tensorrt_edgellm.device_stages import TrtDeviceStages
from edgefarm.toolchains.tensorrt_edgellm.env import (
    CONSOLE_SCRIPTS,
    EnvHealth,
    check_version,
    env_dir,
    install,
    installed_version,
    list_envs,
    requirements,
    script,
    sweep_dead_installs,
    toolchains_root,
)
from edgefarm.toolchains.tensorrt_edgellm.export import HF_PREQUANTIZED
from edgefarm.toolchains.tensorrt_edgellm.quantize import LM_HEAD_METHODS, METHODS
from edgellm.errors import BugError, ConfigurationError, EdgeLLMError
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision, QuantMethod

if TYPE_CHECKING:
    from edgefarm.artifacts.store import ArtifactRef
    from edgefarm.devices.inventory import Device
    from edgefarm.stages.job import CheckpointRef, JobSpec
    from edgefarm.stages.outcome import Keyed, StageOutcome
    from edgefarm.toolchains.base import HostWork
    from edgefarm.toolchains.mirror import WheelSource
    from edgellm.config import QuantConfig

log = logging.getLogger(__name__)

PINNED_VERSION = DEFAULT_VERSION
STANDIN_NOTE = "STAND-IN tools (test only, never evidence)"
_FLOAT_HEADS = frozenset({LMHeadPrecision.FP16})  # the head the exporter writes when the quantizer leaves it alone
_install_failures: dict[Path, str] = {}  # env dir -> why installing it failed in this process
_install_lock = threading.Lock()


def install_command(version: str = PINNED_VERSION) -> str:
    return f"edgefarm toolchains install {TOOLCHAIN}=={version}"


INSTALL_COMMAND = install_command()


def version_env(farm_data_dir: Path, version: str) -> Path:
    """A version's environment: ``<data dir>/toolchains/tensorrt-edgellm-<version>``."""
    return env_dir(toolchains_root(farm_data_dir), version)


def pinned_env(farm_data_dir: Path) -> Path:
    """The pinned version's environment."""
    return version_env(farm_data_dir, PINNED_VERSION)


def env_problem(env: Path, version: str = PINNED_VERSION) -> str | None:
    """Why ``env`` is not a usable install of ``version`` (fast: metadata and files, no imports), or None.
    The reason names no absolute path (it lands in published pages)."""
    command = install_command(version)
    try:
        found = installed_version(env)
    except EdgeLLMError:
        failure = _install_failures.get(env)
        if failure is not None:
            return f"{TOOLCHAIN} {version} could not be installed: {failure}"
        return f"{TOOLCHAIN} {version} is not installed in the farm's data dir (run: {command})"
    if found != version:
        return f"the {TOOLCHAIN} environment holds version {found}, not {version} (run: {command})"
    missing = [name for name in CONSOLE_SCRIPTS if not script(env, name).is_file()]
    if missing:
        return f"the {TOOLCHAIN} {version} environment lacks {', '.join(missing)} (run: {command})"
    return None


def ensure_installed(farm_data_dir: Path, wheels: WheelSource | None = None) -> str | None:
    """Install the pinned version under the data dir unless it is there (one-time, a few minutes), from where
    ``wheels`` says (``toolchains.mirror``; None: the registry). Returns None when it is usable, else why not (also
    remembered, so the plan skips the rows that need it with that reason)."""
    env = pinned_env(farm_data_dir)
    with _install_lock:
        if env_problem(env) is None:
            return None
        log.warning("installing %s %s (one-time, a few minutes): %s", TOOLCHAIN, PINNED_VERSION, INSTALL_COMMAND)
        try:
            install(env.parent, PINNED_VERSION, wheels=wheels)
        except EdgeLLMError as exc:
            reason = str(exc).splitlines()[0].replace(str(env.parent), "<data dir>/toolchains")
            _install_failures[env] = reason
            log.warning("%s %s not installed: %s", TOOLCHAIN, PINNED_VERSION, reason)
            return env_problem(env)
        _install_failures.pop(env, None)
        return env_problem(env)


def _environment(found: EnvHealth) -> Environment:
    return Environment(TOOLCHAIN, found.version, found.healthy, str(found.path), tuple(found.problems))


class TrtEnvironment(ToolchainEnvironment):
    """The version's environment under the data dir (the pinned one installed on first use) and the others'."""

    def available(self) -> Availability:
        problem = env_problem(self.toolchain.env_path(), self.toolchain.host_env_version)
        # only the pinned version is installed on first use (a compared version is installed on purpose)
        return Availability(problem is None, problem, installable=self.toolchain.host_env_version == PINNED_VERSION)

    def install(self, wheels: WheelSource | None = None) -> str | None:
        if self.toolchain.host_env_version != PINNED_VERSION:
            return self.available().reason
        assert self.toolchain.data_dir is not None
        return ensure_installed(self.toolchain.data_dir, wheels)

    def host_version(self) -> str:
        return installed_version(self.toolchain.env_path())


    def _root(self) -> Path:
        if self.toolchain.data_dir is None:
            raise BugError(f"toolchain {self.name}: its environments were asked for without the farm's data dir")
        return toolchains_root(self.toolchain.data_dir).resolve()

    def install_version(self, version: str, wheels: WheelSource | None = None) -> Environment:
        return _environment(install(self._root(), check_version(version), log=None, wheels=wheels))

    def requirements(self, version: str) -> tuple[str, ...]:
        return requirements(version)

    def environments(self) -> list[Environment]:
        return [_environment(e) for e in list_envs(self._root())]

    def sweep_dead_installs(self) -> list[Path]:
        return sweep_dead_installs(self._root())

    def installable_versions(self) -> list[str]:
        from edgefarm.toolchains.tensorrt_edgellm.env import installable_versions

        return installable_versions()

    def probe_version(self, env: Environment, checkpoint: Path, work: Path, precision: Precision) -> None:
        """Its host stages of the row with that version: quantize (the precisions its quantizer makes), then the
        ONNX export. Its device stages (llm_build, llm_inference on a TensorRT board) are not probed: a board runs
        a build of one version (its inventory's), not one per probe."""
        from edgefarm.toolchains.tensorrt_edgellm import export, quantize

        source = checkpoint
        if precision in self.toolchain.quantizes():
            source = quantize.quantize(Path(env.path), checkpoint, work / "quantize", precision.value,
                                       chat_template=export.DEFAULT_CHAT_TEMPLATE).checkpoint
        export.export(Path(env.path), source, work / "export")


class TrtHostStages(HostStages):
    """Its quantizer and exporter (host_stages.py) and the bring-up checks, in its environment on the host
    (``bringup``)."""

    def _ready_env(self) -> Path:
        problem = env_problem(self.toolchain.env_path(), self.toolchain.host_env_version)
        if problem is not None:
            raise ConfigurationError(problem)
        return self.toolchain.env_path()

    def registry_check(self, checkpoint: Path) -> RegistryCheck:
        from edgefarm.toolchains.tensorrt_edgellm import bringup

        return bringup.registry_check(self._ready_env(), checkpoint)

    def reconcile(self, checkpoint: Path) -> WeightReconciliation:
        from edgefarm.toolchains.tensorrt_edgellm import bringup

        return bringup.reconcile(self._ready_env(), checkpoint)

    def export_layers(self, checkpoint: Path, out_dir: Path, layers: int) -> LayerExport:
        from edgefarm.toolchains.tensorrt_edgellm import bringup

        return bringup.export_layers(self._ready_env(), checkpoint, out_dir, layers)

    def quantize_key_inputs(self, job: JobSpec, quantize_device: str, version: str) -> dict[str, Any]:
        from edgefarm.toolchains.tensorrt_edgellm import host_stages

        return host_stages.quantize_key_inputs(self.toolchain, job, quantize_device, version)

    def judge_quantized(self, work: HostWork, job: JobSpec, version: str, ref: ArtifactRef) -> StageOutcome:
        from edgefarm.toolchains.tensorrt_edgellm import host_stages

        return host_stages.judge_quantized(self.toolchain, work, job, version, ref)

    def quantize(self, work: HostWork, job: JobSpec, keyed: Keyed) -> StageOutcome:
        from edgefarm.toolchains.tensorrt_edgellm import host_stages

        return host_stages.quantize(self.toolchain, work, job, keyed)

    def export_key_inputs(self, checkpoint_sha: str, job: JobSpec, version: str) -> dict[str, Any]:
        from edgefarm.toolchains.tensorrt_edgellm import host_stages

        return {**self.common_export_key(checkpoint_sha, job, version), **host_stages.export_key_extra(job)}

    def export(self, work: HostWork, job: JobSpec, checkpoint: CheckpointRef, quantized_linears: int,
               keyed: Keyed) -> StageOutcome:
        from edgefarm.toolchains.tensorrt_edgellm import host_stages

        return host_stages.export(self.toolchain, work, job, checkpoint, quantized_linears, keyed)


@register_toolchain
class TensorrtEdgellm(ToolchainDriver):
    name = TOOLCHAIN
    pinned = PINNED_VERSION
    needs_gpu = True
    HOST_STAGES = TrtHostStages
    DEVICE_STAGES = TrtDeviceStages
    ENVIRONMENT = TrtEnvironment

    def docs_layout(self) -> DocsLayout:
        """Its own pages' layout (supported models by family, the platform table): pages.py."""
        from edgefarm.toolchains.tensorrt_edgellm.pages import LAYOUT

        return LAYOUT

    # the variant features its exporter and LoRA tools carry out, and why it refuses the others (variants.py)
    FEATURES: ClassVar[frozenset[str]] = variants.FEATURES
    FEATURE_REASONS: ClassVar[Mapping[str, str]] = variants.FEATURE_REASONS

    @property
    def host_env_version(self) -> str:
        """The version whose environment this driver runs on the host (chosen by a matrix, else the pinned)."""
        return self.chosen_version or PINNED_VERSION

    def env_path(self) -> Path:
        if self.data_dir is None:
            raise BugError(f"toolchain {self.name}: its environment was asked for without the farm's data dir")
        return version_env(self.data_dir, self.host_env_version)

    def version_problem(self, version: str) -> str | None:
        try:
            check_version(version)
        except ConfigurationError as exc:
            return str(exc)
        return None

    # --- what it can produce ---

    def quantizes(self) -> tuple[Precision, ...]:
        return tuple(Precision(m.value) for m in METHODS)

    def precisions(self) -> tuple[Precision, ...]:
        """fp16, what its quantizer makes, and what its exporter reads only from a checkpoint already quantized
        (int4_gptq: Hugging Face GPTQ checkpoints; nothing here quantizes to it)."""
        made = self.quantizes()
        return (Precision.FP16, *made, *(Precision(m.value) for m in HF_PREQUANTIZED if Precision(m.value) not in made))

    def prequantized_problem(self, quant: QuantConfig) -> str | None:
        """Its exporter reads ModelOpt checkpoints of its quantizer's methods and Hugging Face GPTQ / AWQ ones
        (``export.HF_PREQUANTIZED``); whatever else it would silently export as fp16 is refused here."""
        method = quant.method
        if quant.modelopt and method in METHODS:
            return None
        if not quant.modelopt and method in HF_PREQUANTIZED:
            return None
        if quant.modelopt:
            readable = ", ".join(f"{m.value} ({spec.quant_algo})" for m, spec in METHODS.items())
            return (f"toolchain {self.name}: its exporter (0.11.0) reads ModelOpt {method.value} ({quant.source}) as "
                    f"fp16 without a word (its quant_algo parser has no such branch): refused; ModelOpt methods it "
                    f"reads: {readable}")
        readable = ", ".join(m.value for m in HF_PREQUANTIZED)
        return (f"toolchain {self.name}: its exporter (0.11.0) reads a Hugging Face {method.value} checkpoint "
                f"({quant.source}) as fp16 without a word: refused; Hugging Face quantizations it reads: {readable}")

    def variant_problem(self, variant: Variant) -> str | None:
        quantized = variant.precision is not Precision.FP16
        lm_head, kv_cache = variant.lm_head, variant.kv_cache
        heads = {h for h in LMHeadPrecision if h.value in {m.value for m in LM_HEAD_METHODS}}
        if lm_head is not None and lm_head not in _FLOAT_HEADS:
            if lm_head not in heads:
                return (f"toolchain {self.name}: LM-head precision {lm_head.value!r} is not offered by its quantizer; "
                        f"valid: {', '.join(sorted(h.value for h in heads | _FLOAT_HEADS))}")
            if not quantized:
                return f"toolchain {self.name}: a {lm_head.value} LM head needs a quantized precision (not fp16)"
        if kv_cache not in (None, KVCachePrecision.FP16, KVCachePrecision.FP8):
            return f"toolchain {self.name}: KV-cache precision {kv_cache.value!r} is not offered; valid: fp16, fp8"
        if kv_cache is KVCachePrecision.FP8 and not quantized:
            return f"toolchain {self.name}: an fp8 KV cache needs a quantized precision (not fp16)"
        return None

    def model_problem(self, shape: ModelShape, sm: int | None, variant: Variant) -> str | None:  # noqa: F821
        """Its attention kernels' limits (head size, query/KV head ratio, SM, FP8 KV cache): ``kernels``."""
        from edgefarm.toolchains.tensorrt_edgellm import kernels

        return kernels.problem(shape, sm, variant.kv_cache)

    @staticmethod
    def quantizer_lm_head(lm_head: LMHeadPrecision | None) -> str | None:
        """The quantizer's ``--lm_head_quantization`` for an LM-head precision a test asks for (None: left alone)."""
        if lm_head is None or lm_head in _FLOAT_HEADS:
            return None
        return QuantMethod(lm_head.value).value

    @staticmethod
    def quantizer_kv_cache(kv_cache: KVCachePrecision | None) -> str | None:
        """The quantizer's ``--kv_cache_quantization`` for a KV-cache precision a test asks for (None: fp16)."""
        return "fp8" if kv_cache is KVCachePrecision.FP8 else None

    @staticmethod
    def builds_on(device: Device) -> trt.DeviceBuilds | None:
        """The builds ``device``'s inventory lists (None: it has no install of this toolchain)."""
        if TOOLCHAIN not in device.toolchains:
            return None
        return trt.DeviceBuilds.from_inventory(device.toolchains[TOOLCHAIN], device=device.id)

    def route(self, device: Device | None = None) -> Route | None:
        """Direct on a device whose build of this version names its ``direct_builder``, else ONNX."""
        if device is None:
            return Route.ONNX
        config = self.builds_on(device)
        build = config.build(self.host_env_version) if config is not None else None
        return Route.DIRECT if build is not None and build.direct_builder is not None else Route.ONNX
