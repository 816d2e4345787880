"""run_test_list: run one priority list (e.g. l0_pipeline_x86cpu) on the devices its platform selector matches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.states import State
from prefect.task_runners import ThreadPoolTaskRunner

from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.execute import execute_plan
from edgefarm.flows.nightly import MAX_WORKERS, summary
from edgefarm.flows.plan import Plan, installing_toolchains, plan_test_list
from edgefarm.flows.prefect_env import send_logs_to_prefect
from edgefarm.flows.run_state import flow_state
from edgefarm.flows.settings import Settings
from edgefarm.pages.docs import publish_test_list
from edgefarm.results.db import from_parameter
from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.loader import LISTS_DIR, list_names, load_list
from edgellm.errors import ConfigurationError


def list_name(priority: str) -> str:
    """The test list a deployment's priority names: a list of the test-list directory by name
    (``l0_pipeline_x86cpu``) or by its path there. Any other file is refused: deployment parameters are set by
    whoever reaches the API, and a list decides what runs where (``edgefarm run --priority FILE``, typed by a person
    at the farm's terminal, may still name a list file elsewhere)."""
    names = list_names()
    text = str(priority)
    if text in names:
        return text
    path = Path(text)
    if path.suffix in (".yml", ".yaml") and path.resolve().parent == LISTS_DIR.resolve() and path.stem in names:
        return path.stem
    raise ConfigurationError(f"priority {text!r} is not a test list of {LISTS_DIR}; valid: {', '.join(names)} "
                             f"(a name, or its file there)")


def make_plan(priority: str, settings: Settings, *, install: bool = False) -> Plan:
    """The list's plan; ``install``: first install the pinned toolchains it needs and lacks (not for a dry run)."""
    registries = settings.registries()
    catalog = Catalog.load(registries=registries)
    tlist = load_list(priority, registries=registries)
    inventory = load_inventory(settings.inventory_dir, data_dir=settings.data_dir, registries=registries)

    def make() -> Plan:
        return plan_test_list(tlist, inventory, catalog, data_dir=settings.data_dir)

    return installing_toolchains(make, settings.data_dir, settings.toolchain_wheels()) if install else make()


@flow(name="run-test-list", task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS), log_prints=False)
def run_test_list(priority: str, db_url: str | None = None, data_dir: str | None = None,
                  inventory: str | None = None, trigger: str = "deployment",
                  plan: Plan | None = None) -> State[dict[str, Any]]:
    """Run the list's tests for every platform it selects that has devices; record everything (with the plan
    the caller already made, if any). The flow run ends Failed when a row failed or nothing ran
    (``flows.run_state``); its data is the run's summary."""
    send_logs_to_prefect()
    settings = Settings.resolve(db=from_parameter(db_url), data_dir=data_dir, inventory=inventory)
    if plan is None:  # a deployment's run: its priority is a parameter anyone reaching the API may have set
        plan = make_plan(list_name(priority), settings, install=True)
    report, timing = execute_plan(plan, settings, trigger=trigger)
    publish_test_list(settings.db_url, settings.docs_dir, plan.name, report.run_id, settings.data_dir)  # its own page
    return flow_state(summary(plan, report, timing, None))
