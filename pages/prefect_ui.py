"""Where a person watches a flow run: the Prefect server runs are reported to (``PREFECT_API_URL``: ``edgefarm serve``
or a production server; none when a command starts its own temporary one) and its UI's page of a flow run. The run
pages link it and the commands print it (``cli.running``); Prefect's own settings are ``flows.prefect_env``'s."""

from __future__ import annotations

import os


def reporting_server() -> str | None:
    """The API URL of the server runs are reported to, or None when a command starts its own temporary one."""
    return os.environ.get("PREFECT_API_URL") or None


def flow_run_ui_url(flow_run_id: object) -> str | None:
    """Where a person watches a flow run in the UI of the reporting server (None without one)."""
    api = reporting_server()
    if api is None:
        return None
    ui = os.environ.get("PREFECT_UI_URL") or api.rstrip("/").removesuffix("/api")
    return f"{ui}/runs/flow-run/{flow_run_id}"
