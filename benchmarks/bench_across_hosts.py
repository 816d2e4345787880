"""The nightly's wall time on one worker against two: the same matrix run through the real orchestrator as a
deployment (`prefect deployment run nightly-support-matrix/nightly`) on a Prefect server, PostgreSQL and an S3
bucket (moto), once with the `orchestrator` worker alone (it quantizes on its own host) and once with a second
worker of pool `x86-h200` that the nightly sends its quantize stages to (EDGEFARM_QUANTIZE_ON). Each mode starts
from an empty database, bucket and data dirs (no cache hits). Devices: the orchestrator's local CPU device.

    python benchmarks/bench_across_hosts.py [--rounds 1] [--output FILE]

On this machine both workers share the same 2 cores, so a second worker adds no compute: the ratio measures what
sending a stage to another worker costs (a flow run, its worker's poll, the checkpoint through the bucket), the
part that stays when the second worker is a real GPU host. Prints a table and writes JSON with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from edgefarm.results.db import make_engine  # noqa: E402
from edgefarm.results.pages import run_results  # noqa: E402
from edgefarm.results.runs import recent_runs  # noqa: E402
from edgefarm.toolchains.tensorrt_edgellm.env import install  # noqa: E402
from tests.fixtures.lab import running_lab  # noqa: E402
from tests.fixtures.moto import start_moto  # noqa: E402
from tests.fixtures.postgres import start_postgres  # noqa: E402
from tests.fixtures.toolchain import TRT_EDGELLM_VERSION, toolchains_home  # noqa: E402

MATRIX = {
    "name": "bench-across-hosts",
    "models": ["stories260K", "tiny-qwen3-128"],
    "precisions": ["fp32"],
    "platforms": ["x86-cpu"],
    "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                 "stages": ["export", "build", "infer", "accuracy"]},
    "extra": [{"models": ["stories260K", "tiny-qwen3-128"], "precisions": ["int8_sq"], "platforms": ["x86-cpu"],
               "defaults": {"stages": ["quantize", "export", "build", "infer", "accuracy"]}}],
}
MODES = {
    "one worker": {"orchestrator": {}},
    "two workers": {"orchestrator": {"EDGEFARM_QUANTIZE_ON": "x86-h200"}, "x86-h200": {}},
}


def _one(mode: str, root: Path, postgres: Any, moto: Any, matrix: Path, toolchain: Path) -> dict[str, Any]:
    inventory = root / "inventory"
    inventory.mkdir(parents=True)
    data = root / "lab" / "data-orchestrator"
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"), "max_jobs": 2,
        "labels": ["cpu"], "python": sys.executable, "env": {"PYTHONPATH": str(ROOT)}}))
    with running_lab(root / "lab", postgres=postgres, moto=moto, inventory=inventory, workers=MODES[mode],
                     toolchain=toolchain) as lab:
        load_before = os.getloadavg()
        wall = lab.finish(lab.deployment_run("nightly-support-matrix/nightly", {"matrix": str(matrix)}), mode)
        load_after = os.getloadavg()
        engine = make_engine(lab.db_url)
        try:
            nightly = [r for r in recent_runs(engine, 100) if r.kind == "nightly"]
            if len(nightly) != 1:
                raise RuntimeError(f"expected one nightly run, found {len(nightly)}")
            run = nightly[0]
            results = run_results(engine, run.id)
        finally:
            engine.dispose()
        statuses = sorted({r.status for r in results})
        quantize_s = sum(r.duration_s or 0.0 for r in results if r.stage == "quantize")
        remote = sum("on pool x86-h200" in (r.reason or "") for r in results if r.stage == "quantize")
    return {"mode": mode, "wall_s": round(wall, 1), "run_status": run.status, "statuses": statuses,
            "stage_results": len(results), "quantize_s": round(quantize_s, 1), "quantized_remotely": remote,
            "load_before": load_before, "load_after": load_after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="rounds of both modes, alternating (default 1)")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "across_hosts.json")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    toolchain = install(toolchains_home(), TRT_EDGELLM_VERSION).path
    postgres, stop_postgres = start_postgres()
    with tempfile.TemporaryDirectory(prefix="bench-across-") as tmp:
        moto = start_moto(Path(tmp) / "moto.log")
        try:
            matrix = Path(tmp) / "matrix.yml"
            matrix.write_text(yaml.safe_dump(MATRIX))
            rows = [_one(mode, Path(tmp) / f"r{i}-{n}", postgres, moto, matrix, toolchain)
                    for i in range(args.rounds) for n, mode in enumerate(MODES)]
        finally:
            moto.stop()
            stop_postgres()
    walls = {mode: [r["wall_s"] for r in rows if r["mode"] == mode] for mode in MODES}
    best = {mode: min(w) for mode, w in walls.items()}
    report = {"benchmark": "across_hosts", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "matrix": MATRIX,
              "rows": rows, "best_wall_s": best,
              "two_over_one": round(best["two workers"] / best["one worker"], 3)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'mode':<12} {'wall s':>8} {'quantize s':>11} {'remote':>7} {'status':>8} {'load 1m':>8}")
    for r in rows:
        print(f"{r['mode']:<12} {r['wall_s']:>8.1f} {r['quantize_s']:>11.1f} {r['quantized_remotely']:>7} "
              f"{r['run_status']:>8} {r['load_before'][0]:>8.2f}")
    print(f"two workers / one worker (best wall): {report['two_over_one']:.3f}x; written {args.output}")


if __name__ == "__main__":
    main()
