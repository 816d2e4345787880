"""What a Prefect flow run of the farm is called (issue 41: runs matched at a glance): ``nightly-<run id>``,
``<list>-<run id>``, ``bring-up-<model>-<run id>``, tagged with the run kind, its platforms and the toolchain
versions it ran with; the farm run's number leads its final state's message (``flows.run_state``). Decided here once,
applied to the flow run in progress through Prefect's API (best effort: a run is never failed for its name)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

log = logging.getLogger(__name__)
TAG_CHARS = 100


def flow_run_name(kind: str, plan_name: str, run_id: int) -> str:
    """``nightly-<run id>`` for the nightly (whatever its matrix file), ``<list>-<run id>`` for a test list,
    ``bring-up-<model>-<run id>`` for a bring-up (``plan_name``: its model)."""
    if kind == "nightly":
        return f"nightly-{run_id}"
    if kind == "bringup":
        return f"bring-up-{plan_name}-{run_id}"
    return f"{plan_name}-{run_id}"


def flow_run_tags(kind: str, platforms: Iterable[str], toolchains: Mapping[str, str]) -> list[str]:
    """``kind:<kind>``, ``platform:<name>`` per platform, ``<toolchain>:<version>`` per toolchain, sorted."""
    tags = {f"kind:{kind}", *(f"platform:{p}" for p in platforms),
            *(f"{name}:{version}" for name, version in toolchains.items())}
    return sorted(t[:TAG_CHARS] for t in tags)


def name_this_flow_run(name: str, tags: Iterable[str]) -> str | None:
    """Rename the flow run in progress and add ``tags``; its id (None outside a flow run, or when the API refused)."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return None
    from prefect.client.orchestration import get_client

    flow_run = ctx.flow_run
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, name=name, tags=sorted({*(flow_run.tags or ()), *tags}))
    except Exception as exc:  # the name is a convenience: a run goes on under Prefect's own name
        log.warning("flow run %s not renamed %s: %s", flow_run.id, name, str(exc).splitlines()[0] if str(exc) else exc)
        return str(flow_run.id)
    flow_run.name = name
    return str(flow_run.id)


def current_flow_run_id() -> str | None:
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return None if ctx is None or ctx.flow_run is None else str(ctx.flow_run.id)
