"""Throwaway stages for a test: registered in the stage table with their work (``tasks.stage_work``), then removed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from edgefarm import stages
from edgefarm.stages import StageSpec
from edgefarm.tasks import stage_work


@contextmanager
def throwaway(specs: Sequence[tuple[StageSpec, stage_work.Work]]) -> Iterator[list[str]]:
    """Register each (spec, work) in order; yield their names; unregister them in reverse order."""
    for spec, runs in specs:
        stages.register(spec)
        stage_work.register(spec.name, stage_work.StageWork(runs))
    try:
        yield [s.name for s, _ in specs]
    finally:
        for spec, _ in reversed(specs):
            stage_work.unregister(spec.name)
            stages.unregister(spec.name)
