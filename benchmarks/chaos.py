"""The chaos scenario (tests/test_chaos.py): a nightly on the local device and two SSH hosts with results on
PostgreSQL while faults are injected (sshd killed mid-transfer, a full disk, corrupt store blobs, the orchestrator
SIGKILLed and rerun). Runs that test, prints its table (fault, expected, observed, ok) and keeps it as
benchmarks/results/chaos.json.

    .venv/bin/python benchmarks/chaos.py

Needs what the test needs: root, openssh-server and postgresql (scripts/install-system-deps.sh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/test_chaos.py"
TABLE = ROOT / ".data" / "test-artifacts" / "chaos.json"  # written by the test
OUT = ROOT / "benchmarks" / "results" / "chaos.json"


def main() -> int:
    TABLE.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", TEST, "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                          check=False)
    wall = time.perf_counter() - t0
    if not TABLE.exists():
        sys.exit(f"{TEST} wrote no table (pytest exit {proc.returncode})")
    result = json.loads(TABLE.read_text())
    result.update({"command": f"{Path(sys.executable).name} benchmarks/chaos.py (pytest {TEST})",
                   "pytest_exit_code": proc.returncode, "pytest_wall_s": round(wall, 1),
                   "machine": {"cpu_count": os.cpu_count(), "loadavg": os.getloadavg()}})
    for row in result["table"]:
        print(f"\n{'ok ' if row['ok'] else 'NOT OK '}{row['fault']}")
        for label in ("expected", "observed"):
            print(textwrap.fill(row[label], 116, initial_indent=f"  {label}: ", subsequent_indent="    "))
    print(f"\npytest exit {proc.returncode}; scenario {result['wall_s']} s ({result['phases_s']}); "
          f"pytest {wall:.0f} s with its services")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
