"""The ``onnxruntime-genai`` toolchain as the farm drives it on a CPU platform: Microsoft's model builder exports on
the orchestrating host (fp32, and int4_wo: its own round-to-nearest weight-only int4, so the quantize stage is the
identity), and its ``generate()`` runtime runs the device stages through one self-contained script the farm pushes
to each device (``runner.py``; the device needs Python 3.8+ with numpy and onnxruntime-genai, nothing of ours):
build (load the model there, set its limits), infer (our requests, its responses), accuracy (teacher-forced logits
and greedy continuations, scored on the host by edgellm's own comparison against the same float reference) and
bench (prefill and decode at the farm's shapes). Its version is the installed distribution's: on the host, the
farm's environment (``pip install 'edgellm-farm[genai]'``); on a device, what the runner's ``env`` reads there.
Other versions, for ``edgefarm bisect --toolchain onnxruntime-genai``: each in an environment of its own under the
data dir holding only that distribution, over the farm's (its dependencies and onnxruntime stay the farm's); a
version's probe is the builder's export from it.

This module imports only light parts at load (device types validate toolchain names against the registry); the
builder, the graph check and the scoring are imported when a stage runs.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgefarm.toolchains.base import (
    Availability,
    BenchRun,
    DeviceStep,
    EngineCheck,
    Environment,
    ToolchainDriver,
    Variant,
    pushed_path,
    register_toolchain,
)
from edgefarm.toolchains.onnxruntime_genai import DISTRIBUTION, TOOLCHAIN
from edgefarm.toolchains.onnxruntime_genai import device as runner
from edgefarm.toolchains.parts import DeviceStages, HostStages, ToolchainEnvironment
from edgellm.errors import BugError, ConfigurationError, TestFailure
from edgellm.types import BenchMode, KVCachePrecision, LMHeadPrecision, Precision

if TYPE_CHECKING:
    from edgefarm.devices.inventory import Device
    from edgefarm.stages.job import CheckpointRef, JobSpec
    from edgefarm.stages.outcome import Keyed, StageOutcome
    from edgefarm.toolchains.base import HostWork
    from edgefarm.toolchains.mirror import WheelSource

EXPORT_CHECK = 1  # version of the read-back check a cached export passed (bump when it tightens)
_MADE_IN_EXPORT = (Precision.INT4_WO,)
# a version names a directory: an exact release, ASCII, bounded (0.17.1, 0.18.0rc1, 0.18.0.post1)
_VERSION = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6}){1,3}((a|b|rc)[0-9]{1,4})?(\.post[0-9]{1,4})?(\.dev[0-9]{1,4})?",
                      re.ASCII)


def check_version(version: str) -> str:
    if not (isinstance(version, str) and _VERSION.fullmatch(version)):
        raise ConfigurationError(f"bad {TOOLCHAIN} version {str(version)[:40]!r}; expected an exact release like "
                                 f"0.17.1 (also 0.18.0rc1, 0.18.0.post1), not a range or a name")
    return version


_LM_HEAD = {Precision.FP32: LMHeadPrecision.FP32, Precision.INT4_WO: LMHeadPrecision.INT4_WO}  # what the builder makes


class GenaiEnvironment(ToolchainEnvironment):
    """The farm's own environment; other versions, for a version bisection: an environment per version over the
    farm's."""

    def available(self) -> Availability:
        missing = [m for m in ("onnxruntime_genai", "onnx_ir") if importlib.util.find_spec(m) is None]
        if missing:
            return Availability(False, f"{', '.join(missing)} not installed in the farm's environment (install "
                                       f"edgellm-farm's genai extra: pip install 'edgellm-farm[genai]')")
        return Availability(True)

    def host_version(self) -> str:
        from edgefarm.toolchains.onnxruntime_genai.export import toolchain_version

        return toolchain_version()

    # --- other versions, for a version bisection: an environment per version over the farm's ---

    def _root(self) -> Path:
        if self.toolchain.data_dir is None:
            raise BugError(f"toolchain {self.name}: its environments were asked for without the farm's data dir")
        return Path(self.toolchain.data_dir).resolve() / "toolchains"

    def installable_versions(self) -> list[str]:
        from edgefarm.toolchains.venvs import installable_versions

        return installable_versions(DISTRIBUTION)

    def install_version(self, version: str, wheels: WheelSource | None = None) -> Environment:
        """``onnxruntime-genai==version`` alone (``--no-deps``) in ``<data dir>/toolchains/onnxruntime-genai-
        <version>``, over the farm's own environment (its site-packages follow the environment's own: the builder's
        dependencies and onnxruntime are the farm's). Only the distribution's version differs from the farm's."""
        from edgefarm.toolchains.venvs import install_distribution

        check_version(version)
        farm = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
        built = install_distribution(self._root(), self.name, version, [f"{DISTRIBUTION}=={version}"],
                                     distribution=DISTRIBUTION, wheels=wheels,
                                     pip_args=("--no-deps", "--ignore-installed"),  # its own copy, even of the farm's
                                     pth=[Path(p) for p in farm])
        return Environment(self.name, built.version, built.healthy, str(built.path), tuple(built.problems))

    def environments(self) -> list[Environment]:
        from edgefarm.toolchains.venvs import check_distribution

        root = self._root()
        found = sorted(p for p in root.glob(f"{self.name}-*") if p.is_dir()) if root.is_dir() else []
        checked = [check_distribution(p, DISTRIBUTION, p.name.removeprefix(f"{self.name}-")) for p in found]
        return [Environment(self.name, c.version, c.healthy, str(c.path), tuple(c.problems)) for c in checked]

    def sweep_dead_installs(self) -> list[Path]:
        from edgefarm.toolchains.venvs import sweep_dead_installs

        return sweep_dead_installs(self._root(), self.name) if self.toolchain.data_dir is not None else []

    def probe_version(self, env: Environment, checkpoint: Path, work: Path, precision: Precision) -> None:
        """Its host stage of the row with that version: the model builder's export, from the version's environment.
        Its device stages (the runner, with a device's own onnxruntime-genai) are not probed."""
        from edgefarm.toolchains.onnxruntime_genai import export

        export.export(checkpoint, work / "export", precision.value, log=work / "export.log",
                      python=Path(env.path) / "bin" / "python")


class GenaiHostStages(HostStages):
    """The model builder's export (host_stages.py)."""

    def export_key_inputs(self, checkpoint_sha: str, job: JobSpec, version: str) -> dict[str, Any]:
        from edgefarm.toolchains.onnxruntime_genai.export import RECIPES

        recipe = RECIPES[job.precision.value]
        return {**self.common_export_key(checkpoint_sha, job, version),
                "builder": {"precision": recipe.builder_precision, "extra_options": list(recipe.extra_options)},
                "export_check": EXPORT_CHECK}

    def export(self, work: HostWork, job: JobSpec, checkpoint: CheckpointRef, quantized_linears: int,
               keyed: Keyed) -> StageOutcome:
        from edgefarm.toolchains.onnxruntime_genai import host_stages

        return host_stages.export(self.toolchain, work, job, checkpoint, keyed)


class GenaiDeviceStages(DeviceStages):
    """The pushed runner (``runner.py``, its argument lists in ``device``)."""

    def device_files(self) -> tuple[Path, ...]:
        return (runner.RUNNER,)

    def probe_step(self, device: Device) -> DeviceStep | None:
        return DeviceStep(runner.env_argv(device.interpreter, pushed_path(runner.RUNNER)))

    def engine_readback(self) -> tuple[str, ...]:
        """The check reads the engine record, the genai config and the graph (not its external weights)."""
        return (runner.ENGINE_RECORD, "genai_config.json", "*/genai_config.json", "*.onnx", "*/*.onnx")

    def device_version(self, device: Device, env: Mapping[str, Any]) -> str:
        found = (env.get("toolchains") or {}).get(self.name) or {}
        return str(found.get("onnxruntime_genai") or "unknown")

    def _run(self, device: Device) -> tuple[str, str]:
        return device.interpreter, pushed_path(runner.RUNNER)

    def build_step(self, device: Device, onnx_dir: str, engine_dir: str, params: Mapping[str, int]) -> DeviceStep:
        from edgefarm.toolchains.onnxruntime_genai.export import MODEL_SUBDIR

        return DeviceStep(runner.build_argv(*self._run(device), f"{onnx_dir}/{MODEL_SUBDIR}", engine_dir,
                                            max_batch_size=params["max_batch_size"],
                                            max_input_len=params["max_input_len"], max_seq_len=params["max_seq_len"]),
                          fetch={"engine": engine_dir.rsplit("/", 1)[-1]})

    def needs_onnx_for_check(self) -> bool:
        return True

    def check_engine(self, engine_dir: Path, onnx_dir: Path | None, params: Mapping[str, int]) -> EngineCheck:
        """The weight precision read back from the engine's own graph (never assumed from the request)."""
        from edgefarm.toolchains.onnxruntime_genai.check import check_export
        from edgefarm.toolchains.onnxruntime_genai.export import EXPORT_RECORD

        assert onnx_dir is not None
        requested = json.loads((onnx_dir / EXPORT_RECORD).read_text(encoding="utf-8"))["precision"]
        record = json.loads((engine_dir / runner.ENGINE_RECORD).read_text(encoding="utf-8"))
        model = record["model"]
        config = {"num_hidden_layers": model["num_hidden_layers"], "num_attention_heads": model["num_attention_heads"],
                  "num_key_value_heads": model["num_key_value_heads"], "hidden_size": model["hidden_size"],
                  "vocab_size": model["vocab_size"], "head_dim": model["head_size"]}
        found = check_export(engine_dir, requested, config)
        precision = found.found if found.passed else f"{found.found} ({'; '.join(found.problems)})"
        metrics = {"quantized_gemms": (float(found.matmulnbits), ""), "build_s": (float(record["build_s"]), "s")}
        return EngineCheck(precision, f"{found.detail()}; loaded by onnxruntime-genai "
                                      f"{record['versions'].get('onnxruntime_genai')} in {record['load_s']:.2f} s",
                           metrics)

    def infer_step(self, device: Device, engine_dir: str, request_file: str, job_dir: str) -> DeviceStep:
        return DeviceStep(runner.infer_argv(*self._run(device), engine_dir, request_file, f"{job_dir}/out.json"),
                          fetch={"out.json": "out.json"})

    def bench_runs(self, device: Device, engine_dir: str, job_dir: str, *, prompt_len: int, past_len: int,
                   warmup: int, iterations: int) -> list[BenchRun]:
        return [BenchRun(DeviceStep(runner.bench_argv(*self._run(device), engine_dir, mode.value,
                                                      f"{job_dir}/bench.json", prompt_len=prompt_len,
                                                      past_len=past_len, warmup=warmup, iterations=iterations),
                                    fetch={"bench.json": "bench.json"}), mode)
                for mode in (BenchMode.PREFILL, BenchMode.DECODE)]

    def bench_metrics(self, run: BenchRun, fetched: Mapping[str, Path]) -> dict[str, tuple[float, str]]:
        from edgefarm.toolchains.onnxruntime_genai.bench import bench_metrics

        return bench_metrics(fetched["bench.json"], run.mode.value)

    # accuracy: the device computes what the host scores with edgellm's own comparison (accuracy.py)

    def accuracy_reads_reference(self) -> bool:
        return True

    def accuracy_judged_on_host(self) -> bool:
        return True

    def accuracy_step(self, device: Device, engine_dir: str, reference_file: str | None, request_file: str | None,
                      job_dir: str, thresholds: Mapping[str, float]) -> DeviceStep:
        assert reference_file is not None
        return DeviceStep(runner.logits_argv(*self._run(device), engine_dir, reference_file,
                                             f"{job_dir}/logits.npz"), fetch={"logits.npz": "logits.npz"})

    def accuracy_report(self, fetched: Mapping[str, Path], *, reference: Path | None, checkpoint: Path,
                        precision: Precision, thresholds: Mapping[str, float],
                        requests: list[dict[str, Any]] | None) -> dict[str, Any]:
        from edgefarm.toolchains.edgellm.driver import eval_metrics
        from edgefarm.toolchains.onnxruntime_genai.accuracy import report as score

        if "logits.npz" not in fetched or reference is None:
            raise TestFailure("the onnxruntime-genai runner wrote no logits file")
        report = score(fetched["logits.npz"], reference, precision.value, thresholds)
        report["metrics"] = eval_metrics(report)
        return report


@register_toolchain
class OnnxruntimeGenai(ToolchainDriver):
    name = TOOLCHAIN
    # the variant features its model builder and generate() carry out: none the farm drives yet
    FEATURES: ClassVar[frozenset[str]] = frozenset()
    FEATURE_REASONS: ClassVar[Mapping[str, str]] = {
        "speculative": "the farm's runner drives generate() with one model; no draft/base pairing",
        "lora": "the farm does not drive its model builder's adapter options",
        "reduced_vocab": "its model builder keeps the checkpoint's vocabulary",
        "fp8_embedding": "its CPU graphs keep the embedding in float",
        "components": "the farm drives its text decoder only; no visual or audio encoder",
    }

    HOST_STAGES = GenaiHostStages
    DEVICE_STAGES = GenaiDeviceStages
    ENVIRONMENT = GenaiEnvironment

    # --- what it can produce ---

    def precisions(self) -> tuple[Precision, ...]:
        return (Precision.FP32, *_MADE_IN_EXPORT)

    def quantizes_in_export(self) -> tuple[Precision, ...]:
        return _MADE_IN_EXPORT

    def variant_problem(self, variant: Variant) -> str | None:
        head = _LM_HEAD.get(variant.precision)
        if variant.lm_head is not None and variant.lm_head is not head:
            return (f"toolchain {self.name}: its builder makes the LM head {head} at {variant.precision}; "
                    f"{variant.lm_head} is not offered")
        if variant.kv_cache not in (None, KVCachePrecision.FP32):
            return f"toolchain {self.name}: its CPU graphs keep an fp32 KV cache; {variant.kv_cache} is not offered"
        return None

__all__ = ["DISTRIBUTION", "OnnxruntimeGenai"]
