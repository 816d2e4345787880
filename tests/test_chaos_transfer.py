"""Chaos on the wire (issue 40 item 1): a real nightly whose artifacts live in an S3 bucket (moto) reached through a
relay that damages what the store sends back, with the SDK's response checksums off
(``AWS_RESPONSE_CHECKSUM_VALIDATION=when_required``, as MinIO/Ceph users set it).

  damaged transfer   a first nightly fills the bucket; a second one, with a read-through cache too small to keep
                     anything, reuses every export and engine from the bucket while the relay flips one byte of the
                     next responses. Expected: the store fetches again and judges the object only on the same wrong
                     bytes twice, so the run passes on intact objects, every object stays in the bucket byte for byte
                     and nothing is quarantined (it used to delete the object on the reader's word).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.fixtures.moto import Link, MotoServer

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / ".data" / "test-artifacts" / "chaos-transfer.json"
FLIPS = 6


@pytest.fixture
def table() -> Iterator[list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    yield rows
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    phases = {row["fault"]: row.pop("wall_s") for row in rows}
    TABLE.write_text(json.dumps({"table": rows, "wall_s": round(time.monotonic() - t0, 1), "phases_s": phases},
                                indent=2) + "\n")


def _objects(server: MotoServer, bucket: str) -> dict[str, str]:
    """Every object of the bucket -> sha256 of its bytes (read past the relay)."""
    client = server.client()
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            out[o["Key"]] = hashlib.sha256(client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()).hexdigest()
    return out


def test_a_nightly_over_a_damaging_link_passes_and_destroys_no_evidence(
        prefect_harness: Path, moto_s3: MotoServer, s3_bucket: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, table: list[dict[str, Any]]) -> None:
    from edgefarm.cli import app

    t0 = time.monotonic()
    data, inventory = tmp_path / "data", tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"),
        "labels": ["cpu", "local"], "max_jobs": 2, "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    matrix = tmp_path / "wire.yml"
    matrix.write_text(yaml.safe_dump({
        "name": "wire", "models": ["stories260K"], "precisions": ["fp32"], "platforms": ["x86-cpu"],
        "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                     "stages": ["export", "build", "infer"]}}))
    link = Link(moto_s3.port)
    link.start()
    try:
        for name, value in moto_s3.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("AWS_ENDPOINT_URL", link.endpoint)
        monkeypatch.setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
        monkeypatch.setenv("EDGEFARM_ARTIFACTS", f"s3://{s3_bucket}/farm")
        monkeypatch.setenv("EDGEFARM_ARTIFACT_CACHE_GB", "0.0001")  # ~100 kB: every reuse reads the bucket
        monkeypatch.delenv("EDGEFARM_DB_URL", raising=False)
        args = ["nightly", "--json", "--matrix", str(matrix), "--inventory", str(inventory), "--data-dir", str(data)]
        first = CliRunner().invoke(app, args)
        assert first.exit_code == 0, first.output
        before = _objects(moto_s3, s3_bucket)
        link.flip_next(FLIPS)
        second = CliRunner().invoke(app, args)
        after = _objects(moto_s3, s3_bucket)
    finally:
        link.close()
    quarantined = sorted(k for k in after if "/quarantine/" in k)
    lost = sorted(set(before) - set(after))
    changed = sorted(k for k in before if k in after and before[k] != after[k])
    reused = "reused (inputs unchanged): none" not in second.output
    observed = (f"second nightly exit {second.exit_code}; {link.flipped} response(s) damaged on the way; "
                f"{len(before)} objects before, {len(after)} after; lost {lost or 'none'}; changed "
                f"{changed or 'none'}; quarantined {quarantined or 'none'}; reuse from the bucket: {reused}")
    ok = second.exit_code == 0 and link.flipped > 0 and not lost and not changed and not quarantined and reused
    table.append({"fault": "damaged transfer (a byte flipped in the next responses, response checksums off)",
                  "expected": "fetched again, the run passes on intact objects; no object deleted, changed or "
                              "quarantined",
                  "observed": observed, "ok": ok, "wall_s": round(time.monotonic() - t0, 1)})
    assert ok, observed + "\n" + second.output[-3000:]
