"""``bring_up``: one checkpoint up the add-model ladder, stopping at the first rung that fails.

Rungs 1-6 run on this host (``tasks.bringup``: inventory, closest family, each toolchain's registry and weight
reconciliation in its own environment, the provider reference with the first N layers' hidden states, the
few-layer test); rung 7 is the farm's own pipeline for the checkpoint on each requested platform: export, build,
infer, accuracy and bench where the inventory has a device of it, export only where it has none (then the row is
export-verified, never supported). Every rung is recorded in the results database (``bringup_rungs``) under one run
of kind ``bringup`` whose rung 7 results are the rows' evidence; the report (``report.json``, ``report.md``) is
written to the report directory and the run names it (its run page links it).

The checkpoint is a directory, or a catalog model's name (its checkpoint located as a run would). A directory the
catalog holds under a model name keeps that name and its accuracy limits; any other is the model
``bringup-<directory name>`` (or ``--name``), with the library's default limits.
"""

from __future__ import annotations

import difflib
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Completed, Failed, State
from prefect.task_runners import ThreadPoolTaskRunner

from edgefarm import stages
from edgefarm.devices.inventory import Inventory, load_inventory
from edgefarm.flows.bringup_fit import memory_fit, planned_toolchains
from edgefarm.flows.bringup_report import clear_planted, write_report
from edgefarm.flows.execute import execute_plan
from edgefarm.flows.flow_run_names import flow_run_name, flow_run_tags, name_this_flow_run
from edgefarm.flows.nightly import MAX_WORKERS
from edgefarm.flows.pipeline import RunReport, toolchain_versions
from edgefarm.flows.plan import Decision, Plan, installing_toolchains, plan_entries
from edgefarm.flows.prefect_env import send_logs_to_prefect
from edgefarm.flows.settings import Settings, code_version
from edgefarm.pages.docs import publish_bringup
from edgefarm.registries import current
from edgefarm.results.db import from_parameter, make_engine
from edgefarm.results.liveness import heartbeat
from edgefarm.results.migrate import prepare_for_run
from edgefarm.results.models import ResultStatus, RunKind, RunStatus
from edgefarm.results.recorder import Recorder
from edgefarm.stages import Stage
from edgefarm.tasks import bringup as rungs
from edgefarm.test_lists.catalog import Catalog, ModelSource
from edgefarm.test_lists.ids import model_name_problem
from edgefarm.test_lists.testlist import TestEntry
from edgefarm.toolchains import base as toolchains
from edgefarm.toolchains.base import ToolchainDriver
from edgellm.config import read_json_object, tokenizer_size_problem
from edgellm.errors import ConfigurationError
from edgellm.reference import checkpoint_digest

DEFAULT_LAYERS = 1
ENGINE_LIMITS = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128}  # as the L0 lists
DEVICE_STAGES = (Stage.EXPORT, Stage.BUILD, Stage.INFER, Stage.ACCURACY, Stage.BENCH)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")


@dataclass(frozen=True)
class Request:
    """A validated bring-up: ``ConfigurationError`` (exit 2) for any bad value, naming it and what is valid."""

    checkpoint: Path
    source: ModelSource  # the catalog's entry, or one made for the directory
    platforms: tuple[str, ...]
    layers: int
    report_dir: Path
    catalog: Catalog
    inventory: Inventory


def resolve(checkpoint: str, platforms: list[str] | None, layers: int, report_dir: str | None, name: str | None,
            settings: Settings) -> Request:
    registries = settings.registries()
    catalog = Catalog.load(registries=registries)
    inventory = load_inventory(settings.inventory_dir, data_dir=settings.data_dir, registries=registries)
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        path = path.resolve()
        if not (path / "config.json").is_file():
            raise ConfigurationError(f"checkpoint {checkpoint!r}: {path} has no config.json (give a Hugging Face "
                                     f"checkpoint directory)")
        source = _source_for(path, name, catalog, settings.data_dir)
    elif checkpoint in catalog:
        if name is not None and name != checkpoint:
            raise ConfigurationError(f"--name {name!r}: a catalog model keeps its name ({checkpoint!r})")
        source = catalog.get(checkpoint)
        path = Path(source.locate(settings.data_dir)).resolve()
    else:
        raise ConfigurationError(f"checkpoint {checkpoint!r}: not a directory and not a catalog model"
                                 f"{did_you_mean(checkpoint, catalog.sources)}; give a checkpoint directory or one "
                                 f"of: {', '.join(sorted(catalog.sources))}")
    _check_files(path, checkpoint)
    chosen = tuple(dict.fromkeys(platforms)) if platforms else tuple(sorted({d.platform for d in inventory}))
    types = settings.registries().device_types
    unknown = [p for p in chosen if p not in types]
    if unknown or not chosen:
        hints = "".join(did_you_mean(p, types) for p in unknown)
        raise ConfigurationError(f"--platforms {', '.join(unknown) or '(none)'}: unknown{hints}; valid: "
                                 f"{', '.join(sorted(types))}")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ConfigurationError(f"--layers {layers!r}: must be an integer >= 1 (decoder layers kept in the "
                                 f"few-layer test)")
    _check_layers(path, layers)
    out = Path(report_dir).expanduser() if report_dir else settings.data_dir / "bringup" / source.name
    if out.exists() and not out.is_dir():
        raise ConfigurationError(f"--report {out}: exists and is not a directory")
    if catalog.sources.get(source.name) is not source:
        catalog = Catalog({**catalog.sources, source.name: source}, catalog.path)
    return Request(path, source, chosen, layers, out, catalog, inventory)


def did_you_mean(value: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a near match of ``value`` among ``valid`` (case-insensitive), else nothing."""
    names = {n.lower(): n for n in valid}
    close = difflib.get_close_matches(value.lower(), list(names), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(repr(names[c]) for c in close)}?)" if close else ""


def _source_for(path: Path, name: str | None, catalog: Catalog, data_dir: Path) -> ModelSource:
    for src in catalog.sources.values():  # a directory the catalog already names keeps its entry
        if src.kind not in ("bundled", "path"):
            continue
        try:
            same = Path(src.locate(data_dir)).resolve() == path
        except ConfigurationError:  # a path entry absent on this host is not this directory
            same = False
        if same:
            if name is not None and name != src.name:
                raise ConfigurationError(f"--name {name!r}: {path} is the catalog's {src.name!r}")
            return src
    chosen = name if name is not None else f"bringup-{path.name}"
    problem = model_name_problem(chosen)  # the rule rung 7's test ids hold it to, checked before any rung
    if not _NAME.match(chosen) or problem is not None:
        given = f"--name {chosen!r}" if name is not None else f"checkpoint directory {path.name!r} (model {chosen!r})"
        raise ConfigurationError(f"{given}: a model name is letters, digits, '.', '_' and '-' (at most 100, starting "
                                 f"with a letter or digit, no empty '-'-separated part); give --name"
                                 + (f" ({problem})" if problem else ""))
    if chosen in catalog:
        raise ConfigurationError(f"--name {chosen!r}: the catalog's model of that name is another checkpoint; give "
                                 f"another --name")
    return ModelSource(chosen, "path", {"path": str(path)})


def _check_files(path: Path, given: str) -> None:
    """The checkpoint's files the ladder reads whole, bounded before any work (a 600 MB tokenizer.json took 2.2 GB)."""
    if (too_large := tokenizer_size_problem(path / "tokenizer.json")) is not None:
        raise ConfigurationError(f"checkpoint {given!r}: {too_large}")


def _check_layers(path: Path, layers: int) -> None:
    """``--layers`` against the checkpoint's decoder layers (its config's ``num_hidden_layers``, or its text
    model's), before any rung is recorded; a config without it is the inventory rung's to report."""
    try:
        config = read_json_object(path / "config.json", what="config.json")
    except ConfigurationError:  # unreadable: the inventory rung reports it, as evidence
        return
    text = config.get("text_config")
    have = config.get("num_hidden_layers", text.get("num_hidden_layers") if isinstance(text, dict) else None)
    if isinstance(have, int) and not isinstance(have, bool) and have >= 1 and layers > have:
        raise ConfigurationError(f"--layers {layers}: the checkpoint has {have} decoder layers; valid: 1..{have}")


def drivers_for(platforms: tuple[str, ...], data_dir: Path) -> list[ToolchainDriver]:
    """Every toolchain a requested platform's device type runs, in the platforms' order of preference."""
    names = dict.fromkeys(t for p in platforms for t in current().device_types[p].toolchains)
    return [toolchains.driver(n, data_dir) for n in names]


def advisers_for(drivers: Iterable[ToolchainDriver], data_dir: Path) -> list[ToolchainDriver]:
    """Every other registered toolchain: rungs 3 and 4 ask those usable on this host as they are (none is installed
    for advice) too, and keep what they would do with the model_type as advice that decides nothing."""
    asked = {d.name for d in drivers}
    return [toolchains.driver(n, data_dir) for n in sorted(toolchains.names()) if n not in asked]


def pipeline_rows(req: Request) -> list[tuple[TestEntry, str]]:
    """Rung 7's rows: per platform its first precision (or the checkpoint's own), the full pipeline where the
    inventory has a device of it, the export alone where it has none."""
    carried = req.source.checkpoint_precision()
    pairs: list[tuple[TestEntry, str]] = []
    for platform in req.platforms:
        kind = current().device_types[platform]
        precision = carried or kind.precisions[0]
        wanted = DEVICE_STAGES if req.inventory.select(platform=platform) else (Stage.EXPORT,)
        entry = TestEntry(list_name="bring-up", model=req.source.name, precision=precision,
                          stages=tuple(str(s) for s in wanted),
                          timeouts={s: stages.spec(s).timeout_s for s in (Stage.QUANTIZE, *DEVICE_STAGES)},
                          source=f"bring-up of {req.checkpoint}", **ENGINE_LIMITS)
        pairs.append((entry, platform))
    return pairs


def pipeline_plan(req: Request, settings: Settings) -> Plan:
    """Rung 7's plan of :func:`pipeline_rows`."""
    pairs = pipeline_rows(req)

    def make() -> Plan:
        return plan_entries("bring-up", RunKind.BRINGUP.value, pairs, req.inventory, req.catalog,
                            data_dir=settings.data_dir)

    return installing_toolchains(make, settings.data_dir, settings.toolchain_wheels())


def judge_pipeline(plan: Plan, report: RunReport) -> rungs.Rung:
    """Passes when a row ran every stage it planned and none failed; rows that cannot run are the report's gaps."""
    rows, failed, gaps, passed, export_only = [], [], [], 0, 0
    for job in plan.jobs:
        row = {"platform": job.platform, "precision": job.precision.value, "toolchain": job.toolchain,
               "decision": job.decision.value, "reason": job.reason, "stages": {}}
        if job.decision is Decision.RUN:
            recorded = report.outcomes.get(job.key, {})
            row["stages"] = {s: {"status": o.status.value, "reason": o.reason, "route": o.route,
                                 "device": o.device, "standin": o.standin,
                                 "metrics": {k: v for k, (v, _unit) in sorted(o.metrics.items())}}
                             for s, o in recorded.items()}
            bad = [f"{job.platform} {job.precision.value} {s}: {o.reason}" for s, o in recorded.items()
                   if o.status in (ResultStatus.FAIL, ResultStatus.ERROR)]
            failed += bad
            if not bad and any(o.standin for o in recorded.values()):  # recorded, never evidence of support
                gaps.append(f"{job.platform} {job.precision.value}: ran on stand-in tools (test only, not evidence)")
            elif not bad and recorded and all(o.status is ResultStatus.PASS for o in recorded.values()):
                passed += 1
                if tuple(recorded) == (str(Stage.EXPORT),):
                    export_only += 1
                    gaps.append(f"{job.platform}: export verified only (no {job.platform} device in the inventory)")
            elif not bad:
                gaps.append(f"{job.platform} {job.precision.value}: not every stage passed "
                            f"({', '.join(f'{s} {o.status.value}' for s, o in recorded.items())})")
        else:
            gaps.append(f"{job.platform} {job.precision.value}: {job.decision.value}: {job.reason}")
        rows.append(row)
    evidence = {"run_id": report.run_id, "rows": rows, "gaps": gaps}
    if failed:
        return rungs.Rung("pipeline", ResultStatus.FAIL, "; ".join(failed), evidence)
    if not passed:
        return rungs.Rung("pipeline", ResultStatus.FAIL, f"no row ran to its end: {'; '.join(gaps)}", evidence)
    said = f"{passed - export_only} row(s) passed every stage"
    if export_only:
        said += f", {export_only} export verified only"
    return rungs.Rung("pipeline", ResultStatus.PASS, f"{said} (run {report.run_id})", evidence)


@task(name="bring-up rung", retries=0, cache_policy=NO_CACHE)
def _rung_task(name: str, body: Callable[[], rungs.Rung]) -> rungs.Rung:
    return rungs.timed(name, body)


def _task(name: str, body: Callable[[], rungs.Rung]) -> rungs.Rung:
    """A host rung as a Prefect task named after it (never retried: a rung's failure is the checkpoint's)."""
    return _rung_task.with_options(name=f"bring-up {name}").submit(name, body).result()


@flow(name="bring-up", task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS), log_prints=False)
def bring_up(checkpoint: str, platforms: list[str] | None = None, layers: int = DEFAULT_LAYERS,
             report_dir: str | None = None, name: str | None = None, db_url: str | None = None,
             data_dir: str | None = None, inventory: str | None = None,
             trigger: str = "deployment") -> State[dict[str, Any]]:
    """Climb the ladder; the flow run's data is the report (``result``: passed | failed, ``exit_code``,
    ``stopped_at``, ``report_dir``), its state Failed naming the rung that stopped the ladder. A deployment's run
    (its parameters set by whoever reaches the API) writes its report only under the data dir's ``bringup/``."""
    send_logs_to_prefect()
    settings = Settings.resolve(db=from_parameter(db_url), data_dir=data_dir, inventory=inventory)
    req = resolve(checkpoint, platforms, layers, report_dir, name, settings)
    if trigger != "cli":
        allowed = (settings.data_dir / "bringup").resolve()
        if not req.report_dir.resolve().is_relative_to(allowed):
            raise ConfigurationError(f"report_dir {report_dir!r}: a deployment writes reports under {allowed} only")
    req.report_dir.mkdir(parents=True, exist_ok=True)
    clear_planted(req.report_dir)
    engine = make_engine(settings.db_url)
    try:
        prepare_for_run(engine)
        recorder = Recorder(engine)
        run_id = recorder.start_run(RunKind.BRINGUP, f"{trigger}: bring-up {req.source.name}", code_version(),
                                    toolchain=toolchain_versions())
        progress = Progress()
        try:
            recorder.set_report(run_id, str(req.report_dir.resolve()))
            name_this_flow_run(flow_run_name(RunKind.BRINGUP.value, req.source.name, run_id),
                               flow_run_tags(RunKind.BRINGUP.value, req.platforms, toolchain_versions()))
            climbed, finished = climb(req, settings, recorder, run_id, progress)
        except BaseException as exc:  # never a run left ``running``: it ends failed (bad input) or error, unpublished
            if not progress.pipeline_ends_run:  # (once the pipeline started, it ends the run, whatever happens)
                bad_input = isinstance(exc, ConfigurationError)
                recorder.finish_run(run_id, RunStatus.FAILED if bad_input else RunStatus.ERROR, publish=False)
            raise
        if not finished:  # stopped before the pipeline ran: the run ends here, with nothing to publish
            recorder.finish_run(run_id, RunStatus.FAILED, publish=False)
    finally:
        engine.dispose()
    fit = memory_fit(pipeline_rows(req), req.source, planned_toolchains(climbed))
    report = write_report(req, climbed, run_id, settings.docs_dir / "runs" / f"run-{run_id}.md", fit)
    publish_bringup(settings.db_url, settings.docs_dir, run_id, settings.data_dir)  # its own run page only
    stopped = report.get("stopped_at")
    if stopped:
        return Failed(message=f"run {run_id}: stopped at rung {stopped['rung']} ({stopped['name']}): "
                              f"{stopped['reason']}"[:2000], data=report)
    return Completed(message=f"run {run_id}: every rung passed: {req.source.name} on {', '.join(req.platforms)}",
                     data=report)


@dataclass
class Progress:
    """How far a climb got: whether the pipeline (rung 7) started, and so ends the run itself (``execute_plan``
    finishes its run however it ends)."""

    pipeline_ends_run: bool = False


def climb(req: Request, settings: Settings, recorder: Recorder, run_id: int,
          progress: Progress | None = None) -> tuple[list[rungs.Rung], bool]:
    """Every rung in order until one stops the ladder (the rest are recorded as skipped); whether rung 7 ran (its
    run was finished by the pipeline; ``progress`` says so from the moment the pipeline starts)."""
    progress = progress if progress is not None else Progress()
    ckpt, out = req.checkpoint, req.report_dir
    sha = checkpoint_digest(ckpt)
    quant = req.source.quantization()
    quantized = f"{quant.method.value}, {quant.source}" if quant is not None and quant.is_quantized else None
    drivers = drivers_for(req.platforms, settings.data_dir)
    advisers = advisers_for(drivers, settings.data_dir)
    steps: dict[str, Callable[[], rungs.Rung]] = {
        "inventory": lambda: rungs.inventory(ckpt, out),
        "closest_family": lambda: rungs.closest_family(ckpt, out),
        "registry": lambda: rungs.registry(ckpt, drivers, out, advisers),
        "reconciliation": lambda: rungs.reconciliation(ckpt, drivers, out, advisers),
        "reference": lambda: rungs.reference(ckpt, req.layers, out, quantized),
        "few_layers": lambda: rungs.few_layers(ckpt, req.layers, drivers, out, quantized),
    }
    climbed: list[rungs.Rung] = []
    finished = False
    with heartbeat(recorder, run_id):
        for position, rung_name in enumerate(rungs.RUNGS, start=1):
            if any(r.stops for r in climbed):
                rung = rungs.Rung(rung_name, ResultStatus.SKIPPED, f"not climbed: {_stopped(climbed)} did not pass")
            elif rung_name == "pipeline":
                rung, finished = _pipeline(req, settings, run_id, progress)
            else:
                rung = _task(rung_name, steps[rung_name])
            recorder.record_rung(run_id, position, rung_name, rung.status, reason=rung.reason,
                                 evidence=json.loads(json.dumps(rung.evidence, default=str)),
                                 duration_s=round(rung.duration_s, 3), checkpoint_sha256=sha)
            climbed.append(rung)
    return climbed, finished


def _pipeline(req: Request, settings: Settings, run_id: int, progress: Progress) -> tuple[rungs.Rung, bool]:
    """Rung 7 and whether its run was finished (by the pipeline; not when the rows could not be planned)."""
    try:
        plan = pipeline_plan(req, settings)
    except ConfigurationError as exc:  # the plan refused the rows: the rung fails with the reason
        return rungs.Rung("pipeline", ResultStatus.FAIL, f"the rows could not be planned: {exc}"), False
    t0 = time.perf_counter()
    progress.pipeline_ends_run = True
    report, _timing = execute_plan(plan, settings, trigger=f"bring-up {req.source.name}", run_id=run_id)
    rung = judge_pipeline(plan, report)
    rung.duration_s = time.perf_counter() - t0
    return rung, True


def _stopped(climbed: list[rungs.Rung]) -> str:
    first = next(r for r in climbed if r.stops)
    return f"rung {rungs.RUNGS.index(first.name) + 1} ({first.name})"

