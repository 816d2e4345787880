"""``edgefarm nightly | run | docs | serve | gc``: what release and QA engineers type every day (``query``:
cli/query.py; running a plan: cli/running.py).

Exit codes: 0 all passed, 1 some failed, 2 bad input (every problem listed), 3 infrastructure failure, 5 nothing ran.
Prefect is imported only inside the commands that run flows, after its settings point at the data dir.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from edgefarm.cli.common import DataDirOption, DbOption, InventoryOption, configure_prefect, err, farm_errors, out
from edgefarm.cli.listing import check_file_option
from edgefarm.cli.running import (
    DryRunOption,
    JsonAliasOption,
    JunitOption,
    PlanFormatOption,
    _finish,
    _plan_and_run,
    _plan_format,
)


def nightly(
    matrix: Annotated[Path | None, typer.Option("--matrix", help="matrix file (default: flows/matrices/"
                                                                 "nightly.yml)", dir_okay=False)] = None,
    dry_run: DryRunOption = False,
    db: DbOption = None,
    data_dir: DataDirOption = None,
    inventory: InventoryOption = None,
    docs_dir: Annotated[Path | None, typer.Option("--docs-dir", help="where docs are written (default: "
                                                                     "<data dir>/docs)", file_okay=False)] = None,
    json_out: JsonAliasOption = False,
    fmt: PlanFormatOption = "text",
    junit: JunitOption = None,
    keyword: Annotated[str | None, typer.Option("-k", help="only the jobs whose row (model precision @platform, "
                                                          "test id, toolchain) matches: words with and / or / not, "
                                                          "like pytest -k")] = None,
) -> None:
    """Run the nightly support matrix (models x precisions x platforms) and publish the docs."""
    with farm_errors("nightly"):
        fmt = _plan_format(fmt)
        check_file_option("--junit", junit)
        from edgefarm.flows.plan import default_matrix
        from edgefarm.flows.select import subset
        from edgefarm.flows.settings import Settings

        settings = Settings.resolve(db=db, data_dir=data_dir, inventory=inventory, docs_dir=docs_dir,
                                    create=not dry_run)  # a dry run touches nothing, the data dir included
        configure_prefect(settings.data_dir, create=not dry_run)
        from edgefarm.flows.nightly import make_plan, nightly_support_matrix

        matrix_path = matrix or default_matrix(settings.registries())
        result = _plan_and_run(settings, lambda install: subset(make_plan(matrix_path, settings, install=install),
                                                                keyword),
                               nightly_support_matrix, dry_run=dry_run, fmt=fmt, matrix=str(matrix_path),
                               docs_dir=str(settings.docs_dir), console=err if json_out or fmt == "json" else out)
    if result is not None:
        _finish(result, json_out=json_out or fmt == "json", matrix_of=settings.db_url, junit=junit,
                suite="nightly")


def run(
    priority: Annotated[str, typer.Option("--priority", help="test list name, e.g. l0_pipeline_x86cpu")],
    dry_run: DryRunOption = False,
    db: DbOption = None,
    data_dir: DataDirOption = None,
    inventory: InventoryOption = None,
    json_out: JsonAliasOption = False,
    fmt: PlanFormatOption = "text",
    junit: JunitOption = None,
) -> None:
    """Run one priority list on the devices its platform selector matches."""
    with farm_errors("run"):
        fmt = _plan_format(fmt)
        check_file_option("--junit", junit)
        from edgefarm.flows.settings import Settings

        settings = Settings.resolve(db=db, data_dir=data_dir, inventory=inventory, create=not dry_run)
        configure_prefect(settings.data_dir, create=not dry_run)
        from edgefarm.flows.test_list import make_plan, run_test_list

        result = _plan_and_run(settings, lambda install: make_plan(priority, settings, install=install),
                               run_test_list, dry_run=dry_run, fmt=fmt, priority=priority,
                               console=err if json_out or fmt == "json" else out)
    if result is not None:
        _finish(result, json_out=json_out or fmt == "json", junit=junit, suite=priority)


# a row is (model, precision, platform, job_toolchain: the toolchain its jobs ran with); toolchain and
# toolchain_version name what made its evidence (the last stage that ran)


def docs(
    out_dir: Annotated[Path | None, typer.Option("--out", help="output directory (default: $EDGEFARM_DOCS_DIR, "
                                                              "else <data dir>/docs)", file_okay=False)] = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Regenerate supported-models.md, the HTML support matrix and the perf trends from the database."""
    with farm_errors("docs"):
        from edgefarm.flows.settings import Settings
        from edgefarm.pages.docs import write_docs

        settings = Settings.resolve(db=db, data_dir=data_dir, docs_dir=out_dir, create=False)
        result = write_docs(settings.existing_db_url(), settings.docs_dir, settings.data_dir)
    out.print(f"wrote {result['out_dir']}/supported-models.md, support-matrix.html, runs/ and "
              f"{len(result['trend_images'])} trend plot(s): {result['supported']} supported of {result['rows']} rows",
              markup=False)


def _announce_ui(url: str) -> None:
    out.print(f"Prefect UI: {url} (deployments, schedules, runs, logs); stop with Ctrl-C", markup=False)


def serve(
    port: Annotated[int, typer.Option("--port", help="Prefect server port on 127.0.0.1")] = 4200,
    data_dir: DataDirOption = None,
    deployment: Annotated[list[str] | None, typer.Option("--deployment", help="deployments of infra/prefect.yaml "
                                                                              "to serve (default: nightly, "
                                                                              "l0-x86-cpu)")] = None,
) -> None:
    """A local Prefect server with its UI plus a runner serving the nightly schedule (02:00) and the L0 deployment."""
    with farm_errors("serve"):
        from edgefarm.flows.settings import Settings

        settings = Settings.resolve(data_dir=data_dir)
        configure_prefect(settings.data_dir)
        from edgefarm.flows.serve import serve as run_serve

        raise typer.Exit(run_serve("127.0.0.1", port, settings.data_dir, deployment, announce=_announce_ui,
                                   auth=settings.serve_auth))


MAX_GC_AGE_DAYS = 36500  # a century: anything larger is a typo, and would overflow to an infinite age


def gc(
    older_than_days: Annotated[float, typer.Option("--older-than-days", help="only blobs last stored before this "
                                                                            "many days ago")] = 14.0,
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Remove artifacts no result and no cache entry refers to (never referenced or recent ones)."""
    with farm_errors("gc"):
        from edgefarm.flows.settings import Settings
        from edgefarm.results import cache
        from edgefarm.results.db import read_only_engine, redact
        from edgefarm.results.migrate import require_current
        from edgefarm.results.recorder import Recorder
        from edgefarm.tasks.host import sweep_dead_work
        from edgefarm.toolchains import base as toolchains
        from edgellm.errors import ConfigurationError

        if not (math.isfinite(older_than_days) and 0 <= older_than_days <= MAX_GC_AGE_DAYS):
            raise ConfigurationError(f"bad --older-than-days {older_than_days!r}: need a number of days from 0 to "
                                     f"{MAX_GC_AGE_DAYS} (0: every unreferenced blob; not nan, inf or negative)")
        settings = Settings.resolve(db=db, data_dir=data_dir)
        engine = read_only_engine(settings.db_url)
        referenced: set[str] = set()

        def read_references() -> set[str]:  # read by the store once puts are held off
            referenced.update(Recorder(engine).referenced_artifacts() | cache.referenced(engine))
            return referenced

        store = settings.artifact_store()
        try:
            require_current(engine, redact(settings.db_url))
            removed = store.gc(read_references, older_than_days * 86400)
        finally:
            engine.dispose()
            store.close()
        dead = sweep_dead_work(settings.data_dir)  # left by killed runs, whatever their age
        installs = [p for name in toolchains.names()
                    for p in toolchains.driver(name, settings.data_dir).environment.sweep_dead_installs()]
    out.print(f"removed {len(removed)} unreferenced blob(s) older than {older_than_days:g} day(s); "
              f"{len(referenced)} referenced blob(s) kept; {len(dead)} scratch dir(s) of dead runs removed; "
              f"{len(installs)} leftover(s) of killed toolchain installs removed", markup=False)
