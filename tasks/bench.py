"""Bench: prefill and decode throughput of the engine on a device of the platform, each mode on a device held alone;
the toolchain driver says the command of each mode, what it writes, and reads that into metrics."""

from __future__ import annotations

from artifacts.kinds import ArtifactKind
from devices.inventory import Device
from devices.transport import Transport
from results.models import ResultStatus
from stages import Stage
from stages.job import JobSpec
from stages.outcome import StageOutcome
from tasks import engines, environment
from tasks.build import with_engine
from tasks.common import (
    attempt_recorder,
    from_device_run,
)
from tasks.device_exec import DeviceRun, run_stage
from tasks.farm import Farm, FarmContext
from toolchains.base import BenchRun, DeviceStep

WARMUP, ITERATIONS = 2, 10


def bench_lengths(job: JobSpec) -> tuple[int, int]:
    """(prompt length of the prefill run, past length of the decode run)."""
    prompt = min(job.max_input_len, 128)
    return prompt, min(prompt, job.max_seq_len - 1)


def bench(ctx: FarmContext, job: JobSpec, built: StageOutcome) -> StageOutcome:
    """Prefill, then decode throughput of the built engine, each on a device held alone."""
    return with_engine(ctx, job, Stage.BENCH, built, lambda holder: _bench(ctx, job, holder))


def _bench(ctx: FarmContext, job: JobSpec, built: StageOutcome) -> StageOutcome:
    farm = Farm.get(ctx)
    engine = built.outputs["engine"]
    toolchain = job.driver(ctx.data_dir)
    prompt, past = bench_lengths(job)
    on_device = engines.load(farm, engine)
    runs: list[tuple[BenchRun, DeviceRun]] = []
    for index in range(2):  # prefill, then decode (the driver's order)
        chosen: list[BenchRun] = []

        def step(device: Device, transport: Transport, job_dir: str, index: int = index,
                 chosen: list[BenchRun] = chosen) -> DeviceStep:
            path = engines.locate(farm, device, transport, on_device)
            bench_run = toolchain.bench_runs(device, path, job_dir, prompt_len=prompt,
                                             past_len=past, warmup=WARMUP, iterations=ITERATIONS)[index]
            chosen.append(bench_run)
            return engines.runtime_step(toolchain, on_device, bench_run.step)

        run = run_stage(farm, platform=job.platform, what=f"bench-{index}-{job.key}", argv=step,
                        inputs=engines.runtime_inputs(farm, on_device), timeout=job.timeout(Stage.BENCH),
                        on_attempt_failed=attempt_recorder(farm, job, Stage.BENCH, toolchain), exclusive=True,
                        toolchain=toolchain, only=engines.holders(farm, on_device), snapshots=True)
        if run.status is not ResultStatus.PASS:
            return from_device_run(Stage.BENCH, run, toolchain)
        runs.append((chosen[-1], run))
    out = from_device_run(Stage.BENCH, runs[-1][1], toolchain)
    out.standin = any(toolchain.standin(r.device) for _, r in runs)
    out.duration_s = sum(r.duration_s for _, r in runs)
    _conditions(out, runs)
    for bench_run, run in runs:
        for path in run.fetched.values():
            out.artifacts.append(farm.store.put(path, ArtifactKind.REPORT))
        out.metrics.update(toolchain.bench_metrics(bench_run, run.fetched))
    return out


def _conditions(out: StageOutcome, runs: list[tuple[BenchRun, DeviceRun]]) -> None:
    """Record the board around each benchmark command (clocks, temperatures, power mode before and after) and how
    it differed from its device type's declared benchmark conditions (then the result says so, and regressions never
    compare it with runs in the declared conditions)."""
    around = []
    problems: list[str] = []
    for bench_run, run in runs:
        if run.snapshots is None:
            continue
        before, after = run.snapshots
        around.append({"mode": bench_run.mode.value, "before": environment.snapshot(before),
                       "after": environment.snapshot(after)})
        found = environment.bench_conditions(run.device.device_type, before)
        if found is not None and found not in problems:
            problems.append(found)
        for when, env in (("before", before), ("after", after)):
            hottest = max((t.get("temp_c") for t in env.get("thermal") or [] if isinstance(t, dict)
                           and isinstance(t.get("temp_c"), (int, float))), default=None)
            if hottest is not None:
                out.metrics[f"{bench_run.mode.value}_temp_max_c_{when}"] = (float(hottest), "C")
    if out.environment is not None and around:
        out.environment = {**out.environment, "bench": around}
    if problems:
        out.bench_conditions = "; ".join(problems)[:300]
        note = f"benchmarked outside its device type's conditions: {out.bench_conditions}"
        out.reason = f"{note}; {out.reason}" if out.reason else note
