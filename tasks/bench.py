"""Bench: prefill and decode throughput of the engine on a device of the platform (``edgellm bench``)."""

from __future__ import annotations

import json

from artifacts.kinds import ArtifactKind
from devices.inventory import Device
from devices.transport import Transport
from results.models import ResultStatus
from stages import Stage
from tasks.common import (
    attempt_recorder,
    from_device_run,
)
from tasks.device_exec import DeviceRun, run_stage
from tasks.farm import Farm, FarmContext
from tasks.outcome import StageOutcome
from tasks.spec import JobSpec

WARMUP, ITERATIONS = 2, 10


def bench_modes(job: JobSpec) -> dict[str, list[str]]:
    prompt = min(job.max_input_len, 128)
    past = min(prompt, job.max_seq_len - 1)
    return {
        "prefill": ["--mode", "prefill", "--batch-size", "1", "--input-len", str(prompt), "--past-len", "0"],
        "decode": ["--mode", "decode", "--batch-size", "1", "--past-len", str(past)],
    }


def bench(ctx: FarmContext, job: JobSpec, built: StageOutcome) -> StageOutcome:
    """Prefill, then decode throughput of the built engine, each on a device held alone."""

    def body() -> StageOutcome:
        farm = Farm.get(ctx)
        engine = built.outputs["engine"]
        runs: dict[str, DeviceRun] = {}
        for mode, args in bench_modes(job).items():

            def argv(device: Device, transport: Transport, job_dir: str, args: list[str] = args) -> list[str]:
                return [device.interpreter, "-m", "edgellm", "bench", "--engine-dir", f"cache/{engine.sha256}",
                        *args, "--warmup", str(WARMUP), "--iterations", str(ITERATIONS),
                        "--output", f"{job_dir}/bench.json"]

            runs[mode] = run_stage(farm, platform=job.platform, what=f"bench-{mode}-{job.key}", argv=argv,
                                   inputs=[engine], fetch={"bench.json": "bench.json"},
                                   timeout=job.timeout(Stage.BENCH),
                                   on_attempt_failed=attempt_recorder(farm, job, Stage.BENCH), exclusive=True)
            if runs[mode].status is not ResultStatus.PASS:
                return from_device_run(Stage.BENCH, runs[mode], job)
        out = from_device_run(Stage.BENCH, runs["decode"], job)
        out.duration_s = sum(r.duration_s for r in runs.values())
        for mode, run in runs.items():
            report = json.loads(run.fetched["bench.json"].read_text())
            out.artifacts.append(farm.store.put(run.fetched["bench.json"], ArtifactKind.REPORT))
            out.metrics[f"{mode}_tokens_per_s"] = (float(report["tokens_per_s"]), "tokens/s")
            out.metrics[f"{mode}_ms_per_token"] = (float(report["ms_per_token"]["median"]), "ms")
            out.metrics[f"{mode}_ms_per_token_p90"] = (float(report["ms_per_token"]["p90"]), "ms")
            out.metrics[f"{mode}_peak_rss_mb"] = (report["peak_rss_bytes"] / 2**20, "MiB")
        return out

    return body()
