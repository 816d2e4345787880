"""What a board result carries into the results database: its environment (stored once per distinct environment),
benchmarks compared like for like (a board off its device type's benchmark conditions is never compared with runs in
them), a device set up wrong quarantined at once with its reason, resource errors kept as such. Real SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from edgefarm.registries import current
from edgefarm.results import quarantine
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.models import Environment, Result
from edgefarm.results.recorder import Recorder, environment_digest
from edgefarm.results.regressions import find_regressions
from edgefarm.tasks.environment import bench_conditions, device_record, host_record

TC = "tensorrt-edgellm"
ORIN_ENV = {"python": "3.10.12", "machine": "aarch64", "l4t": {"release": "36.4.3", "source": "/etc/nv_tegra_release"},
            "jetpack": {"version": "6.2", "source": "l4t table"}, "cuda": {"version": "12.6.68"},
            "power_mode": {"name": "MAXN", "id": 0}, "clocks_locked": True, "memory_available_bytes": 123,
            "thermal": [{"zone": "thermal_zone0", "type": "cpu-thermal", "temp_c": 45.5}],
            "toolchains": {TC: {"builds": {"/home/b/TensorRT-Edge-LLM/build": {
                "version": "0.11.0", "revision": "ab" * 20, "source_dir": "/home/b/TensorRT-Edge-LLM"}},
                "libs": {"libnvinfer.so.*.*.*": "/usr/lib/aarch64-linux-gnu/libnvinfer.so.10.3.0"},
                "tools": {"llm_build": "/home/b/TensorRT-Edge-LLM/build/examples/llm/llm_build"}}}}


@pytest.fixture
def rec(tmp_path: Path) -> Recorder:
    engine = make_engine(f"sqlite:///{tmp_path / 'edgefarm.db'}")
    upgrade(engine)
    return Recorder(engine)


def test_a_device_record_keeps_what_a_number_depends_on_and_no_paths() -> None:
    record = device_record("orin-1", "orin", ORIN_ENV, TC, "0.11.0")
    assert record["l4t"]["release"] == "36.4.3" and record["jetpack"]["version"] == "6.2"
    assert record["power_mode"] == {"name": "MAXN", "id": 0} and record["clocks_locked"] is True
    assert record["toolchain"]["builds"] == [{"version": "0.11.0", "revision": "ab" * 20}]
    assert record["toolchain"]["libs"] == {"libnvinfer.so.*.*.*": "libnvinfer.so.10.3.0"}
    assert "memory_available_bytes" not in record and "thermal" not in record  # volatile: around benchmarks only
    assert "/home/" not in repr(record)
    host = host_record()
    assert host["where"] == "orchestrator" and host["python"]


def test_each_environment_is_stored_once_and_named_by_every_result(rec: Recorder) -> None:
    run = rec.start_run("nightly", "cron", "v")
    record = device_record("orin-1", "orin", ORIN_ENV, TC, "0.11.0")
    for stage in ("build", "infer"):
        rec.record_result(run, model="m", precision="fp16", platform="orin", test_id="t", toolchain=TC,
                          stage=stage, status="pass", device="orin-1", environment=record)
    with Session(rec.engine) as s:
        assert s.scalar(select(func.count()).select_from(Environment)) == 1
        envs = set(s.scalars(select(Result.environment)))
        assert envs == {environment_digest(record)}
        assert s.get(Environment, environment_digest(record)).data == record


def test_bench_conditions_against_the_device_type() -> None:
    orin = current().device_type("orin")
    assert bench_conditions(orin, {"power_mode": {"name": "MAXN"}, "clocks_locked": True}) is None
    assert bench_conditions(orin, {"power_mode": {"name": "MODE_15W"}, "clocks_locked": False}) == (
        "power mode MODE_15W (type orin benchmarks at MAXN); clocks not locked (jetson_clocks)")
    assert bench_conditions(current().device_type("x86-cpu"), {}) is None  # declares none


def _bench(rec: Recorder, tps: float, conditions: str | None, *, finish: bool = True) -> int:
    run = rec.start_run("nightly", "cron", "v")
    rec.record_result(run, model="m", precision="fp16", platform="orin", test_id="t", toolchain=TC, stage="bench",
                      status="pass", device="orin-1", metrics={"decode_tokens_per_s": (tps, "tokens/s")},
                      bench_conditions=conditions)
    if finish:
        rec.finish_run(run, "passed")
    return run


def test_benchmarks_are_compared_only_in_equal_conditions(rec: Recorder) -> None:
    for tps in (100.0, 101.0, 99.0, 100.5):
        _bench(rec, tps, None)  # locked MAXN
    slow = "power mode MODE_15W (type orin benchmarks at MAXN)"
    unlocked = _bench(rec, 40.0, slow, finish=False)
    assert find_regressions(rec.engine, unlocked) == []  # a 15 W board is slower: not a regression of MAXN runs
    rec.finish_run(unlocked, "passed")
    locked = _bench(rec, 60.0, None, finish=False)
    flags = find_regressions(rec.engine, locked)
    assert [(f.metric, f.baseline_runs) for f in flags] == [("decode_tokens_per_s", 4)]  # the 15 W run not among


def test_a_device_set_up_wrong_is_quarantined_at_once_with_its_reason(rec: Recorder) -> None:
    q = quarantine.quarantine(rec.engine, "orin-1", "orin-1: toolchain tensorrt-edgellm is not installed as the "
                                                    "inventory says: tool llm_build: /b/llm_build does not exist")
    assert q is not None
    held = quarantine.active(rec.engine)
    assert "llm_build" in held["orin-1"].reason and "devices check" in held["orin-1"].reason
    assert quarantine.quarantine(rec.engine, "orin-1", "another reason") is None  # its first reason stands


def test_a_resource_error_is_recorded_as_such(rec: Recorder) -> None:
    run = rec.start_run("nightly", "cron", "v")
    rec.record_result(run, model="m", precision="fp16", platform="orin", test_id="t", toolchain=TC, stage="build",
                      status="error", error_kind="resource", device="orin-1",
                      reason="out of memory: killed by SIGKILL; device memory 62841 MiB, 120 MiB available")
    with Session(rec.engine) as s:
        assert s.scalar(select(Result.error_kind)).value == "resource"
