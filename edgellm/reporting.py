"""Small helpers shared by the checks that write JSON reports (eval, bench): atomic writes and latency stats."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgellm.errors import ConfigurationError


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
    """Write ``data`` as JSON to ``path`` via a temporary file and a rename: never a half-written report."""
    path = Path(path)
    data = json_safe(data)
    if path.is_dir():
        raise ConfigurationError(f"output {path} is a directory; give a file path such as {path / 'report.json'}")
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise ConfigurationError(f"cannot write output {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=False, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
