"""Small helpers shared by the checks that write JSON reports (eval, bench): atomic writes and latency stats."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgellm import files


def json_safe(data: Any) -> Any:
    """``data`` with non-finite floats as the strings "nan", "inf", "-inf" (JSON has no such numbers)."""
    if isinstance(data, float) and not math.isfinite(data):
        return str(data)
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [json_safe(v) for v in data]
    return data


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` (non-finite floats as strings) as JSON to ``path``: whole or not at all (edgellm.files)."""
    files.write_json_atomic(Path(path), json_safe(data))


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), ``q`` in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_stats(seconds: Sequence[float]) -> dict[str, float]:
    """Summary of step latencies in milliseconds."""
    ms = [s * 1e3 for s in seconds]
    mean = sum(ms) / len(ms)
    var = sum((x - mean) ** 2 for x in ms) / len(ms)
    return {
        "count": len(ms),
        "mean_ms": mean,
        "median_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "std_ms": math.sqrt(var),
    }
