"""Prefect settings for the farm: offline, quiet, state under the project's data dir.

Must run before ``import prefect`` (Prefect reads its settings at import). With no ``PREFECT_API_URL`` a flow run
starts a temporary local server; with one (``edgefarm serve``, or a production server) runs are reported there.
"""

from __future__ import annotations

import os
from pathlib import Path

QUIET_OFFLINE = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    "PREFECT_UI_ENABLED": "false",
    "PREFECT_CLI_COLORS": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
}


def configure_prefect(data_dir: Path) -> dict[str, str]:
    """Set Prefect's environment (user-set values win) and return what it uses."""
    os.environ.setdefault("PREFECT_HOME", str(Path(data_dir).resolve() / "prefect"))
    for key, value in QUIET_OFFLINE.items():
        os.environ.setdefault(key, value)
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    return {k: os.environ[k] for k in ("PREFECT_HOME", *QUIET_OFFLINE)}
