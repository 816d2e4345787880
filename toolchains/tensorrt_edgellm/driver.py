"""The ``tensorrt-edgellm`` toolchain as the farm drives it: the pinned version's environment under the data dir
(installed on first use), its quantizer (the farm's quantizer for the precisions it declares: every consumer of such
a precision takes its checkpoint) and its ONNX exporter on the orchestrating host (``host_stages``), and its device
stages on a TensorRT device whose inventory has a ``toolchains: {tensorrt-edgellm: {...}}`` block: ``llm_build`` on
the exported ``llm/`` dir, ``llm_inference`` with our requests translated to its input file and its output translated
back, ``llm_bench`` prefill and decode, accuracy as greedy text agreement with the host's reference (``accuracy``).
Argument lists, environment and file formats: ``device``. The route is ONNX (export -> llm_build), or direct where
the device's build names its ``direct_builder``: ``tensorrt-edgellm-build`` from the checkpoint (quantize's, else the
source), the engine then run with that checkpoint (``--checkpointDir``). A device whose
block says ``standin: true`` runs test stand-ins of the tools: its results are recorded as stand-in and never count
as evidence.

``make nightly`` and ``edgefarm run`` install the pinned version on first use (:meth:`TensorrtEdgellm.install`); when
that fails (e.g. the package registry is unreachable) the reason is remembered for this process, and every row that
needs the toolchain is skipped with it. A matrix may choose other versions (``toolchain_versions:``, to compare
them): each runs from its own environment ``<data dir>/toolchains/tensorrt-edgellm-<version>``, which is never
installed on first use (a comparison is deliberate; installing a version takes minutes and the registry): a row
whose version is not installed is skipped naming ``edgefarm toolchains install tensorrt-edgellm==<version>``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgefarm.toolchains.base import (
    Availability,
    BenchRun,
    DeviceRequirements,
    DeviceStep,
    DocsLayout,
    EngineCheck,
    Environment,
    LayerExport,
    RegistryCheck,
    Route,
    ToolchainDriver,
    Variant,
    WeightReconciliation,
    register_toolchain,
)
from edgefarm.toolchains.tensorrt_edgellm import DEFAULT_VERSION, TOOLCHAIN, variants
from edgefarm.toolchains.tensorrt_edgellm import accuracy as text_accuracy
from edgefarm.toolchains.tensorrt_edgellm import device as trt
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
from edgellm.errors import BugError, ConfigurationError, EdgeLLMError, UnsupportedError
from edgellm.runtime.requests import GenerationRequest, check_requests
from edgellm.types import BenchMode, KVCachePrecision, LMHeadPrecision, Precision, QuantMethod

if TYPE_CHECKING:
    from edgefarm.artifacts.store import ArtifactRef
    from edgefarm.devices.inventory import Device
    from edgefarm.devices.transport.base import CommandResult
    from edgefarm.stages.job import CheckpointRef, JobSpec
    from edgefarm.stages.outcome import Keyed, StageOutcome
    from edgefarm.toolchains.base import HostWork
    from edgefarm.toolchains.mirror import WheelSource
    from edgellm.config import QuantConfig

log = logging.getLogger(__name__)

PINNED_VERSION = DEFAULT_VERSION
LIBNVINFER_VERSIONED = "libnvinfer.so.*.*.*"  # the real file behind libnvinfer.so.N: its name carries the release
# what the tools load at start (ld.so stops them with exit 127 without one: research §3)
REQUIRED_LIBS = ("libnvinfer.so.*", "libnvonnxparser.so.*", LIBNVINFER_VERSIONED)
DPKG_PACKAGES = ("tensorrt", "libnvinfer*", "nvidia-tensorrt")  # what JetPack installs TensorRT as
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


def _parsed(requests: list[dict[str, Any]]) -> list[GenerationRequest]:
    parsed = [GenerationRequest(**r) for r in requests]
    problems = check_requests(parsed)
    if problems:
        raise ConfigurationError("; ".join(problems))
    return parsed


@register_toolchain
class TensorrtEdgellm(ToolchainDriver):
    name = TOOLCHAIN
    pinned = PINNED_VERSION
    needs_gpu = True
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

    # --- install and version ---

    def available(self) -> Availability:
        problem = env_problem(self.env_path(), self.host_env_version)
        # only the pinned version is installed on first use (a compared version is installed on purpose)
        return Availability(problem is None, problem, installable=self.host_env_version == PINNED_VERSION)

    def install(self, wheels: WheelSource | None = None) -> str | None:
        if self.host_env_version != PINNED_VERSION:
            return self.available().reason
        assert self.data_dir is not None
        return ensure_installed(self.data_dir, wheels)

    def host_version(self) -> str:
        return installed_version(self.env_path())

    # --- bring-up checks, in its environment on the host (``bringup``) ---

    def _ready_env(self) -> Path:
        problem = env_problem(self.env_path(), self.host_env_version)
        if problem is not None:
            raise ConfigurationError(problem)
        return self.env_path()

    def registry_check(self, checkpoint: Path) -> RegistryCheck:
        from edgefarm.toolchains.tensorrt_edgellm import bringup

        return bringup.registry_check(self._ready_env(), checkpoint)

    def reconcile(self, checkpoint: Path) -> WeightReconciliation:
        from edgefarm.toolchains.tensorrt_edgellm import bringup

        return bringup.reconcile(self._ready_env(), checkpoint)

    def export_layers(self, checkpoint: Path, out_dir: Path, layers: int) -> LayerExport:
        from edgefarm.toolchains.tensorrt_edgellm import bringup

        return bringup.export_layers(self._ready_env(), checkpoint, out_dir, layers)

    def _root(self) -> Path:
        if self.data_dir is None:
            raise BugError(f"toolchain {self.name}: its environments were asked for without the farm's data dir")
        return toolchains_root(self.data_dir).resolve()

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
        if precision in self.quantizes():
            source = quantize.quantize(Path(env.path), checkpoint, work / "quantize", precision.value,
                                       chat_template=export.DEFAULT_CHAT_TEMPLATE).checkpoint
        export.export(Path(env.path), source, work / "export")

    def device_version(self, device: Device, env: Mapping[str, Any]) -> str:
        """The release of the build the job ran with: what its CMakeCache.txt says (the probe refused a device
        where that differs from the inventory), else the inventory's; ``+standin`` on a stand-in."""
        config = self._config(device)
        build = config.build(self.host_env_version) if config is not None else None
        facts = (env.get("toolchains") or {}).get(self.name) or {}
        read = ((facts.get("builds") or {}).get(str(build.build_dir)) or {}) if build is not None else {}
        version = read.get("version") or (build.version if build is not None else None)
        return (version or "unknown") + ("+standin" if config is not None and config.standin else "")

    # --- its block in a device's inventory (one build per release: device.DeviceBuilds) ---

    def device_config(self, block: Any, device: str) -> trt.DeviceBuilds:
        return trt.DeviceBuilds.from_inventory(block, device=device)

    @staticmethod
    def _config(device: Device) -> trt.DeviceBuilds | None:
        if TOOLCHAIN not in device.toolchains:
            return None
        return trt.DeviceBuilds.from_inventory(device.toolchains[TOOLCHAIN], device=device.id)

    def _install_of(self, device: Device) -> trt.DeviceInstall:
        """The device's build of the version this driver exports (a job never runs on a build of another)."""
        config = self._config(device)
        if config is None:
            raise UnsupportedError(f"device {device.id} has no TensorRT Edge-LLM install (add a toolchains: "
                                   f"{{{TOOLCHAIN}: {{...}}}} block with {', '.join(trt.INSTALL_KEYS)} to its "
                                   f"inventory file)")
        build = config.build(self.host_env_version)
        if build is None:
            raise UnsupportedError(f"device {device.id} has no {TOOLCHAIN} {self.host_env_version} build (its "
                                   f"builds: {', '.join(config.versions())}); an export runs only on a build of "
                                   f"its own version")
        return build

    def device_builds(self, device: Device) -> list[str | None]:
        config = self._config(device)
        return [b.version for b in config.builds] if config is not None else []

    def drives(self, device: Device) -> bool:
        config = self._config(device)
        return config is not None and config.build(self.host_env_version) is not None

    def devices_problem(self, platform: str, devices: Sequence[Device]) -> str | None:
        if any(self.drives(d) for d in devices):
            return None
        installed = {d.id: config.versions() for d in devices if (config := self._config(d)) is not None}
        if not installed:
            return (f"no device of platform {platform} has a TensorRT Edge-LLM install (add a toolchains: "
                    f"{{{TOOLCHAIN}: {{...}}}} block with {', '.join(trt.INSTALL_KEYS)} to its inventory file)")
        builds = "; ".join(f"{d}: {', '.join(v)}" for d, v in sorted(installed.items()))
        return (f"no {platform} device has a {TOOLCHAIN} {self.host_env_version} build, the version this row "
                f"exports with (builds: {builds}); a version mismatch is refused: add that build to a device's "
                f"inventory (builds: {{\"{self.host_env_version}\": {{build_dir: ...}}}}) or choose its version "
                f"(toolchain_versions)")

    def device_requirements(self, device: Device) -> DeviceRequirements | None:
        build = self._install_of(device)
        return DeviceRequirements(
            tools=build.tools(), lib_dirs=build.lib_dirs(),
            libs=REQUIRED_LIBS, files=(str(build.plugin_path),), build_dirs=(str(build.build_dir),),
            dpkg=DPKG_PACKAGES)

    def device_facts_problem(self, device: Device, facts: Mapping[str, Any]) -> str | None:
        build = self._install_of(device)
        read = (facts.get("builds") or {}).get(str(build.build_dir)) or {}
        found = read.get("version")
        if build.version is not None and found is not None and found != build.version:
            return (f"its {TOOLCHAIN} build at {build.build_dir} is release {found} (CMakeCache.txt), but the "
                    f"inventory lists it as {build.version}: a mismatched build is refused (fix the inventory's "
                    f"builds, or rebuild that release)")
        if build.version is None and found is None:
            return (f"the release of its {TOOLCHAIN} build at {build.build_dir} is unknown: CMakeCache.txt names no "
                    f"CMAKE_PROJECT_VERSION and the inventory gives no version")
        return None

    def standin(self, device: Device) -> bool:
        config = self._config(device)
        if config is None:
            raise UnsupportedError(f"device {device.id} has no TensorRT Edge-LLM install")
        return config.standin

    def route(self, device: Device | None = None) -> Route | None:
        """Direct on a device whose build of this version names its ``direct_builder``, else ONNX."""
        if device is None:
            return Route.ONNX
        config = self._config(device)
        build = config.build(self.host_env_version) if config is not None else None
        return Route.DIRECT if build is not None and build.direct_builder is not None else Route.ONNX

    def classify_exit(self, result: CommandResult) -> EdgeLLMError | None:
        """By the Edge-LLM tools' own conventions (``exits``): a loader, tool or plugin missing on the device is a
        DeviceConfigurationError, the OOM killer or a GPU allocation failure a ResourceError, a command line they
        refuse the farm's bug, a kernel that cannot take the model NotApplicable, anything else a TestFailure."""
        from edgefarm.toolchains.tensorrt_edgellm import exits

        return exits.classify(result)

    # --- host stages (toolchains/tensorrt_edgellm/host_stages.py) ---

    def quantize_key_inputs(self, job: JobSpec, quantize_device: str, version: str) -> dict[str, Any]:
        from edgefarm.toolchains.tensorrt_edgellm import host_stages

        return host_stages.quantize_key_inputs(self, job, quantize_device, version)

    def judge_quantized(self, work: HostWork, job: JobSpec, version: str, ref: ArtifactRef) -> StageOutcome:
        from edgefarm.toolchains.tensorrt_edgellm import host_stages

        return host_stages.judge_quantized(self, work, job, version, ref)

    def quantize(self, work: HostWork, job: JobSpec, keyed: Keyed) -> StageOutcome:
        from edgefarm.toolchains.tensorrt_edgellm import host_stages

        return host_stages.quantize(self, work, job, keyed)

    def export_key_inputs(self, checkpoint_sha: str, job: JobSpec, version: str) -> dict[str, Any]:
        from edgefarm.toolchains.tensorrt_edgellm import host_stages

        return {**self.common_export_key(checkpoint_sha, job, version), **host_stages.export_key_extra(job)}

    def export(self, work: HostWork, job: JobSpec, checkpoint: CheckpointRef, quantized_linears: int,
               keyed: Keyed) -> StageOutcome:
        from edgefarm.toolchains.tensorrt_edgellm import host_stages

        return host_stages.export(self, work, job, checkpoint, quantized_linears, keyed)

    # --- device stages (ONNX route; direct where the device's build has the direct builder) ---

    def build_key_inputs(self, device: Device) -> dict[str, Any]:
        route = self.route(device)
        assert route is not None
        return {"route": route.value, **self._install_of(device).describe()}

    def runtime_key_inputs(self, facts: Mapping[str, Any]) -> dict[str, Any]:
        """The TensorRT an engine was built with (its plan file runs only there): the versioned library's name."""
        found = (facts.get("libs") or {}).get(LIBNVINFER_VERSIONED)
        return {"tensorrt": found.rsplit("/", 1)[-1] if isinstance(found, str) else None}

    def _env(self, device: Device) -> dict[str, str]:
        return self._install_of(device).env(device.env.get("LD_LIBRARY_PATH"))

    def build_step(self, device: Device, onnx_dir: str, engine_dir: str, params: Mapping[str, int]) -> DeviceStep:
        """``llm_build`` on the export's dir; on the direct route ``onnx_dir`` is the checkpoint's dir and
        ``tensorrt-edgellm-build`` builds from it."""
        build = trt.direct_build_argv if self.route(device) is Route.DIRECT else trt.build_argv
        argv = build(self._install_of(device), onnx_dir, engine_dir, max_batch_size=params["max_batch_size"],
                     max_input_len=params["max_input_len"], max_kv_cache_capacity=params["max_seq_len"])
        return DeviceStep(argv, env=self._env(device), fetch={"engine": engine_dir.rsplit("/", 1)[-1]})

    def needs_onnx_for_check(self) -> bool:
        return True

    def engine_readback(self) -> tuple[str, ...]:
        """The engine's runtime config (its builder_config: the limits it was built for); the plan stays there."""
        return ("config.json",)

    def check_engine(self, engine_dir: Path, onnx_dir: Path | None, params: Mapping[str, int]) -> EngineCheck:
        assert onnx_dir is not None
        found = trt.read_engine(engine_dir, onnx_dir, params)
        detail = (f"engine precision {found.weights} (read back: {trt.ENGINE_FILE} and the builder_config of its "
                  f"config.json, {found.quantized_gemms} quantized GEMMs in the graph it was built from; "
                  f"KV cache {found.kv_cache}; route onnx)")
        return EngineCheck(found.weights, detail, {"quantized_gemms": (float(found.quantized_gemms), "")})

    def check_engine_from_checkpoint(self, engine_dir: Path, checkpoint_dir: Path,
                                     params: Mapping[str, int]) -> EngineCheck:
        found = trt.read_direct_engine(engine_dir, checkpoint_dir, params)
        detail = (f"engine precision {found.weights} (read back: {trt.ENGINE_FILE} and the builder_config of its "
                  f"config.json; the precision the checkpoint it was built from declares, which "
                  f"{trt.DIRECT_BUILDER} reads; {found.checkpoint_bindings} weights read from the checkpoint at run "
                  f"time; KV cache {found.kv_cache}; route direct)")
        return EngineCheck(found.weights, detail,
                           {"checkpoint_weight_bindings": (float(found.checkpoint_bindings), "")})

    def with_checkpoint(self, step: DeviceStep, checkpoint_dir: str) -> DeviceStep:
        return DeviceStep(trt.with_checkpoint_dir(step.argv, checkpoint_dir), env=step.env, fetch=step.fetch)

    def infer_request(self, requests: list[dict[str, Any]]) -> dict[str, Any]:
        return trt.to_trt_requests(_parsed(requests))

    def infer_step(self, device: Device, engine_dir: str, request_file: str, job_dir: str) -> DeviceStep:
        return DeviceStep(trt.inference_argv(self._install_of(device), engine_dir, request_file,
                                             f"{job_dir}/out.json"),
                          env=self._env(device), fetch={"out.json": "out.json"})

    def infer_responses(self, output: Mapping[str, Any], requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(trt.from_trt_responses(output, _parsed(requests))["responses"])

    def bench_runs(self, device: Device, engine_dir: str, job_dir: str, *, prompt_len: int, past_len: int,
                   warmup: int, iterations: int) -> list[BenchRun]:
        runs = []
        for mode, length in ((BenchMode.PREFILL, prompt_len), (BenchMode.DECODE, past_len)):
            out = f"{job_dir}/bench-{mode.value}"
            lengths = {"input_len": length} if mode is BenchMode.PREFILL else {"past_kv_len": length}
            argv = trt.bench_argv(self._install_of(device), engine_dir, mode, iterations=iterations, warmup=warmup,
                                  output_dir=out, **lengths)
            e2e = trt.bench_csv(f"bench-{mode.value}", mode, length)  # the only file llm_bench writes there
            runs.append(BenchRun(DeviceStep(argv, env=self._env(device), fetch={"e2e.csv": e2e}), mode))
        return runs

    def bench_metrics(self, run: BenchRun, fetched: Mapping[str, Path]) -> dict[str, tuple[float, str]]:
        return trt.parse_bench(run.mode, fetched["e2e.csv"].read_text(encoding="utf-8"),
                               **trt.bench_asked(run.mode, run.step.argv))

    # accuracy: llm_inference gives text only, so the device generates the reference's prompts greedily and the
    # host scores greedy text agreement (accuracy.py)

    def accuracy_reads_reference(self) -> bool:
        return True

    def accuracy_judged_on_host(self) -> bool:
        return True

    def accuracy_request(self, reference: Path) -> list[dict[str, Any]] | None:
        return text_accuracy.requests_for(reference)

    def accuracy_step(self, device: Device, engine_dir: str, reference_file: str | None, request_file: str | None,
                      job_dir: str, thresholds: Mapping[str, float]) -> DeviceStep:
        assert request_file is not None
        return DeviceStep(trt.inference_argv(self._install_of(device), engine_dir, request_file,
                                             f"{job_dir}/out.json"),
                          env=self._env(device), fetch={"out.json": "out.json"})

    def accuracy_report(self, fetched: Mapping[str, Path], *, reference: Path | None, checkpoint: Path,
                        precision: Precision, thresholds: Mapping[str, float],
                        requests: list[dict[str, Any]] | None) -> dict[str, Any]:
        assert reference is not None and requests is not None
        limits = text_accuracy.text_limits(precision, dict(thresholds))
        output = json.loads(fetched["out.json"].read_text(encoding="utf-8"))
        texts = [r["text"] for r in self.infer_responses(output, requests)]
        report = text_accuracy.judge(text_accuracy.compare_text(reference, checkpoint / "tokenizer.json", texts),
                                     limits)
        report["metrics"] = {name: (float(c["value"]), "") for name, c in report["checks"].items()}
        return report
