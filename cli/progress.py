"""A run's progress for a person (issue 41: readable at 80 columns): a live table on a terminal, one plain line per
stage start and end otherwise. Rows are named as people read them (``<model> <precision> @<platform>``, plus the
toolchain where two toolchains run the same row), never cut; every cell has one marker: pending, running, a status,
or "not run here" (a stage the row does not list); the title names the plan (the nightly's matrix, the test list);
the caption and each line carry the elapsed time and the counts."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from edgefarm.cli.text import cell, visible

# one marker per status, in the live table and in the plain lines alike: (word for lines, glyph for cells, style)
SYMBOL: dict[str, tuple[str, str, str]] = {
    "pass": ("pass", "✓", "green"), "fail": ("FAIL", "✗", "red"), "error": ("ERROR", "!", "yellow"),
    "skipped": ("skip", "~", "dim"), "waived": ("waived", "w", "magenta"), "not_applicable": ("n/a", "n/a", "dim"),
    "start": ("start", "▶", "cyan")}
PENDING = ("·", "dim")
RUNNING = ("▶", "cyan")
NOT_HERE = (" ", "")  # a stage the row does not list: nothing will ever run there
REUSED = ("↺", "cyan")  # passed from the cache (inputs unchanged)
SHORT = {"reference": "ref", "quantize": "quant", "accuracy": "acc"}  # column headers that fit 80 columns
REASON_CHARS = 200
LEGEND = "· pending  ▶ running  ✓ pass  ↺ reused  ✗ FAIL  ! error  ~ skip  w waived"


def elapsed(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def cut(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` at most ``limit`` characters, an ellipsis saying where it was cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def row_labels(jobs: Iterable[Any]) -> dict[str, str]:
    """Job key -> ``<model> <precision> [<variant>] @<platform>``, with `` (<toolchain>)`` where two jobs of the
    plan would otherwise read the same (two toolchains on one platform)."""
    from edgefarm.tasks.states import row_name

    named = {j.key: (row_name(j.model, j.precision.value, j.entry.variant, [j.platform]), j.toolchain) for j in jobs}
    seen = Counter(name for name, _ in named.values())
    return {key: f"{name} ({toolchain})" if seen[name] > 1 else name for key, (name, toolchain) in named.items()}


class Progress:
    """Live table of rows x stages, fed by stage events from the tasks (in-process)."""

    def __init__(self, title: str, jobs: list[Any], stages: list[str]) -> None:
        self.title, self.stages = title, stages
        self.labels = row_labels(jobs)
        self.listed = {j.key: set(j.entry.stages) for j in jobs}
        self.jobs = [j.key for j in jobs]
        self.cells: dict[tuple[str, str], Text] = {}
        self.running: set[tuple[str, str]] = set()
        self.ended: Counter[str] = Counter()
        self.started_at = time.monotonic()
        self.lock = threading.Lock()

    @property
    def expected(self) -> int:
        return sum(len(self.listed[k] & set(self.stages)) for k in self.jobs)

    def update(self, event: Any) -> None:
        key = (event.job, event.stage)
        with self.lock:
            if key[0] not in self.listed or event.stage not in self.listed[key[0]]:
                return  # a stage the row does not list (its reference): the lines say it, the table has no cell
            if event.status == "start":
                self.running.add(key)
                return
            self.running.discard(key)
            _word, glyph, style = SYMBOL.get(event.status, (event.status, event.status, ""))
            if event.cached and event.status == "pass":
                glyph, style = REUSED
            self.cells[key] = cell(glyph, style)
            self.ended[event.status] += 1

    def _cell(self, job: str, stage: str) -> Text:
        if stage not in self.listed[job]:
            return cell(*NOT_HERE)
        if (job, stage) in self.cells:
            return self.cells[(job, stage)]
        return cell(*RUNNING) if (job, stage) in self.running else cell(*PENDING)

    def table(self) -> Table:
        t = Table(title=cell(f"{self.title} progress"), box=box.SIMPLE_HEAD, padding=(0, 1), expand=True,
                  collapse_padding=True, show_edge=False, pad_edge=False)
        t.add_column("row", overflow="fold", ratio=1)
        for s in self.stages:
            header = SHORT.get(s, s)
            t.add_column(header, justify="center", no_wrap=True, width=max(len(header), 3))  # the rest: the row
        with self.lock:
            for job in self.jobs:
                t.add_row(cell(self.labels[job]), *[self._cell(job, s) for s in self.stages])
            done = sum(self.ended.values())
            counts = ", ".join(f"{n} {SYMBOL.get(k, (k,))[0]}" for k, n in sorted(self.ended.items()))
            t.caption = Text(f"{elapsed(time.monotonic() - self.started_at)} elapsed, {done}/{self.expected} "
                             f"stages ended ({visible(counts) or 'none yet'}), {len(self.running)} running\n{LEGEND}",
                             style="dim")
        return t


class ProgressLines:
    """One plain line per stage start and end, for logs and pipes (no terminal): time, elapsed, ``[ended/expected]``,
    status, the stage and its row, seconds, device, and the first line of the reason of what did not pass. A stage
    the rows do not list (a model's reference, an identity quantize) prints its start and its end too, outside the
    count."""

    def __init__(self, console: Console, jobs: list[Any]) -> None:
        self.console = console
        self.labels = row_labels(jobs)
        self.listed = {j.key: set(j.entry.stages) for j in jobs}
        self.expected = sum(len(s) for s in self.listed.values())
        self.ended = 0
        self.started_at = time.monotonic()
        self.lock = threading.Lock()

    def _name(self, event: Any) -> str:
        name = event.name or f"{event.stage} {event.job}"
        label = self.labels.get(event.job, "")
        if label.endswith(")") and "(" in label:  # two toolchains run this row: say which one this is
            name += " " + label[label.rindex("("):]
        return name

    def update(self, event: Any) -> None:
        word, _glyph, style = SYMBOL.get(event.status, (event.status, event.status, ""))
        with self.lock:
            counted = event.stage in self.listed.get(event.job, ())
            if event.status != "start" and counted:
                self.ended += 1
            line = Text(f"{time.strftime('%H:%M:%S')} +{elapsed(time.monotonic() - self.started_at)} "
                        f"[{self.ended}/{self.expected}] ")
            line.append(f"{word:<6}", style=style)
            line.append(f" {visible(self._name(event))}")
            if event.status != "start":
                line.append(f" {event.duration_s:.1f} s" + (" (reused)" if event.cached else ""))
                if event.device:
                    line.append(f" on {visible(event.device)}")
                if event.reason and event.status != "pass":
                    line.append(f": {cut(visible(event.reason.splitlines()[0]))}", style="dim")
            self.console.print(line, soft_wrap=True)
