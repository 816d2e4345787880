"""The toolchains made of this library: ``edgellm`` exports on the host, ``edgellm build --backend B`` builds on the
device, ``edgellm infer|eval|bench`` run there. One class per backend; what each can produce is the library's
own answer (edgellm/capabilities.py: its export precisions and variants, and the backend's declaration), never a
list kept here.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from edgefarm.toolchains.base import (
    Availability,
    BenchRun,
    DeviceStep,
    EngineCheck,
    RegistryCheck,
    ToolchainDriver,
    Variant,
    WeightReconciliation,
    register_toolchain,
)
from edgefarm.toolchains.parts import DeviceStages, HostStages, ToolchainEnvironment
from edgellm.backends.base import backend_names, registered_backends
from edgellm.capabilities import buildable
from edgellm.compiler.build import ENGINE_MANIFEST
from edgellm.compiler.export import OPSET, check_variant, quantized_export_precisions
from edgellm.errors import ConfigurationError, TestFailure, UnsupportedError
from edgellm.thresholds import FIELDS
from edgellm.types import UNQUANTIZED, BenchMode, Precision

if TYPE_CHECKING:
    from edgefarm.devices.inventory import Device
    from edgefarm.stages.job import CheckpointRef, JobSpec
    from edgefarm.stages.outcome import Keyed, StageOutcome
    from edgefarm.toolchains.base import HostWork
    from edgellm.config import QuantConfig


@functools.cache
def _flag_of() -> dict[str, str]:
    """threshold name -> the ``edgellm eval`` option that overrides it (asked of the CLI's own parser)."""
    from edgellm.cli import eval as eval_cli

    parser = argparse.ArgumentParser()
    eval_cli.add_arguments(parser)
    return {a.dest: a.option_strings[0] for a in parser._actions if a.dest in FIELDS and a.option_strings}


def threshold_flags(limits: Mapping[str, float]) -> list[str]:
    """``edgellm eval`` options for the catalog's limits of a model (over the library's per-precision defaults)."""
    flags = []
    for name, value in sorted(limits.items()):
        if name not in _flag_of():
            raise ConfigurationError(f"threshold {name!r} cannot be given to edgellm eval; valid: "
                                     f"{', '.join(sorted(_flag_of()))}")
        flags += [_flag_of()[name], repr(float(value))]
    return flags


def eval_metrics(report: Mapping[str, object]) -> dict[str, tuple[float, str]]:
    metrics: dict[str, tuple[float, str]] = {}
    checks = report.get("checks") or {}
    if isinstance(checks, dict):
        for name, check in checks.items():
            value = check.get("value") if isinstance(check, dict) else None
            if isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)):
                metrics[name] = (float(value), "")
    ref, eng = report.get("reference_perplexity"), report.get("engine_perplexity")
    if isinstance(ref, (int, float)) and isinstance(eng, (int, float)) and ref > 0:
        metrics["perplexity"] = (float(eng), "")
        metrics["reference_perplexity"] = (float(ref), "")
        metrics["perplexity_ratio"] = (float(eng) / float(ref), "")
    return metrics


@functools.cache
def _host_env() -> dict[str, Any]:
    """``edgellm env`` of this process, once (package versions do not change while it runs)."""
    from edgellm.cli.env import collect

    return collect()


class EdgellmEnvironment(ToolchainEnvironment):
    """The farm's own environment: the backend is there when this edgellm registers it."""

    toolchain: EdgellmToolchain

    def available(self) -> Availability:
        if self.toolchain.backend not in backend_names():
            return Availability(False, f"this edgellm has no {self.toolchain.backend} backend")
        return Availability(True)

    def host_version(self) -> str:
        return self.toolchain.version(_host_env())


class EdgellmHostStages(HostStages):
    """Export (host_stages.py) and the bring-up checks of edgellm's own model registry (bringup.py)."""

    def registry_check(self, checkpoint: Path) -> RegistryCheck:
        from edgefarm.toolchains.edgellm import bringup

        return bringup.registry_check(self.name, self.toolchain.environment.host_version(), checkpoint)

    def reconcile(self, checkpoint: Path) -> WeightReconciliation:
        from edgefarm.toolchains.edgellm import bringup

        return bringup.reconcile(self.name, self.toolchain.environment.host_version(), checkpoint)

    def export_key_inputs(self, checkpoint_sha: str, job: JobSpec, version: str) -> dict[str, Any]:
        from edgellm.build_id import build_id

        return {**self.common_export_key(checkpoint_sha, job, version), "opset": OPSET, "edgellm_build": build_id()}

    def export(self, work: HostWork, job: JobSpec, checkpoint: CheckpointRef, quantized_linears: int,
               keyed: Keyed) -> StageOutcome:
        from edgefarm.toolchains.edgellm import host_stages

        return host_stages.export(self.toolchain, work, job, checkpoint, keyed)


class EdgellmDeviceStages(DeviceStages):
    """edgellm's CLI on the device."""

    toolchain: EdgellmToolchain

    def probe_step(self, device: Device) -> DeviceStep | None:
        """This toolchain needs this package (and its backend's) on the device: ``edgellm env`` there says which."""
        return DeviceStep([device.interpreter, "-m", "edgellm", "env"])

    def device_version(self, device: Device, env: Mapping[str, Any]) -> str:
        return self.toolchain.version((env.get("toolchains") or {}).get(self.name) or {})

    def runtime_key_inputs(self, facts: Mapping[str, Any]) -> dict[str, Any]:
        """The device's edgellm source digest (an engine is the product of the code that built it)."""
        return {"edgellm_build": facts.get("edgellm_build")}

    def engine_readback(self) -> tuple[str, ...]:
        return (ENGINE_MANIFEST,)

    def build_step(self, device: Device, onnx_dir: str, engine_dir: str, params: Mapping[str, int]) -> DeviceStep:
        return DeviceStep([device.interpreter, "-m", "edgellm", "build", onnx_dir, engine_dir, "--backend",
                           self.toolchain.backend, "--max-batch-size", str(params["max_batch_size"]),
                           "--max-input-len", str(params["max_input_len"]), "--max-seq-len",
                           str(params["max_seq_len"])],
                          fetch={"engine": engine_dir.rsplit("/", 1)[-1]})

    def check_engine(self, engine_dir: Path, onnx_dir: Path | None, params: Mapping[str, int]) -> EngineCheck:
        """The engine manifest states the precision the build read back from the graph it built."""
        manifest = json.loads((engine_dir / ENGINE_MANIFEST).read_text())
        metrics: dict[str, tuple[float, str]] = {}
        build_s = manifest.get("build_seconds")
        if isinstance(build_s, (int, float)):
            metrics["build_s"] = (float(build_s), "s")
        found = str(manifest.get("precision"))
        return EngineCheck(found, f"engine precision {found} (read back from the built graph)", metrics)

    def infer_step(self, device: Device, engine_dir: str, request_file: str, job_dir: str) -> DeviceStep:
        return DeviceStep([device.interpreter, "-m", "edgellm", "infer", "--engine-dir", engine_dir,
                           "--input-file", request_file, "--output-file", f"{job_dir}/out.json"],
                          fetch={"out.json": "out.json"})

    def bench_runs(self, device: Device, engine_dir: str, job_dir: str, *, prompt_len: int, past_len: int,
                   warmup: int, iterations: int) -> list[BenchRun]:
        modes = {
            BenchMode.PREFILL: ["--batch-size", "1", "--input-len", str(prompt_len), "--past-len", "0"],
            BenchMode.DECODE: ["--batch-size", "1", "--past-len", str(past_len)],
        }
        return [BenchRun(DeviceStep([device.interpreter, "-m", "edgellm", "bench", "--engine-dir", engine_dir,
                                     "--mode", mode.value, *args, "--warmup", str(warmup), "--iterations",
                                     str(iterations), "--output", f"{job_dir}/bench.json"],
                                    fetch={"bench.json": "bench.json"}), mode) for mode, args in modes.items()]

    def bench_metrics(self, run: BenchRun, fetched: Mapping[str, Path]) -> dict[str, tuple[float, str]]:
        return bench_metrics(run.mode, json.loads(fetched["bench.json"].read_text()))

    def accuracy_step(self, device: Device, engine_dir: str, reference_file: str | None, request_file: str | None,
                      job_dir: str, thresholds: Mapping[str, float]) -> DeviceStep:
        assert reference_file is not None
        return DeviceStep([device.interpreter, "-m", "edgellm", "eval", "--engine-dir", engine_dir,
                           "--reference", reference_file, "--output", f"{job_dir}/eval.json",
                           *threshold_flags(thresholds)], fetch={"eval.json": "eval.json"})

    def accuracy_report(self, fetched: Mapping[str, Path], *, reference: Path | None, checkpoint: Path,
                        precision: Precision, thresholds: Mapping[str, float],
                        requests: list[dict[str, Any]] | None) -> dict[str, Any]:
        if "eval.json" not in fetched:
            raise TestFailure("edgellm eval wrote no report")
        report: dict[str, Any] = json.loads(fetched["eval.json"].read_text())
        report["metrics"] = eval_metrics(report)
        return report


class EdgellmToolchain(ToolchainDriver):
    backend: ClassVar[str]  # the `edgellm build --backend` value
    package: ClassVar[str]  # the Python distribution whose version is the backend's (`edgellm env` packages)
    # the variant features its export and runtime carry out: none yet (each refused with what is missing)
    FEATURES: ClassVar[frozenset[str]] = frozenset()
    FEATURE_REASONS: ClassVar[Mapping[str, str]] = {
        "speculative": "its KV-cache runtime decodes one model; no draft/base pairing",
        "lora": "its export reads no LoRA adapter",
        "reduced_vocab": "its export keeps the checkpoint's vocabulary",
        "fp8_embedding": "its engines keep the embedding table at the weights' precision",
        "components": "it exports decoder-only text LLMs; no visual or audio encoder",
    }

    HOST_STAGES = EdgellmHostStages
    DEVICE_STAGES = EdgellmDeviceStages
    ENVIRONMENT = EdgellmEnvironment

    def precisions(self) -> tuple[Precision, ...]:
        """From a float checkpoint: what export and the backend both make; from a checkpoint the farm's quantizer
        made: the quantized precisions export reads and the backend builds."""
        if self.backend not in backend_names():
            return ()
        backend = registered_backends().get(self.backend)
        built = set(backend.precisions) if backend is not None else set()
        return (*buildable(self.backend), *(p for p in quantized_export_precisions() if p in built))

    def precision_problem(self, precision: Precision) -> str | None:
        """The generic refusal, with the library's own reason for a quantization method its export reads no
        checkpoint of (e.g. int4_gptq: the method's module in edgellm/quant declares no stored layout)."""
        problem = super().precision_problem(precision)
        if problem is None or precision in UNQUANTIZED:
            return problem
        from edgellm.quant import method

        found = method(precision.value)
        if found.stored is None:
            why = (f"edgellm's export reads no {precision} checkpoint (edgellm/quant/{found.name}.py declares no "
                   f"stored layout)")
        elif not found.exported():
            why = f"edgellm's export has no ONNX Runtime lowering of {precision}: {found.refused or 'not written'}"
        elif self.backend in backend_names() and precision not in registered_backends()[self.backend].precisions:
            why = f"the {self.backend} backend builds no {precision} engine"
        else:
            return problem
        return f"{problem}: {why}"

    def prequantized_problem(self, quant: QuantConfig) -> str | None:
        """edgellm's export reads ModelOpt's unified checkpoints (edgellm.checkpoint.modelopt) at the precisions
        :meth:`precisions` holds; a quantized KV cache it refuses (``edgellm.quant.check_exportable``)."""
        precision = Precision(quant.method.value)
        if not quant.modelopt:
            return (f"toolchain {self.name}: edgellm's export reads ModelOpt unified checkpoints only "
                    f"(hf_quant_config.json, or quantization_config with quant_method modelopt); this checkpoint's "
                    f"{precision} is declared by {quant.source}")
        if quant.kv_cache is not None:
            return (f"toolchain {self.name}: the checkpoint's {quant.kv_cache} KV cache ({quant.source}) is not "
                    f"exported; the ONNX Runtime engine keeps its cache in float")
        return self.precision_problem(precision)

    def variant_problem(self, variant: Variant) -> str | None:
        try:
            check_variant(variant.precision, variant.lm_head, variant.kv_cache)
        except UnsupportedError as exc:
            return f"toolchain {self.name}: {exc}"
        return None

    def version(self, env: Mapping[str, Any]) -> str:
        """The toolchain's version on a machine, from that machine's ``edgellm env`` JSON."""
        packages = env.get("packages") or {}
        backend = packages.get(self.package) if isinstance(packages, Mapping) else None
        return f"{env.get('edgellm')}+{self.package}-{backend}"


def bench_metrics(mode: BenchMode, report: Mapping[str, Any]) -> dict[str, tuple[float, str]]:
    """Farm metrics of one ``edgellm bench`` JSON report (other toolchains that write that format reuse this)."""
    m = mode.value
    return {f"{m}_tokens_per_s": (float(report["tokens_per_s"]), "tokens/s"),
            f"{m}_ms_per_token": (float(report["ms_per_token"]["median"]), "ms"),
            f"{m}_ms_per_token_p90": (float(report["ms_per_token"]["p90"]), "ms"),
            f"{m}_peak_rss_mb": (report["peak_rss_bytes"] / 2**20, "MiB"),
            # the engine's own peak (edgellm.memory's estimate is of this): host RSS over its baseline, and on
            # torch-CUDA the GPU allocator's peaks; absent from reports of an older edgellm
            **{f"{m}_{name}_mb": (float(report[key]) / 2**20, "MiB")
               for name, key in PEAK_MEMORY_KEYS if report.get(key) is not None}}


PEAK_MEMORY_KEYS = (("peak_memory", "peak_memory_bytes"), ("cuda_peak_allocated", "cuda_peak_allocated_bytes"),
                    ("cuda_peak_reserved", "cuda_peak_reserved_bytes"))  # metric name -> edgellm bench report key


@register_toolchain
class EdgellmOrt(EdgellmToolchain):
    name = "edgellm-ort"  # this library, engines built and run with ONNX Runtime
    backend = "ort"
    package = "onnxruntime"


@register_toolchain
class EdgellmTorchCuda(EdgellmToolchain):
    name = "edgellm-torch-cuda"  # this library, the torch-CUDA backend
    backend = "torch-cuda"
    package = "torch"
    needs_gpu = True
