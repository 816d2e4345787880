"""The regression mark of a support-matrix cell: what got worse, by how much, with links to both runs.

Kept apart from the page layout (pages/docs_render.py) so a renderer only appends ``mark_html`` /
``mark_markdown`` to a cell; the marks come from the ``regressions`` table (results/regressions.py).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from edgefarm.pages.escape import markdown_text


@dataclass(frozen=True)
class RegressionMark:
    metric: str
    value: float
    baseline: float
    change: float  # relative, positive = worse
    severity: str  # fail (accuracy) | warn (performance)
    run_id: int
    previous_run_id: int | None  # the last baseline run

    @property
    def text(self) -> str:
        rel = (self.value - self.baseline) / max(abs(self.baseline), 1e-12)
        return f"{self.metric} {self.value:.4g} vs {self.baseline:.4g} ({rel:+.1%})"


def run_link(run_id: int, ext: str = "md") -> str:
    """A run's evidence page from the docs dir: ``md`` for Markdown pages, ``html`` for the HTML matrix."""
    return f"runs/run-{run_id}.{ext}"


def mark_html(marks: Sequence[RegressionMark]) -> str:
    """A block for an HTML cell (empty when nothing regressed)."""
    if not marks:
        return ""
    e = html.escape
    items = []
    for m in marks:
        before = (f" <a href='{e(run_link(m.previous_run_id, 'html'))}'>run {m.previous_run_id}</a> →"
                  if m.previous_run_id is not None else "")
        items.append(f"<div class='m regression {e(m.severity)}'>⚠ regression: {e(m.text)};{before} "
                     f"<a href='{e(run_link(m.run_id, 'html'))}'>run {m.run_id}</a></div>")
    return "".join(items)


def mark_markdown(marks: Sequence[RegressionMark]) -> str:
    """Text for a Markdown table cell (empty when nothing regressed)."""
    parts = []
    for m in marks:
        before = f"[run {m.previous_run_id}]({run_link(m.previous_run_id)}) → " if m.previous_run_id else ""
        parts.append(f"⚠ {markdown_text(m.severity)} regression: {markdown_text(m.text)}; {before}"
                     f"[run {m.run_id}]({run_link(m.run_id)})")
    return "<br>".join(parts)
