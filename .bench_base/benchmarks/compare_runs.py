"""Compare one run's evidence in two results databases, row by row (a refactoring must not change what the farm
records): every result of run A keyed by (test id, platform, stage) against run B's, field by field, and the build
cache's keys. Fields that measure time or name scratch paths are compared by presence only; metric values that are
not timings must be equal. Prints a table; writes JSON with --output; exit 1 when a result differs.

    .venv/bin/python benchmarks/compare_runs.py BEFORE.db AFTER.db [--run-a 1 --run-b 1] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
from pathlib import Path
from typing import Any

TIMED = ("_s", "_ms", "_mb", "_bytes", "tokens_per_s", "_p90", "ms_per_token", "lease_wait", "ttft")
FIELDS = ("status", "reason", "error_kind", "toolchain", "toolchain_version", "route", "standin", "chosen_versions",
          "device", "model_revision")


def _rows(db: Path, run: int) -> dict[tuple[str, str, str], dict[str, Any]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    con.row_factory = sqlite3.Row
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for r in con.execute("SELECT * FROM results WHERE run_id = ?", (run,)):
        metrics = {m["name"]: m["value"] for m in con.execute("SELECT name, value FROM metrics WHERE result_id = ?",
                                                                (r["id"],))}
        kinds = sorted(a["kind"] for a in con.execute("SELECT kind FROM artifact_refs WHERE result_id = ?",
                                                      (r["id"],)))
        out[(r["test_id"], r["platform"], r["stage"])] = {**{f: r[f] for f in FIELDS}, "metrics": metrics,
                                                         "artifact_kinds": kinds}
    con.close()
    return out


def _cache_keys(db: Path) -> set[str]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    keys = {k for (k,) in con.execute("SELECT key FROM cache_entries")}
    con.close()
    return keys


def _timed(name: str) -> bool:
    return any(name.endswith(t) or t in name for t in TIMED)


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    diffs = [f"{f}: {a[f]!r} -> {b[f]!r}" for f in FIELDS if a[f] != b[f]]
    if set(a["metrics"]) != set(b["metrics"]):
        diffs.append(f"metric names: -{sorted(set(a['metrics']) - set(b['metrics']))} "
                     f"+{sorted(set(b['metrics']) - set(a['metrics']))}")
    for name in sorted(set(a["metrics"]) & set(b["metrics"])):
        x, y = a["metrics"][name], b["metrics"][name]
        if not _timed(name) and not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12):
            diffs.append(f"metric {name}: {x!r} -> {y!r}")
    if a["artifact_kinds"] != b["artifact_kinds"]:
        diffs.append(f"artifact kinds: {a['artifact_kinds']} -> {b['artifact_kinds']}")
    return diffs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--run-a", type=int, default=1)
    p.add_argument("--run-b", type=int, default=1)
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    a, b = _rows(args.before, args.run_a), _rows(args.after, args.run_b)
    common = sorted(set(a) & set(b))
    differing = {"|".join(k): d for k in common if (d := compare(a[k], b[k]))}
    gone = sorted("|".join(k) for k in set(a) - set(b))
    new = sorted("|".join(k) for k in set(b) - set(a))
    keys_a, keys_b = _cache_keys(args.before), _cache_keys(args.after)
    report = {"results_before": len(a), "results_after": len(b), "common": len(common), "identical":
              len(common) - len(differing), "differing": differing, "only_before": gone, "only_after": new,
              "cache_keys_before": len(keys_a), "cache_keys_after": len(keys_b),
              "cache_keys_kept": len(keys_a & keys_b), "cache_keys_lost": sorted(keys_a - keys_b)}
    print(f"{'results':<22}{'before':>8}{'after':>8}")
    print(f"{'all':<22}{len(a):>8}{len(b):>8}")
    print(f"{'common / identical':<22}{len(common):>8}{len(common) - len(differing):>8}")
    print(f"{'cache keys':<22}{len(keys_a):>8}{len(keys_b):>8}  kept {len(keys_a & keys_b)}")
    for key, diffs in differing.items():
        print(f"DIFF {key}")
        for d in diffs:
            print(f"    {d}")
    for key in gone:
        print(f"ONLY BEFORE {key}")
    for key in new:
        print(f"ONLY AFTER {key}")
    if args.output:
        args.output.write_text(json.dumps(report, indent=1) + "\n")
    return 1 if differing or gone else 0


if __name__ == "__main__":
    sys.exit(main())
