"""A toy toolchain in one file: what adding a toolchain to the farm takes, nothing more (README "Extending the farm").

Its "engine" is a JSON echo of the model, its tools are this very file run as a script on the device (pushed there
by the farm, like a vendor's runner): ``env``, ``build``, ``infer``, ``eval``, ``bench``. It proves nothing about any
model: it exists so that a test can plan and run every stage of the pipeline through the generic layers with a
toolchain they have never heard of, and so that the count of files a toolchain touches stays honest.

Host side (imported by the test, which registers ``ToyEcho``); device side (``python toy_toolchain.py CMD ...``):
stdlib only.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

NAME = "toy-echo"
VERSION = "0.1"  # the host's; the device reports its own through ``env``
PRECISION = "int4_wo"  # a "quantized" echo: its quantize stage copies the checkpoint and says so


def _device_main(argv: list[str]) -> int:
    """The device tool: stdlib only, like a real toolchain's runner."""
    command, *args = argv
    if command == "env":
        print(json.dumps({"version": f"{VERSION}-device", "python": sys.version.split()[0]}))
        return 0
    if command == "build":  # build ONNX_DIR ENGINE_DIR MAX_SEQ_LEN
        onnx_dir, engine_dir, max_seq_len = Path(args[0]), Path(args[1]), int(args[2])
        engine_dir.mkdir(parents=True)
        model = json.loads((onnx_dir / "model.json").read_text())
        (engine_dir / "engine.json").write_text(json.dumps({**model, "max_seq_len": max_seq_len}))
        return 0
    if command == "infer":  # infer ENGINE_DIR REQUEST_FILE OUT_FILE
        requests = json.loads(Path(args[1]).read_text())["requests"]
        responses = [{"id": r["id"], "text": f" {r['prompt']}", "output_ids": [1, 2, 3], "finish_reason": "length",
                      "timings": {"ttft_ms": 1.0, "ms_per_token": 0.5}} for r in requests]
        Path(args[2]).write_text(json.dumps({"responses": responses}))
        return 0
    if command == "eval":  # eval ENGINE_DIR REFERENCE_FILE OUT_FILE: the reference is there; echo agrees with it
        present = Path(args[1]).is_file()
        Path(args[2]).write_text(json.dumps({"passed": present, "checks": {"reference_read": {
            "value": 1.0 if present else 0.0, "passed": present}}, "failed_checks": [] if present else ["ref"]}))
        return 0 if present else 1
    if command == "bench":  # bench ENGINE_DIR MODE OUT_FILE
        t0 = time.perf_counter()
        sum(range(10_000))
        ms = (time.perf_counter() - t0) * 1000 or 0.001
        Path(args[2]).write_text(json.dumps({"mode": args[1], "ms": ms}))
        return 0
    print(f"toy-echo: unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_device_main(sys.argv[1:]))


# --- the driver (host side) ---------------------------------------------------------------------------------------
import shutil  # noqa: E402  (the device side above needs none of these)

from edgefarm.artifacts.kinds import ArtifactKind  # noqa: E402
from edgefarm.artifacts.store import ArtifactRef  # noqa: E402
from edgefarm.results.models import ResultStatus  # noqa: E402
from edgefarm.stages import Stage  # noqa: E402
from edgefarm.stages.job import CheckpointRef  # noqa: E402
from edgefarm.stages.outcome import StageOutcome  # noqa: E402
from edgefarm.toolchains.base import (  # noqa: E402
    QUANTIZE_RECORD,
    Availability,
    BenchRun,
    DeviceStep,
    EngineCheck,
    ToolchainDriver,
    Variant,
    pushed_path,
)
from edgefarm.toolchains.parts import DeviceStages, HostStages, ToolchainEnvironment  # noqa: E402
from edgellm.reference import checkpoint_digest  # noqa: E402
from edgellm.types import BenchMode, Precision  # noqa: E402

if TYPE_CHECKING:
    from edgefarm.devices.inventory import Device
    from edgefarm.stages.job import CheckpointRef, JobSpec
    from edgefarm.stages.outcome import Keyed
    from edgefarm.tasks.host import HostWork

TOOL = Path(__file__).resolve()


class ToyEnvironment(ToolchainEnvironment):
    """The toy's tool is this file: always there, at its one version."""

    def available(self) -> Availability:
        return Availability(True)

    def host_version(self) -> str:
        return VERSION


class ToyHostStages(HostStages):
    """Quantize (a copy) and export (an echo of the job), on the host."""

    # --- quantize: the checkpoint copied, recorded as a quantizer's product is (toolchains.base.QUANTIZE_RECORD) ---

    def quantize_key_inputs(self, job: JobSpec, quantize_device: str, version: str) -> dict[str, Any]:
        return {"stage": "quantize", "checkpoint_sha256": job.checkpoint.sha256, "toolchain": self.name,
                "toolchain_version": version, "echo_copy": 1}

    def quantize(self, work: HostWork, job: JobSpec, keyed: Keyed) -> StageOutcome:
        with work.scratch("toy-quantize-") as tmp:
            made = tmp / "quantized"
            shutil.copytree(job.checkpoint.path, made / "checkpoint")
            (made / QUANTIZE_RECORD).write_text(json.dumps({"checkpoint_sha256":
                                                                 checkpoint_digest(made / "checkpoint")}))
            ref = work.put(made, ArtifactKind.CHECKPOINT)
            keyed.made(ref)
            work.install_checkpoint(ref, made)
        return self.judge_quantized(work, job, str(keyed.toolchain_version), ref)

    def judge_quantized(self, work: HostWork, job: JobSpec, version: str, ref: ArtifactRef) -> StageOutcome:
        directory, record = work.materialize_checkpoint(ref)
        out = StageOutcome(stage=Stage.QUANTIZE, status=ResultStatus.PASS, toolchain=self.name,
                           toolchain_version=version, device="orchestrator", reason="echo copy of the checkpoint")
        out.outputs["checkpoint"] = CheckpointRef(model=job.model, path=str(directory / "checkpoint"),
                                                  sha256=str(record["checkpoint_sha256"]))
        out.outputs["quantized_linears"] = 0
        out.artifacts.append(ref)
        return out

    def export_key_inputs(self, checkpoint_sha: str, job: JobSpec, version: str) -> dict[str, Any]:
        return {**self.common_export_key(checkpoint_sha, job, version), "echo_format": 1}

    def export(self, work: HostWork, job: JobSpec, checkpoint: CheckpointRef, quantized_linears: int,
               keyed: Keyed) -> StageOutcome:
        with work.scratch("toy-export-") as tmp:
            (tmp / "export").mkdir()
            (tmp / "export" / "model.json").write_text(json.dumps({"model": job.model, "sha256": checkpoint.sha256,
                                                                    "precision": job.precision.value}))
            ref = work.put(tmp / "export", ArtifactKind.ONNX)
        keyed.made(ref)
        out = StageOutcome(stage=Stage.EXPORT, status=ResultStatus.PASS, device="orchestrator",
                           reason=f"echo of {job.model}")
        out.outputs["onnx"] = ref
        out.artifacts.append(ref)
        return out


class ToyDeviceStages(DeviceStages):
    """This file, pushed to the device and run by its Python."""

    def device_files(self) -> tuple[Path, ...]:
        return (TOOL,)

    def probe_step(self, device: Device) -> DeviceStep | None:
        return DeviceStep([device.interpreter, pushed_path(TOOL), "env"])

    def engine_readback(self) -> tuple[str, ...]:
        return ("engine.json",)

    def device_version(self, device: Device, env: Mapping[str, Any]) -> str:
        return str(((env.get("toolchains") or {}).get(self.name) or {}).get("version", "unknown"))

    def _tool(self, device: Device, *args: str) -> list[str]:
        return [device.interpreter, pushed_path(TOOL), *args]

    def build_step(self, device: Device, onnx_dir: str, engine_dir: str, params: Mapping[str, int]) -> DeviceStep:
        return DeviceStep(self._tool(device, "build", onnx_dir, engine_dir, str(params["max_seq_len"])),
                          fetch={"engine": engine_dir.rsplit("/", 1)[-1]})

    def check_engine(self, engine_dir: Path, onnx_dir: Path | None, params: Mapping[str, int]) -> EngineCheck:
        found = json.loads((engine_dir / "engine.json").read_text())["precision"]
        return EngineCheck(found, f"echo engine at {found}")

    def infer_step(self, device: Device, engine_dir: str, request_file: str, job_dir: str) -> DeviceStep:
        return DeviceStep(self._tool(device, "infer", engine_dir, request_file, f"{job_dir}/out.json"),
                          fetch={"out.json": "out.json"})

    def bench_runs(self, device: Device, engine_dir: str, job_dir: str, *, prompt_len: int, past_len: int,
                   warmup: int, iterations: int) -> list[BenchRun]:
        return [BenchRun(DeviceStep(self._tool(device, "bench", engine_dir, mode.value, f"{job_dir}/bench.json"),
                                    fetch={"bench.json": "bench.json"}), mode)
                for mode in (BenchMode.PREFILL, BenchMode.DECODE)]

    def bench_metrics(self, run: BenchRun, fetched: Mapping[str, Path]) -> dict[str, tuple[float, str]]:
        report = json.loads(fetched["bench.json"].read_text())
        assert report["mode"] == run.mode.value
        return {f"{run.mode.value}_ms_per_token": (float(report["ms"]), "ms")}

    def accuracy_step(self, device: Device, engine_dir: str, reference_file: str | None, request_file: str | None,
                      job_dir: str, thresholds: Mapping[str, float]) -> DeviceStep:
        assert reference_file is not None
        return DeviceStep(self._tool(device, "eval", engine_dir, reference_file, f"{job_dir}/eval.json"),
                          fetch={"eval.json": "eval.json"})

    def accuracy_report(self, fetched: Mapping[str, Path], *, reference: Path | None, checkpoint: Path,
                        precision: Precision, thresholds: Mapping[str, float],
                        requests: list[dict[str, Any]] | None) -> dict[str, Any]:
        report: dict[str, Any] = json.loads(fetched["eval.json"].read_text())
        report["metrics"] = {name: (float(c["value"]), "") for name, c in report["checks"].items()}
        return report


class ToyEcho(ToolchainDriver):
    name = NAME
    HOST_STAGES = ToyHostStages
    DEVICE_STAGES = ToyDeviceStages
    ENVIRONMENT = ToyEnvironment

    def precisions(self) -> tuple[Precision, ...]:
        return (Precision(PRECISION),)

    def quantizes(self) -> tuple[Precision, ...]:
        return (Precision(PRECISION),)

    def variant_problem(self, variant: Variant) -> str | None:
        if variant.lm_head is not None or variant.kv_cache is not None:
            return f"toolchain {self.name} has one LM head and one KV cache"
        return None
