"""nightly_support_matrix: prove the whole support matrix, then publish the docs from the evidence."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import State
from prefect.task_runners import ThreadPoolTaskRunner

from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.execute import execute_plan
from edgefarm.flows.plan import DEFAULT_MATRIX, Decision, Plan, installing_toolchains, plan_matrix
from edgefarm.flows.prefect_env import send_logs_to_prefect
from edgefarm.flows.revision import deployment_trigger
from edgefarm.flows.run_state import flow_state, nothing_ran
from edgefarm.flows.settings import Settings
from edgefarm.pages.docs import publish_matrix_artifacts, write_docs
from edgefarm.results.db import from_parameter
from edgefarm.tasks.states import failures, row_name
from edgefarm.test_lists.catalog import Catalog

log = logging.getLogger(__name__)
# The task runner's threads are made as tasks need them; flows.pipeline.Scheduler submits a task only once its inputs
# are there and bounds how many run at once per platform (its device slots) and on the host (its slots), so this is
# only a ceiling: a lab of 1,000 single-slot devices uses about 1,500 threads that wait on their devices.
MAX_WORKERS = 4096


def make_plan(matrix: str | Path, settings: Settings, *, install: bool = False) -> Plan:
    """The matrix's plan; ``install``: first install the pinned toolchains it needs and lacks (not for a dry run)."""
    registries = settings.registries()
    catalog = Catalog.load(registries=registries)
    inventory = load_inventory(settings.inventory_dir, data_dir=settings.data_dir, registries=registries)

    def make() -> Plan:
        return plan_matrix(Path(matrix), inventory, catalog, data_dir=settings.data_dir)

    return installing_toolchains(make, settings.data_dir, settings.toolchain_wheels()) if install else make()


@flow(name="nightly-support-matrix", task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS), log_prints=False)
def nightly_support_matrix(matrix: str = str(DEFAULT_MATRIX), db_url: str | None = None,
                           data_dir: str | None = None, inventory: str | None = None,
                           docs_dir: str | None = None, trigger: str | None = None,
                           publish: bool = True, plan: Plan | None = None) -> State[dict[str, Any]]:
    """Plan the matrix (every problem reported at once), run it across the devices, publish the docs. A caller
    that already planned (the CLI, which printed the plan) hands it over: the matrix is planned once. The flow run
    ends Failed when a row failed or nothing ran (``flows.run_state``); its data is the run's summary."""
    send_logs_to_prefect()
    settings = Settings.resolve(db=from_parameter(db_url), data_dir=data_dir, inventory=inventory,
                                docs_dir=docs_dir)
    if plan is None:
        plan = make_plan(matrix, settings, install=True)
    report, timing = execute_plan(plan, settings, trigger=trigger or deployment_trigger())
    docs = None
    if publish:
        docs = write_docs(settings.db_url, settings.docs_dir, settings.data_dir)
        publish_matrix_artifacts(settings.db_url, settings.data_dir)
    return flow_state(summary(plan, report, timing, docs))


def summary(plan: Plan, report: Any, timing: dict[str, float], docs: dict[str, Any] | None) -> dict[str, Any]:
    """What a run ended with (the flow run's data, the command line's summary): counts, every failing row with its
    root cause (``failures``), and whether anything ran at all, with why not (``why_nothing_ran``)."""
    rows = {j.key: row_name(j.model, j.precision.value, j.entry.variant, [j.platform]) for j in plan.jobs}
    idle = nothing_ran(report.outcomes)
    return {
        "run_id": report.run_id,
        "plan": plan.counts(),
        "stages": report.stage_counts(),
        "cache_hits": report.cache_hits(),
        "failed": report.failed,
        "failures": failures(report.outcomes, rows),
        "results": stage_results(report.outcomes, rows),
        "nothing_ran": idle,
        "why_nothing_ran": why_nothing_ran(plan, report.outcomes) if idle else [],
        "timing": timing if not idle else {},
        "transfers": report.transfers,
        "docs": docs,
    }


def stage_results(outcomes: Any, rows: dict[str, str]) -> list[dict[str, Any]]:
    """Every recorded stage of every row, in the pipeline's order (a CI report's test cases: ``--junit``)."""
    return [{"row": rows.get(key, key), "job": key, "stage": str(stage), "status": o.status.value,
             "duration_s": round(o.duration_s, 3), "reason": o.reason or "", "device": o.device}
            for key in sorted(outcomes) for stage, o in outcomes[key].items()]


def why_nothing_ran(plan: Plan, outcomes: Any) -> list[str]:
    """The distinct reasons no stage ran, most frequent first, each with how many jobs it kept from running: the
    plan's decisions (no device for the platform, waived, not applicable...) and, for jobs that were run, the reason
    their first stage gave (skipped: a toolchain missing...)."""
    why: Counter[str] = Counter()
    for job in plan.jobs:
        if job.decision is Decision.RUN:
            recorded = outcomes.get(job.key) or {}
            first = next(iter(recorded.values()), None)
            why[f"{job.platform}: {(first.reason if first is not None else None) or 'no stage recorded'}"] += 1
        else:
            why[f"{job.platform}: {job.decision.value}: {job.reason or 'no reason given'}"] += 1
    if not why:
        return [f"the plan {plan.name} has no job (no test selects a platform with devices)"]
    return [f"{reason} ({n} job{'s' if n != 1 else ''})" for reason, n in why.most_common()]
