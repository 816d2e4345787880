"""The load probe a benchmark runs around each command (devices/load_probe.py: stdlib-only Python 3.8, run isolated
as on a board) and what the farm makes of two probes (tasks/bench_load.py): the round's figures and the under-load
verdict."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys

import pytest

from edgefarm.tasks import bench_load, bench_probe

PROBE = bench_probe.PROBE_FILE


def test_the_probe_is_python38_and_stdlib_only() -> None:
    tree = ast.parse(PROBE.read_text(), feature_version=(3, 8))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {str(n.module).split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported and sorted(imported - sys.stdlib_module_names) == []


def test_the_probe_runs_isolated_and_measures() -> None:
    python = shutil.which("python3") or sys.executable
    done = subprocess.run([python, "-I", "-S", str(PROBE), "--copy-mib", "16", "--window-s", "0.2"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert len(got["loadavg"]) == 3 and got["cpus"] >= 1 and got["hz"] > 0
    assert got["stat_end"][1] >= got["stat_start"][1] > got["stat_start"][0] >= 0
    assert got["copy_bytes"] == 16 * 2**20 and got["copy_bytes_per_s"] > 1e8  # any machine copies 100 MB/s
    assert got["window_s"] >= 0.2 and got["others_cpu_s"] >= 0 and got["own_cpu_s"] >= 0
    bad = subprocess.run([python, "-I", "-S", str(PROBE), "--copy-mib", "0"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and "--copy-mib must be 1..4096" in bad.stderr and "got 0" in bad.stderr


def _fig(others: float | None, copy: tuple[float, float] | None, cpus: int = 4) -> dict[str, object]:
    fig: dict[str, object] = {"cpus": cpus, "others_cores": others, "others_during": "round"}
    if copy is not None:
        fig["copy_gb_per_s_before"], fig["copy_gb_per_s_after"] = copy
    return fig


def test_the_under_load_verdict() -> None:
    quiet = _fig(0.2, (10.0, 9.5))
    assert bench_load.under_load([("prefill", quiet), ("decode", quiet)], 10.0) is None
    busy = bench_load.under_load([("prefill", quiet), ("decode", _fig(1.5, (10.0, 10.0)))], None)
    assert busy == "other processes took 1.50 of 4 cores during the decode round (limit 25% of the cores)"
    slow = bench_load.under_load([("prefill", _fig(0.0, (10.0, 7.0)))], 10.0)
    assert slow == ("copy bandwidth 7.0 GB/s in the prefill round, 70% of the device's recent median 10.0 GB/s "
                    "(limit 80%)")
    assert bench_load.under_load([("prefill", _fig(0.0, (1.0, 1.0)))], None) is None  # no history: not judged


def test_round_figures_from_two_probes() -> None:
    before = {"loadavg": [1.5, 1.0, 0.5], "cpus": 2, "hz": 100, "stat_end": [1000, 5000],
              "copy_bytes_per_s": 8e9, "others_cpu_s": 0.1, "window_s": 0.25}
    after = {"loadavg": [1.7, 1.1, 0.5], "cpus": 2, "hz": 100, "stat_start": [1300, 5400],
             "copy_bytes_per_s": 6e9, "others_cpu_s": 0.2, "window_s": 0.25}
    fig = bench_load.round_figures(before, after, own_cpu_s=1.5)
    # 400 jiffies of 2 CPUs = 2 s; 3 s busy, 1.5 s of it the command's own
    assert fig["round_s"] == 2.0 and fig["busy_cores"] == 1.5 and fig["others_cores"] == 0.75
    assert (fig["load1_before"], fig["load1_after"], fig["copy_gb_per_s_before"]) == (1.5, 1.7, 8.0)
    remote = bench_load.round_figures(before, after, own_cpu_s=None)  # own share unknown: the probes' windows
    assert remote["others_cores"] == pytest.approx(0.8) and remote["others_during"] == "probes"
    assert bench_load.metrics("decode", fig)["decode_copy_gb_per_s_after"] == (6.0, "GB/s")


def test_the_run_page_shows_a_benchmarks_load_where_its_conditions_are() -> None:
    from edgefarm.pages.docs_render import render_run_page
    from edgefarm.results.regressions import UNDER_LOAD_METRIC

    metrics = [("decode_copy_gb_per_s_after", 9.0, "GB/s"), ("decode_copy_gb_per_s_before", 10.0, "GB/s"),
               ("decode_host_load1_after", 1.25, ""), ("decode_host_load1_before", 1.5, ""),
               ("decode_others_cpu_cores", 1.2, "cores"), ("decode_tokens_per_s", 50.0, "tokens/s"),
               (UNDER_LOAD_METRIC, 1.0, "")]
    res = {"model": "m", "precision": "fp32", "platform": "x86-cpu", "stage": "bench", "status": "pass",
           "device": "local-cpu", "toolchain": "edgellm-ort", "job_toolchain": "edgellm-ort",
           "reason": "under load (other processes took 1.20 of 2 cores during the decode round)",
           "metrics": metrics, "artifacts": []}
    page = render_run_page({"id": 3, "kind": "nightly", "status": "passed"}, [res])
    row = next(line for line in page.splitlines() if line.startswith("| bench"))
    assert "under load (other processes took 1.20 of 2 cores" in row
    assert ("bench conditions UNDER LOAD (unreliable, not judged): decode: 1.50->1.25 host load, 10.0->9.0 GB/s "
            "copy, others 1.20 cores") in row
    quiet = render_run_page({"id": 3, "kind": "nightly", "status": "passed"},
                            [{**res, "reason": None, "metrics": metrics[:-1]}])
    assert "bench conditions: decode: 1.50->1.25 host load" in quiet and "UNDER LOAD" not in quiet
