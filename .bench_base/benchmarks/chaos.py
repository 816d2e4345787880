"""The chaos scenarios: runs their tests, prints each table (fault, expected, observed, ok) and keeps it in
benchmarks/results/.

  nightly  tests/test_chaos.py: a nightly on the local device and two SSH hosts with results on PostgreSQL while
           faults are injected (sshd killed mid-transfer, a full disk, corrupt store blobs, the orchestrator
           SIGKILLed and rerun) -> benchmarks/results/chaos.json. Needs root, openssh-server and postgresql
           (scripts/install-system-deps.sh).
  host     tests/test_chaos_host_kill.py: the orchestrator (an ``edgefarm run`` process) SIGKILLed while NVIDIA's
           quantizer runs for it and while it installs that toolchain; nothing may outlive it and ``edgefarm gc``
           must leave nothing in scratch -> benchmarks/results/chaos-host.json. Needs the tensorrt-edgellm
           environment the tests install once (tests/fixtures/toolchain.py); no network.

  runs     tests/test_chaos_runs.py: a real ``edgefarm nightly`` SIGSTOPped past the stale limit, reaped and its
           device taken meanwhile, then resumed; a twin orchestrator with this host name in its own pid namespace
           whose live run a nightly here must not reap -> benchmarks/results/chaos-runs.json. Needs ``unshare``.

  transfer tests/test_chaos_transfer.py: a nightly whose artifacts are in an S3 bucket (moto) reached through a relay
           that flips a byte of the next responses, the SDK's response checksums off: it must pass on intact objects
           with no object deleted, changed or quarantined -> benchmarks/results/chaos-transfer.json.

    .venv/bin/python benchmarks/chaos.py [nightly|host|runs|transfer|all]      # default: all
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
ARTIFACTS = ROOT / ".data" / "test-artifacts"
# scenario -> (its test, the table the test writes, where the table is kept)
SCENARIOS = {
    "nightly": ("tests/test_chaos.py", ARTIFACTS / "chaos.json", ROOT / "benchmarks" / "results" / "chaos.json"),
    "host": ("tests/test_chaos_host_kill.py", ARTIFACTS / "chaos-host.json",
             ROOT / "benchmarks" / "results" / "chaos-host.json"),
    "runs": ("tests/test_chaos_runs.py", ARTIFACTS / "chaos-runs.json",
             ROOT / "benchmarks" / "results" / "chaos-runs.json"),
    "transfer": ("tests/test_chaos_transfer.py", ARTIFACTS / "chaos-transfer.json",
                 ROOT / "benchmarks" / "results" / "chaos-transfer.json"),
}


def run(name: str) -> int:
    test, table, out = SCENARIOS[name]
    table.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                          check=False)
    wall = time.perf_counter() - t0
    if not table.exists():
        print(f"{test} wrote no table (pytest exit {proc.returncode})", file=sys.stderr)
        return proc.returncode or 1
    result = json.loads(table.read_text())
    result.update({"command": f"{Path(sys.executable).name} benchmarks/chaos.py {name} (pytest {test})",
                   "pytest_exit_code": proc.returncode, "pytest_wall_s": round(wall, 1),
                   "machine": {"cpu_count": os.cpu_count(), "loadavg": os.getloadavg()}})
    for row in result["table"]:
        print(f"\n{'ok ' if row['ok'] else 'NOT OK '}{row['fault']}")
        for label in ("expected", "observed"):
            print(textwrap.fill(row[label], 116, initial_indent=f"  {label}: ", subsequent_indent="    "))
    print(f"\npytest exit {proc.returncode}; scenario {result['wall_s']} s ({result['phases_s']}); "
          f"pytest {wall:.0f} s with its services")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT)}")
    return proc.returncode


def main(argv: list[str]) -> int:
    chosen = argv[0] if argv else "all"
    if chosen not in (*SCENARIOS, "all") or len(argv) > 1:
        sys.exit(f"usage: chaos.py [{'|'.join(SCENARIOS)}|all] (got {' '.join(argv)!r})")
    codes = [run(name) for name in (SCENARIOS if chosen == "all" else [chosen])]
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
