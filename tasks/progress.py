"""In-process progress events (a stage started; a job's stage ended) for the command line's live table and progress
lines. Listeners must be quick."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StageEvent:
    job: str  # test id @ platform
    stage: str
    status: str  # "start", or the ended stage's ResultStatus value
    device: str | None
    cached: bool
    name: str = ""  # the stage's task run name: "<stage> <model> <precision> @<platform>" (tasks.states)
    duration_s: float = 0.0
    reason: str | None = None


_listeners: list[Callable[[StageEvent], None]] = []
_lock = threading.Lock()


def subscribe(listener: Callable[[StageEvent], None]) -> Callable[[], None]:
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def emit(event: StageEvent) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(event)
