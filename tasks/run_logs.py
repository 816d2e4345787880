"""A stage's own logs in its Prefect task run's logs: the command the tool ran and the tail of what it printed (the
whole log stays in the artifact store: ``edgefarm show log:<id>`` prints it), URL credentials hidden."""

from __future__ import annotations

import logging

from edgefarm.artifacts.location import redact_url
from edgefarm.artifacts.store import ArtifactKind
from edgefarm.stages.outcome import StageOutcome
from edgefarm.tasks.farm import Farm, FarmContext
from edgellm.errors import EdgeLLMError

log = logging.getLogger(__name__)

TAIL_LINES = 40
TAIL_CHARS = 6000


def tail(text: str, lines: int = TAIL_LINES, chars: int = TAIL_CHARS) -> tuple[str, int]:
    """The log's first line (the command, as the farm writes it) and its last ``lines`` lines (at most ``chars``
    characters), and how many lines it has."""
    all_lines = text.splitlines()
    kept = all_lines[-lines:]
    head = all_lines[:1] if all_lines and all_lines[0].startswith("$ ") and len(all_lines) > lines else []
    body = "\n".join(kept)
    if len(body) > chars:
        body = "…" + body[-chars:]
    return "\n".join([*head, *(["…"] if head else []), body]), len(all_lines)


def log_tails(ctx: FarmContext, outcome: StageOutcome) -> None:
    """Log the tail of each log the stage made (not a reused product's: it made none) to the current run's
    logger; a log the store cannot give back is said, never fatal."""
    if outcome.cached:
        return
    logs = [a for a in outcome.artifacts if a.kind == ArtifactKind.LOG]
    if not logs:
        return
    store = Farm.get(ctx).store
    for ref in logs:
        try:
            text = store.read_bytes(ref.sha256).decode("utf-8", errors="replace")
        except (EdgeLLMError, OSError) as exc:
            log.warning("%s: its log log:%s could not be read back: %s", outcome.stage, ref.sha256[:12], exc)
            continue
        shown, count = tail(text)
        log.info("%s %s, log log:%s (%d lines; edgefarm show log:%s prints it all):\n%s", outcome.stage,
                 outcome.status.value, ref.sha256[:12], count, ref.sha256[:12], redact_url(shown))
