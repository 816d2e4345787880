"""Benchmarks the farm's own load cannot pollute, on the real local devices under the real Prefect harness: a nightly
of two models x two precisions on two local devices of this host (export on the host, build and infer and bench on
the devices), one export kept working until a benchmark stage began. A benchmark command never overlaps a host stage
or another stage's command on either device of this host (tasks/host_gate.py), while those overlap each other; every
benchmark records the host's load and a memory bandwidth probe of its own rounds (tasks/bench_load.py), shown on the
run page."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm import stages
from edgefarm.cli import app
from edgefarm.devices.transport.local import LocalTransport
from edgefarm.results.db import make_engine
from edgefarm.results.models import Environment, Metric, Result
from edgefarm.results.regressions import UNDER_LOAD_METRIC
from edgefarm.stages import Where
from edgefarm.tasks import common

REPO = Path(__file__).resolve().parents[1]
DEVICES = ("local-cpu", "local-cpu-2")
Span = tuple[str, str, float, float]  # (what: host | device | bench | bench stage, name, start, end)
SLOW_EXPORT = ("tiny-qwen3", "fp16")


@pytest.fixture(scope="module")
def night(prefect_harness: Path, farm_dirs: dict[str, Path],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("isolation")
    inventory = root / "inventory"
    inventory.mkdir()
    for name in DEVICES:  # two devices of this host: a stage on one must not run beside a benchmark on the other
        (inventory / f"{name}.yaml").write_text(yaml.safe_dump({
            "type": "x86-cpu", "transport": "local", "work_dir": str(farm_dirs["data"] / "devices" / name),
            "max_jobs": 2, "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    matrix = root / "bench.yml"
    matrix.write_text(yaml.safe_dump({"name": "isolation", "models": ["stories260K", "tiny-qwen3"],
                                      "precisions": ["fp32", "fp16"], "platforms": ["x86-cpu"],
                                      "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                                                   "stages": ["export", "build", "infer", "bench"]}}))
    spans: list[Span] = []
    lock = threading.Lock()
    real_work, real_run = common.stage_work, LocalTransport.run

    bench_began = threading.Event()

    def stage_work(stage: str) -> Callable[..., Any]:
        work = real_work(stage)
        if stage == "bench":
            def began(*args: Any, **kwargs: Any) -> Any:
                with lock:
                    spans.append(("bench stage", str(args[1].key), time.monotonic(), time.monotonic()))
                bench_began.set()
                return work(*args, **kwargs)
            return began
        if stages.spec(stage).where is not Where.HOST:
            return work

        def timed(ctx: Any, job: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic()
            try:
                out = work(ctx, job, *args, **kwargs)
                if (job.model, str(job.precision)) == SLOW_EXPORT:  # a slow export, still working when benches begin
                    bench_began.wait(600)
                    time.sleep(8)
                return out
            finally:
                with lock:
                    spans.append(("host", f"{stage} {job.model} {job.precision}", t0, time.monotonic()))
        return timed

    def run(self: LocalTransport, argv: list[str], **kwargs: Any) -> Any:
        t0 = time.monotonic()
        try:
            return real_run(self, argv, **kwargs)
        finally:
            if argv[1:3] == ["-m", "edgellm"]:  # a stage's command (build, infer, bench)
                with lock:
                    spans.append(("bench" if argv[3] == "bench" else "device", f"{self.device_id} {argv[3]}", t0,
                                  time.monotonic()))

    db = f"sqlite:///{root / 'night.db'}"  # its own database: nothing is a cache hit, every stage works
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "stage_work", stage_work)
        mp.setattr(LocalTransport, "run", run)
        result = CliRunner().invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--db", db, "--inventory",
                                          str(inventory), "--data-dir", str(farm_dirs["data"]),
                                          "--docs-dir", str(root / "docs")])
    assert result.exit_code == 0, result.output
    yield {"spans": spans, "db": db, "docs": root / "docs"}


def _overlap(a: Span, b: Span) -> bool:
    return a[2] < b[3] and b[2] < a[3]


def test_a_bench_on_a_device_of_this_host_never_overlaps_another_stage_of_this_host(night: dict[str, Any]) -> None:
    spans: list[Span] = night["spans"]
    benches = [s for s in spans if s[0] == "bench"]
    others = [s for s in spans if s[0] in ("host", "device")]
    assert len(benches) == 8, spans  # 4 jobs x (prefill, decode)
    assert len([s for s in others if s[0] == "host" and s[1].startswith("export ")]) == 4, others
    # a benchmark stage began while the slow export still worked on this host: its commands had to wait for it
    [slow] = [s for s in others if s[1] == f"export {' '.join(SLOW_EXPORT)}"]
    assert any(s[0] == "bench stage" and slow[2] < s[2] < slow[3] for s in spans), spans
    beside = [f"{b[1]} beside {o[0]} {o[1]}" for b in benches for o in [*others, *benches]
              if o is not b and _overlap(b, o)]
    assert beside == [], beside
    # the rest did run side by side (else nothing was tested): host stages beside device commands, or both devices
    assert any(_overlap(a, b) for i, a in enumerate(others) for b in others[i + 1:]), others


def test_every_bench_records_the_host_load_and_a_bandwidth_probe(night: dict[str, Any]) -> None:
    engine = make_engine(night["db"])
    with Session(engine) as s:
        benches = s.scalars(select(Result).where(Result.stage == "bench")).all()
        assert len(benches) == 4 and all(r.status.value == "pass" for r in benches), [r.reason for r in benches]
        for r in benches:
            got = {m.name: (m.value, m.unit) for m in s.scalars(select(Metric).where(Metric.result_id == r.id))}
            for mode in ("prefill", "decode"):
                assert got[f"{mode}_host_load1_before"][0] >= 0 and got[f"{mode}_host_load1_after"][0] >= 0
                for when in ("before", "after"):
                    assert got[f"{mode}_copy_gb_per_s_{when}"][1] == "GB/s"
                    assert 0.05 < got[f"{mode}_copy_gb_per_s_{when}"][0] < 10_000
                assert got[f"{mode}_others_cpu_cores"][0] >= 0
            loaded = got[UNDER_LOAD_METRIC][0]
            assert loaded in (0.0, 1.0)
            assert ("under load (" in (r.reason or "")) == (loaded == 1.0), r.reason
            env = s.get(Environment, r.environment)
            assert env is not None
            around = {a["mode"]: a for a in env.data["bench"]}
            assert set(around) == {"prefill", "decode"}
            for a in around.values():
                host = a["host"]
                assert host["cpus"] >= 1 and host["others_during"] == "round"  # a local device: measured exactly
                assert host["own_cpu_s"] > 0 and host["round_s"] > 0
            page = (night["docs"] / "runs" / f"run-{r.run_id}.md").read_text()
            assert "host load" in page and "GB/s copy" in page
    engine.dispose()
    print(json.dumps({"under_load": [r.reason for r in benches if "under load" in (r.reason or "")]}, indent=1))
