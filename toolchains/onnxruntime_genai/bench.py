"""The runner's benchmark JSON (``runner.py bench --output F``) as the farm's metrics, named as edgellm's are
(``toolchains/edgellm/driver.py`` ``bench_metrics``): ``{mode}_tokens_per_s``, ``{mode}_ms_per_token`` (median),
``{mode}_ms_per_token_p90`` and ``{mode}_peak_rss_mb`` (MiB), so the two toolchains' rows compare column by column.
The runner writes the fields of ``edgellm bench``'s report (tokens_per_s at the median step, ms_per_token
{median, p90}, peak_rss_bytes), measured the same way: a fixed shape per iteration, the cache rewound to the past
length outside the timed region."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgellm.errors import TestFailure

MODES = ("prefill", "decode")


def _positive(report: Mapping[str, Any], *path: str) -> float:
    value: Any = report
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise TestFailure(f"runner bench report: {'.'.join(path)} is {value!r}, expected a positive number")
    return float(value)


def bench_metrics(report: Mapping[str, Any] | Path, mode: str) -> dict[str, tuple[float, str]]:
    """Farm metrics of one runner bench report (a fetched file or its parsed JSON) for ``mode``. A report of
    another mode, or without a positive throughput and latency, is a TestFailure naming the field."""
    if mode not in MODES:
        raise ValueError(f"unknown bench mode {mode!r}; valid: {', '.join(MODES)}")
    if isinstance(report, Path):
        try:
            report = json.loads(report.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TestFailure(f"runner bench report {report} is unreadable ({exc})") from None
    if not isinstance(report, Mapping):
        raise TestFailure(f"runner bench report is {type(report).__name__}, not a JSON object")
    if report.get("mode") != mode:
        raise TestFailure(f"runner bench report is of mode {report.get('mode')!r}, expected {mode!r}")
    metrics = {f"{mode}_tokens_per_s": (_positive(report, "tokens_per_s"), "tokens/s"),
               f"{mode}_ms_per_token": (_positive(report, "ms_per_token", "median"), "ms"),
               f"{mode}_ms_per_token_p90": (_positive(report, "ms_per_token", "p90"), "ms")}
    if report.get("peak_rss_bytes") is not None:  # None where the device cannot measure it
        metrics[f"{mode}_peak_rss_mb"] = (_positive(report, "peak_rss_bytes") / 2**20, "MiB")
    return metrics
