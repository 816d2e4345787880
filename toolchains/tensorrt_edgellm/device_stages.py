"""The ``tensorrt-edgellm`` toolchain's device stages as the farm drives them on a TensorRT device whose inventory
has a ``toolchains: {tensorrt-edgellm: {...}}`` block (one build per release: ``device.DeviceBuilds``): ``llm_build``
on the exported ``llm/`` dir (or ``tensorrt-edgellm-build`` from the checkpoint on the direct route),
``llm_inference`` with our requests translated to its input file and its output translated back, ``llm_bench``
prefill and decode, accuracy as greedy text agreement with the host's reference (``accuracy``). Argument lists,
environment and file formats: ``device``. A job runs only on a device's build of the version the driver exports
with (``TensorrtEdgellm.host_env_version``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefarm.toolchains.base import BenchRun, DeviceRequirements, DeviceStep, EngineCheck, Route
from edgefarm.toolchains.parts import DeviceStages
from edgefarm.toolchains.tensorrt_edgellm import TOOLCHAIN
from edgefarm.toolchains.tensorrt_edgellm import accuracy as text_accuracy
from edgefarm.toolchains.tensorrt_edgellm import device as trt
from edgellm.errors import ConfigurationError, EdgeLLMError, UnsupportedError
from edgellm.runtime.requests import GenerationRequest, check_requests
from edgellm.types import BenchMode, Precision

if TYPE_CHECKING:
    from edgefarm.devices.inventory import Device
    from edgefarm.devices.transport.base import CommandResult
    from edgefarm.toolchains.tensorrt_edgellm.driver import TensorrtEdgellm

LIBNVINFER_VERSIONED = "libnvinfer.so.*.*.*"  # the real file behind libnvinfer.so.N: its name carries the release
# what the tools load at start (ld.so stops them with exit 127 without one: research §3)
REQUIRED_LIBS = ("libnvinfer.so.*", "libnvonnxparser.so.*", LIBNVINFER_VERSIONED)
DPKG_PACKAGES = ("tensorrt", "libnvinfer*", "nvidia-tensorrt")  # what JetPack installs TensorRT as


def _parsed(requests: list[dict[str, Any]]) -> list[GenerationRequest]:
    parsed = [GenerationRequest(**r) for r in requests]
    problems = check_requests(parsed)
    if problems:
        raise ConfigurationError("; ".join(problems))
    return parsed


class TrtDeviceStages(DeviceStages):
    """ONNX route; direct where the device's build has the direct builder."""

    toolchain: TensorrtEdgellm

    def device_version(self, device: Device, env: Mapping[str, Any]) -> str:
        """The release of the build the job ran with: what its CMakeCache.txt says (the probe refused a device
        where that differs from the inventory), else the inventory's; ``+standin`` on a stand-in."""
        config = self.toolchain.builds_on(device)
        build = config.build(self.toolchain.host_env_version) if config is not None else None
        facts = (env.get("toolchains") or {}).get(self.name) or {}
        read = ((facts.get("builds") or {}).get(str(build.build_dir)) or {}) if build is not None else {}
        version = read.get("version") or (build.version if build is not None else None)
        return (version or "unknown") + ("+standin" if config is not None and config.standin else "")


    # --- its block in a device's inventory (one build per release: device.DeviceBuilds) ---

    def device_config(self, block: Any, device: str) -> trt.DeviceBuilds:
        return trt.DeviceBuilds.from_inventory(block, device=device)

    def _install_of(self, device: Device) -> trt.DeviceInstall:
        """The device's build of the version this driver exports (a job never runs on a build of another)."""
        config = self.toolchain.builds_on(device)
        if config is None:
            raise UnsupportedError(f"device {device.id} has no TensorRT Edge-LLM install (add a toolchains: "
                                   f"{{{TOOLCHAIN}: {{...}}}} block with {', '.join(trt.INSTALL_KEYS)} to its "
                                   f"inventory file)")
        version = self.toolchain.host_env_version
        build = config.build(version)
        if build is None:
            raise UnsupportedError(f"device {device.id} has no {TOOLCHAIN} {version} build (its "
                                   f"builds: {', '.join(config.versions())}); an export runs only on a build of "
                                   f"its own version")
        return build

    def device_builds(self, device: Device) -> list[str | None]:
        config = self.toolchain.builds_on(device)
        return [b.version for b in config.builds] if config is not None else []

    def drives(self, device: Device) -> bool:
        config = self.toolchain.builds_on(device)
        return config is not None and config.build(self.toolchain.host_env_version) is not None

    def devices_problem(self, platform: str, devices: Sequence[Device]) -> str | None:
        if any(self.drives(d) for d in devices):
            return None
        installed = {d.id: config.versions() for d in devices if (config := self.toolchain.builds_on(d)) is not None}
        if not installed:
            return (f"no device of platform {platform} has a TensorRT Edge-LLM install (add a toolchains: "
                    f"{{{TOOLCHAIN}: {{...}}}} block with {', '.join(trt.INSTALL_KEYS)} to its inventory file)")
        builds = "; ".join(f"{d}: {', '.join(v)}" for d, v in sorted(installed.items()))
        version = self.toolchain.host_env_version
        return (f"no {platform} device has a {TOOLCHAIN} {version} build, the version this row "
                f"exports with (builds: {builds}); a version mismatch is refused: add that build to a device's "
                f"inventory (builds: {{\"{version}\": {{build_dir: ...}}}}) or choose its version "
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
        config = self.toolchain.builds_on(device)
        if config is None:
            raise UnsupportedError(f"device {device.id} has no TensorRT Edge-LLM install")
        return config.standin

    def classify_exit(self, result: CommandResult) -> EdgeLLMError | None:
        """By the Edge-LLM tools' own conventions (``exits``): a loader, tool or plugin missing on the device is a
        DeviceConfigurationError, the OOM killer or a GPU allocation failure a ResourceError, a command line they
        refuse the farm's bug, a kernel that cannot take the model NotApplicable, anything else a TestFailure."""
        from edgefarm.toolchains.tensorrt_edgellm import exits

        return exits.classify(result)


    # --- device stages (ONNX route; direct where the device's build has the direct builder) ---

    def build_key_inputs(self, device: Device) -> dict[str, Any]:
        route = self.toolchain.route(device)
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
        build = trt.direct_build_argv if self.toolchain.route(device) is Route.DIRECT else trt.build_argv
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
