"""The code a process of the farm runs, and who it is: one code revision per run.

Every worker runs flows from its own checkout or image (``EDGEFARM_HOME``), so two workers of one run could run
different code. A run records its orchestrator's revision and that of every worker a stage is sent to
(``results.models.RunWorker``); a worker whose source differs from the run's refuses the stage with both revisions
named, and the stage fails as a configuration error (never retried). What must match is the digest of the farm's
source files (:func:`source_digest`), not the git commit: a worker built from an image has no ``.git``, and two
checkouts of one commit with the same local edit run the same code.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

from edgellm.errors import ConfigurationError

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent
# the farm's code and the data it plans from (catalog, test lists, matrices, device types): what a stage's work
# depends on. Tests, docs and benchmarks are not part of it.
SOURCE_PACKAGES = ("artifacts", "cli", "devices", "edgellm", "flows", "pages", "registries", "results", "stages",
                   "tasks", "test_lists", "toolchains", "vocabulary")
SOURCE_SUFFIXES = (".py", ".yml", ".yaml", ".json", ".txt", ".sql", ".ini", ".mako")


@dataclass(frozen=True)
class Revision:
    git: str  # the git commit of the checkout (with -dirty), or edgellm-<version> without .git
    source: str  # sha256 of the source files (what must match)

    def describe(self) -> str:
        return f"{self.git} (source {self.source[:12]})"


def source_digest(root: Path = ROOT) -> str:
    """sha256 over the farm's source files: each file's path relative to the root and its content's sha256, in
    path order. Bytes only: the same files give the same digest on any host."""
    lines = []
    for package in SOURCE_PACKAGES:
        base = root / package
        for path in sorted(base.rglob("*")):
            if not path.is_file() or path.suffix not in SOURCE_SUFFIXES or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root).as_posix()
            lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {rel}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@functools.cache
def current() -> Revision:
    """This process's revision (computed once: the code does not change under a running process)."""
    from edgefarm.flows.settings import code_version

    return Revision(git=code_version(), source=source_digest(ROOT))


def require_same(expected_source: str, expected_git: str, *, what: str) -> None:
    """Refuse ``what`` unless this process runs the source the run runs (both revisions named)."""
    here = current()
    if here.source != expected_source:
        raise ConfigurationError(
            f"{what}: this worker ({host_name()}) runs revision {here.describe()}, the run runs {expected_git} "
            f"(source {expected_source[:12]}); refused: one code revision per run. Update this worker's checkout "
            f"(EDGEFARM_HOME) to the run's revision, or run the stage where it matches")


def host_name() -> str:
    return socket.gethostname()[:200] or "unknown-host"


def worker_pool() -> str | None:
    """The work pool of the deployment this flow run came from (None outside a deployment run, or when the
    server cannot say: the record is informative, the run goes on)."""
    from prefect.runtime import deployment

    deployment_id = deployment.id
    if not deployment_id:
        return None
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            return client.read_deployment(deployment_id).work_pool_name
    except Exception as exc:
        log.warning("could not read the work pool of deployment %s: %s", deployment_id, exc)
        return None


def deployment_trigger() -> str:
    """How this flow run was started, for the run's record: ``schedule`` (the deployment's cron), ``deployment``
    (``prefect deployment run``, the UI, the API) or ``flow`` (called without a deployment)."""
    from prefect.runtime import deployment, flow_run

    if not deployment.id or not flow_run.id:
        return "flow"
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as client:
            return "schedule" if client.read_flow_run(flow_run.id).auto_scheduled else "deployment"
    except Exception as exc:
        log.warning("could not read how flow run %s was started: %s", flow_run.id, exc)
        return "deployment"
