"""Bench: prefill and decode throughput of the engine on a device of the platform; the toolchain driver says the
commands (``edgellm bench``; ``llm_bench``) and reads their outputs into metrics."""

from __future__ import annotations

from pathlib import Path

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
from toolchains.base import BenchRun, DeviceStep, ToolchainDriver, require

WARMUP, ITERATIONS = 2, 10


def bench_lengths(job: JobSpec) -> tuple[int, int]:
    """(prompt length of the prefill run, past length of the decode run)."""
    prompt = min(job.max_input_len, 128)
    return prompt, min(prompt, job.max_seq_len - 1)


def _any_device(farm: Farm, job: JobSpec, toolchain: ToolchainDriver) -> Device:
    """A device the toolchain drives (only to ask which files a benchmark command writes: names, not paths)."""
    return next(d for d in farm.inventory.select(platform=job.platform) if toolchain.drives(d))


def bench(ctx: FarmContext, job: JobSpec, built: StageOutcome) -> StageOutcome:
    """Prefill, then decode throughput of the built engine, each on a device held alone."""

    def body() -> StageOutcome:
        farm = Farm.get(ctx)
        engine = built.outputs["engine"]
        toolchain = require(job.toolchain, Path(farm.ctx.data_dir))
        prompt, past = bench_lengths(job)
        runs: list[tuple[BenchRun, DeviceRun]] = []
        for index in range(2):  # prefill, then decode (the driver's order)
            chosen: list[BenchRun] = []

            def step(device: Device, transport: Transport, job_dir: str, index: int = index,
                     chosen: list[BenchRun] = chosen) -> DeviceStep:
                bench_run = toolchain.bench_runs(device, f"cache/{engine.sha256}", job_dir, prompt_len=prompt,
                                                 past_len=past, warmup=WARMUP, iterations=ITERATIONS)[index]
                chosen.append(bench_run)
                return bench_run.step

            fetch = toolchain.bench_runs(_any_device(farm, job, toolchain), "e", "j", prompt_len=prompt,
                                         past_len=past, warmup=WARMUP, iterations=ITERATIONS)[index].step.fetch
            run = run_stage(farm, platform=job.platform, what=f"bench-{index}-{job.key}", argv=step,
                            inputs=[engine], fetch=fetch, timeout=job.timeout(Stage.BENCH),
                            on_attempt_failed=attempt_recorder(farm, job, Stage.BENCH), exclusive=True,
                            accepts=toolchain.drives)
            if run.status is not ResultStatus.PASS:
                out = from_device_run(Stage.BENCH, run, job)
                out.toolchain_version = toolchain.device_version(run.device, run.env)
                out.route, out.standin = toolchain.route(), toolchain.standin(run.device)
                return out
            runs.append((chosen[-1], run))
        last = runs[-1][1]
        out = from_device_run(Stage.BENCH, last, job)
        out.toolchain_version = toolchain.device_version(last.device, last.env)
        out.route, out.standin = toolchain.route(), any(toolchain.standin(r.device) for _, r in runs)
        out.duration_s = sum(r.duration_s for _, r in runs)
        for bench_run, run in runs:
            for path in run.fetched.values():
                out.artifacts.append(farm.store.put(path, ArtifactKind.REPORT))
            out.metrics.update(toolchain.bench_metrics(bench_run, run.fetched))
        return out

    return body()
