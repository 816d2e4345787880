"""Bench: prefill and decode throughput of the engine on a device of the platform, each mode on a device held alone
(and, on a device of the orchestrating host, with the host to itself: ``tasks.host_gate``); the toolchain driver says
the command of each mode, what it writes, and reads that into metrics. Around each command the board's state (clocks,
temperatures) and the host's load and memory bandwidth (``tasks.bench_load``) are recorded with the result; one taken
under load is marked so, and regressions never use it."""

from __future__ import annotations

from typing import Any

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.devices.inventory import Device
from edgefarm.devices.transport import Transport
from edgefarm.results.models import ResultStatus
from edgefarm.results.regressions import UNDER_LOAD_METRIC
from edgefarm.stages import Stage
from edgefarm.stages.job import JobSpec
from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks import bench_load, bench_probe, engines, environment
from edgefarm.tasks.build import with_engine
from edgefarm.tasks.common import (
    attempt_recorder,
    from_device_run,
)
from edgefarm.tasks.device_exec import DeviceRun, run_stage
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.toolchains.base import BenchRun, DeviceStep, job_driver

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
    toolchain = job_driver(job, ctx.data_dir)
    device_stages = toolchain.device()
    prompt, past = bench_lengths(job)
    on_device = engines.load(farm, engine)
    probe = bench_probe.probe_ref(farm)
    runs: list[tuple[BenchRun, DeviceRun]] = []
    rounds: list[bench_probe.LoadRound] = []
    for index in range(2):  # prefill, then decode (the driver's order)
        chosen: list[BenchRun] = []
        load = bench_probe.LoadRound(probe)

        def step(device: Device, transport: Transport, job_dir: str, index: int = index,
                 chosen: list[BenchRun] = chosen, load: bench_probe.LoadRound = load) -> DeviceStep:
            path = engines.locate(farm, device, transport, on_device)
            bench_run = device_stages.bench_runs(device, path, job_dir, prompt_len=prompt,
                                             past_len=past, warmup=WARMUP, iterations=ITERATIONS)[index]
            chosen.append(bench_run)
            load.start(device, transport)  # the last thing before the command (and its environment snapshot)
            return engines.runtime_step(toolchain, on_device, bench_run.step)

        def probed(transport: Transport, run: DeviceRun, load: bench_probe.LoadRound = load) -> None:
            load.end(run.device, transport)

        run = run_stage(farm, platform=job.platform, what=f"bench-{index}-{job.key}", argv=step,
                        inputs=[*engines.runtime_inputs(farm, on_device), probe], timeout=job.timeout(Stage.BENCH),
                        on_attempt_failed=attempt_recorder(farm, job, Stage.BENCH, toolchain), exclusive=True,
                        toolchain=toolchain, only=engines.holders(farm, on_device), snapshots=True, after=probed)
        if run.status is not ResultStatus.PASS:
            return from_device_run(Stage.BENCH, run, toolchain)
        runs.append((chosen[-1], run))
        rounds.append(load)
    out = from_device_run(Stage.BENCH, runs[-1][1], toolchain)
    out.standin = any(device_stages.standin(r.device) for _, r in runs)
    out.duration_s = sum(r.duration_s for _, r in runs)
    _conditions(farm, out, runs)
    _load(farm, out, runs, rounds)
    for bench_run, run in runs:
        for path in run.fetched.values():
            out.artifacts.append(farm.store.put(path, ArtifactKind.REPORT))
        out.metrics.update(device_stages.bench_metrics(bench_run, run.fetched))
    return out


def _conditions(farm: Farm, out: StageOutcome, runs: list[tuple[BenchRun, DeviceRun]]) -> None:
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
        found = environment.bench_conditions(farm.registries.device_type(run.device.type), before)
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


def _load(farm: Farm, out: StageOutcome, runs: list[tuple[BenchRun, DeviceRun]],
          rounds: list[bench_probe.LoadRound]) -> None:
    """Record the host's load and memory bandwidth around each command (metrics, and the figures with the board's
    state in the environment's ``bench`` entries); mark a benchmark taken under load (``tasks.bench_load``)."""
    figures: list[tuple[str, dict[str, Any]]] = []
    for (bench_run, _), load in zip(runs, rounds, strict=True):
        if load.before is None or load.after is None:
            continue
        mode = bench_run.mode.value
        fig = bench_load.round_figures(load.before, load.after, load.own_cpu_s)
        figures.append((mode, fig))
        out.metrics.update(bench_load.metrics(mode, fig))
    device = runs[-1][1].device.id
    why = bench_load.under_load(figures, bench_probe.recent_copy_median(farm.engine, device))
    out.metrics[UNDER_LOAD_METRIC] = (1.0 if why else 0.0, "")
    if out.environment is not None and figures:
        around = {a.get("mode"): a for a in out.environment.get("bench") or [] if isinstance(a, dict)}
        for mode, fig in figures:
            around[mode] = {**around.get(mode, {"mode": mode}), "host": fig}
        out.environment = {**out.environment, "bench": list(around.values())}
    if why:
        note = f"under load ({why}): unreliable, kept out of regression baselines"
        out.reason = f"{note}; {out.reason}" if out.reason else note
        out.reason = out.reason[:2000]
