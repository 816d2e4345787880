"""A benchmark taken under load (results.regressions.UNDER_LOAD_METRIC, set by tasks/bench_load.py) is kept out of
regression baselines and never flagged itself: it is reported as unreliable. Real SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.recorder import Recorder
from edgefarm.results.regressions import UNDER_LOAD_METRIC, find_regressions, flag_regressions, unreliable

TC = "edgellm-ort"


@pytest.fixture
def rec(tmp_path: Path) -> Recorder:
    engine = make_engine(f"sqlite:///{tmp_path / 'edgefarm.db'}")
    upgrade(engine)
    return Recorder(engine)


def _bench(rec: Recorder, tps: float, *, loaded: bool | None, finish: bool = True) -> int:
    run = rec.start_run("nightly", "cron", "v")
    metrics = {"decode_tokens_per_s": (tps, "tokens/s")}
    if loaded is not None:
        metrics[UNDER_LOAD_METRIC] = (1.0 if loaded else 0.0, "")
    rec.record_result(run, model="m", precision="fp16", platform="x86-cpu", test_id="t", toolchain=TC,
                      stage="bench", status="pass", device="local-cpu", metrics=metrics,
                      reason="under load (other processes took 1.9 of 2 cores)" if loaded else None)
    if finish:
        rec.finish_run(run, "passed")
    return run


def test_a_result_under_load_is_never_flagged_and_reported_as_unreliable(rec: Recorder) -> None:
    for tps in (100.0, 101.0, 99.0, 100.5):
        _bench(rec, tps, loaded=False)
    slow = _bench(rec, 40.0, loaded=True, finish=False)
    assert find_regressions(rec.engine, slow) == []  # far below the baseline, but taken under load
    assert flag_regressions(rec.engine, slow) == []
    [bad] = unreliable(rec.engine, slow)
    assert (bad.model, bad.stage, bad.device, bad.metrics) == ("m", "bench", "local-cpu", ("decode_tokens_per_s",))
    assert "not judged (taken under load: unreliable)" in bad.describe()
    quiet = _bench(rec, 40.0, loaded=False, finish=False)  # the same value on a quiet host is a regression
    assert [f.metric for f in find_regressions(rec.engine, quiet)] == ["decode_tokens_per_s"]
    assert unreliable(rec.engine, quiet) == []


def test_results_under_load_are_kept_out_of_the_baseline(rec: Recorder) -> None:
    for tps in (100.0, 101.0, 99.0):
        _bench(rec, tps, loaded=None)  # recorded before benchmarks carried the marker: reliable
    for _ in range(4):
        _bench(rec, 60.0, loaded=True)  # published, passing, but taken under load: they would drag the median down
    now = _bench(rec, 60.0, loaded=False, finish=False)
    [flag] = find_regressions(rec.engine, now)
    assert (flag.baseline, flag.baseline_runs) == (100.0, 3)  # the median of the reliable runs only


def test_the_devices_recent_copy_bandwidth_leaves_out_benchmarks_under_load(rec: Recorder) -> None:
    from edgefarm.tasks.bench_probe import recent_copy_median

    def bench(copies: tuple[float, float], loaded: bool, device: str = "local-cpu") -> None:
        run = rec.start_run("nightly", "cron", "v")
        rec.record_result(run, model="m", precision="fp16", platform="x86-cpu", test_id="t", toolchain=TC,
                          stage="bench", status="pass", device=device,
                          metrics={"prefill_copy_gb_per_s_before": (copies[0], "GB/s"),
                                   "decode_copy_gb_per_s_after": (copies[1], "GB/s"),
                                   UNDER_LOAD_METRIC: (1.0 if loaded else 0.0, "")})
        rec.finish_run(run, "passed")

    bench((10.0, 9.0), False)
    bench((11.0, 12.0), False)
    assert recent_copy_median(rec.engine, "local-cpu") is None  # fewer than MIN_BANDWIDTH_HISTORY: not judged
    bench((1.0, 1.0), True)  # under load: not part of the device's history
    bench((20.0, 20.0), False, device="other-device")
    assert recent_copy_median(rec.engine, "local-cpu") is None
    bench((8.0, 14.0), False)
    assert recent_copy_median(rec.engine, "local-cpu") == 9.0  # the median of each one's lowest: 9, 11, 8
