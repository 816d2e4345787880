"""In-process progress events (stage finished) for the CLI's live display. Listeners must be quick."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StageEvent:
    job: str  # test id @ platform
    stage: str
    status: str
    device: str | None
    cached: bool


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
