"""run_test_list: run one priority list (e.g. l0_pipeline_x86cpu) on the devices its platform selector matches."""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from devices.inventory import load_inventory
from flows.execute import execute_plan
from flows.nightly import MAX_WORKERS, summary
from flows.plan import Plan, installing_toolchains, plan_test_list
from flows.settings import Settings
from results.db import from_parameter
from test_lists.catalog import Catalog
from test_lists.loader import load_list


def make_plan(priority: str, settings: Settings, *, install: bool = False) -> Plan:
    """The list's plan; ``install``: first install the pinned toolchains it needs and lacks (not for a dry run)."""
    catalog = Catalog.load()
    tlist, inventory = load_list(priority), load_inventory(settings.inventory_dir, data_dir=settings.data_dir)

    def make() -> Plan:
        return plan_test_list(tlist, inventory, catalog, data_dir=settings.data_dir)

    return installing_toolchains(make, settings.data_dir) if install else make()


@flow(name="run-test-list", task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS), log_prints=False)
def run_test_list(priority: str, db_url: str | None = None, data_dir: str | None = None,
                  inventory: str | None = None, trigger: str = "deployment",
                  plan: Plan | None = None) -> dict[str, Any]:
    """Run the list's tests for every platform it selects that has devices; record everything (with the plan
    the caller already made, if any)."""
    settings = Settings.resolve(db=from_parameter(db_url), data_dir=data_dir, inventory=inventory)
    if plan is None:
        plan = make_plan(priority, settings, install=True)
    report, timing = execute_plan(plan, settings, trigger=trigger)
    return summary(plan, report, timing, None)
