"""The farm at lab scale, in small: benchmarks/bench_farm_scale.py's simulated lab (SSH devices reached through a
stand-in transport, the toy toolchain's tools sleeping drawn stage times) through the real plan, Prefect flow,
leases, results database and docs.

- A lab with more devices than the task runner once had threads moves as many stages at once as it has devices
  (before flows.pipeline.Scheduler: at most 16, most of them waiting for their inputs).
- A stage waiting for a device asks the database about once per device command (before: once per device of the
  platform per polling round).
- Every row passes, every stage is recorded once, and the wall time stays within a loose bound of what the lab could
  do at best (the tight target is the benchmark's, on a quiet machine)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import bench_farm_scale

DEVICES, ROWS = 36, 72  # 4 models x 3 precisions x 6 platforms; 5 stages each


@pytest.mark.usefixtures("prefect_harness")
def test_a_simulated_lab_moves_a_stage_on_every_device_at_once(tmp_path: Path) -> None:
    # host stages quick, device stages a few seconds: the lab, not the host, bounds the run (and the orchestrator,
    # on 2 busy cores, keeps up)
    times = {"quantize": (0.05, 0.1), "export": (0.05, 0.1), "build": (3.0, 0.2), "infer": (3.0, 0.2),
             "accuracy": (3.0, 0.2), "bench": (1.5, 0.2)}
    args = argparse.Namespace(devices=DEVICES, rows=ROWS, time_scale=1.0, infra_failure_rate=0.0,
                              test_failure_rate=0.0, stage_times_db=None, stage_times=times, host_slots=4, seed=1)
    result = bench_farm_scale.run_one(args, root=tmp_path)
    assert result["rows"] == ROWS and result["failed_rows"] == 0
    assert result["stage_counts"] == {"pass": ROWS * 5}
    # every row is ready after its export, within a few seconds: the lab fills up
    assert result["peak_device_commands_at_once"] > 16, result
    assert result["lease_attempts_per_device_command"] <= 1.5, result
    assert result["wall_over_lower_bound"] < 4.0, result  # loose: CI's 2 cores also run the flow and its database


def test_the_lower_bound_counts_each_platform_s_devices_after_the_first_host_chain() -> None:
    """A device runs its own platform's stages only: 2 platforms of 1 and 3 devices with the same work are bound by
    the lone device (the whole lab's average is less than half of it), after the first row's quantize and export."""
    work = [("quantize", "host", 4.0, "r1"), ("export", "host", 1.0, "r1"), ("quantize", "host", 9.0, "r2"),
            ("export", "host", 1.0, "r2")]
    devices = ["a0", "a0", "a0", "b0", "b1", "b2"]
    work += [("build", d, 10.0, f"x{i}") for i, d in enumerate(devices)]
    bound = bench_farm_scale.lower_bound(work, 4, 8, {"a0": "a", "b0": "b", "b1": "b", "b2": "b"})
    assert bound["device_bound_s"] == 15.0 and bound["platform_bound_s"] == 4.0 + 1.0 + 30.0
    assert bound["lower_bound_s"] == 35.0


def test_host_slots_come_from_the_environment_and_bad_values_are_refused(tmp_path: Path) -> None:
    from edgefarm.flows.settings import ENV_HOST_SLOTS, Settings
    from edgellm.errors import ConfigurationError

    assert Settings.resolve(data_dir=tmp_path, environ={}).host_slots == 2
    assert Settings.resolve(data_dir=tmp_path, environ={ENV_HOST_SLOTS: "64"}).host_slots == 64
    for bad in ("0", "-3", "two", "1e3", "5000"):
        with pytest.raises(ConfigurationError, match=f"bad EDGEFARM_HOST_SLOTS '{bad}'; valid: an integer from 1"):
            Settings.resolve(data_dir=tmp_path, environ={ENV_HOST_SLOTS: bad})


def test_a_full_connection_pool_is_infrastructure_and_a_run_s_sqlite_pool_takes_a_lab(tmp_path: Path) -> None:
    """Found by the simulated lab at 200 devices: stages waiting for one of SQLAlchemy's default 5+10 connections
    failed after 30 s, recorded as bugs (172 results)."""
    import threading

    from sqlalchemy.exc import TimeoutError as PoolTimeout

    from edgefarm.results.db import make_engine
    from edgefarm.results.errors import classify
    from edgefarm.tasks.farm import pool_options
    from edgellm.errors import InfrastructureError

    assert isinstance(classify(PoolTimeout("QueuePool limit of size 5 overflow 10 reached")), InfrastructureError)
    url = f"sqlite:///{tmp_path / 'lab.db'}"
    engine = make_engine(url, **pool_options(url))
    held, errors, barrier = [], [], threading.Barrier(200)

    def hold() -> None:
        try:
            conn = engine.connect()
            held.append(conn)
            barrier.wait(timeout=60)
            conn.close()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=hold) for _ in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    engine.dispose()
    assert errors == [] and len(held) == 200
