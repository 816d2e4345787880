"""Prefect settings for the farm: offline, quiet, state under the project's data dir.

Must run before ``import prefect`` (Prefect reads its settings at import). With no ``PREFECT_API_URL`` a flow run
starts a temporary local server, without UI (it lives for one command); with one (``edgefarm serve``, whose server
serves the UI, or a production server) runs are reported there and the commands print each flow run's URL.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from pathlib import Path

# The farm's own loggers (the farm, installed as edgefarm.*, and the edgellm library it drives): their INFO records
# reach the flow run's logs in Prefect.
FARM_LOGGERS = ("edgefarm", "edgellm")
QUIET_OFFLINE = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # runs' logs at INFO go to the server (the UI's Logs tab); the console shows warnings only
    "PREFECT_LOGGING_LEVEL": "INFO",
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "PREFECT_LOGGING_EXTRA_LOGGERS": ",".join(FARM_LOGGERS),
    "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",  # records outside a run stay on the console only
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    "PREFECT_UI_ENABLED": "false",
    "PREFECT_CLI_COLORS": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
}


def configure_prefect(data_dir: Path, *, create: bool = True) -> dict[str, str]:
    """Set Prefect's environment (user-set values win) and return what it uses; ``create``: make its home under the
    data dir (not for a command that only reads, like a dry run: it gets a scratch home in the temp dir when the data
    dir has none, since importing Prefect makes one)."""
    home = Path(data_dir).resolve() / "prefect"
    if not create and not home.is_dir():  # Prefect makes its home when imported: a scratch one, outside the data dir
        home = Path(tempfile.gettempdir()) / f"edgefarm-prefect-{os.getuid()}"
        home.mkdir(mode=0o700, exist_ok=True)
        if home.is_symlink() or home.stat().st_uid != os.getuid():  # another user's: never ours to use
            home = Path(tempfile.mkdtemp(prefix="edgefarm-prefect-"))
    os.environ.setdefault("PREFECT_HOME", str(home))
    for key, value in QUIET_OFFLINE.items():
        os.environ.setdefault(key, value)
    if create:
        Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
    return {k: os.environ[k] for k in ("PREFECT_HOME", *QUIET_OFFLINE)}


def send_logs_to_prefect() -> None:
    """The farm's loggers at INFO, each with Prefect's API handler (records inside a flow or task run reach its
    logs; others are dropped by the handler: PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW). Idempotent; called when a
    flow of the farm starts, so a run started by a Prefect worker (whose environment may lack
    PREFECT_LOGGING_EXTRA_LOGGERS) sends its logs too."""
    from prefect.logging.handlers import APILogHandler

    for name in FARM_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
        if not any(isinstance(h, APILogHandler) for h in logger.handlers):
            handler = APILogHandler()
            handler.addFilter(_in_a_run)
            logger.addHandler(handler)


def _in_a_run(record: logging.LogRecord) -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return bool(getattr(record, "flow_run_id", None) or FlowRunContext.get() or TaskRunContext.get())


def free_port() -> int:
    """A free TCP port on the loopback (for a temporary Prefect server)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
