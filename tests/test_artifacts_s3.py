"""The S3 artifact store against a real S3 server (moto in server mode on 127.0.0.1): the local store's contract
(content-addressed, verified on read, atomic, gc) kept on a bucket, with retries, a killed server, two writers at
once, a bounded read-through cache, the store chosen by EDGEFARM_ARTIFACTS, and a farm run keeping its bytes there."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.artifacts.location import S3Location, open_store, parse_artifacts_url
from edgefarm.artifacts.s3 import Retry, S3ArtifactStore
from edgefarm.artifacts.store import ArtifactStore, CorruptArtifactError, MissingArtifactError, StoreError
from edgefarm.flows.settings import Settings
from edgellm.errors import ConfigurationError, InfrastructureError
from tests.fixtures.moto import Link, MotoServer, free_port

PART = 128 * 1024  # over moto's minimum part in these tests (tests.fixtures.moto.TEST_MIN_PART)
FAST = Retry(attempts=3, base_s=0.02, max_s=0.1)
REPO = Path(__file__).resolve().parents[1]


def _store(server: MotoServer, bucket: str, cache: Path, *, endpoint: str | None = None, cache_bytes: int = 64 << 20,
           **kwargs: object) -> S3ArtifactStore:
    env = {**server.env(), "AWS_ENDPOINT_URL": endpoint or server.endpoint}
    return S3ArtifactStore(S3Location(bucket, "farm"), cache_dir=cache, cache_bytes=cache_bytes, environ=env,
                           part_size=PART, retry=FAST, **kwargs)  # type: ignore[arg-type]


def _key(sha: str) -> str:
    return f"farm/sha256/{sha[:2]}/{sha[2:]}"


def _keys(server: MotoServer, bucket: str, prefix: str = "farm/sha256/") -> list[str]:
    return [o["Key"] for o in server.client().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


def _uploads(server: MotoServer, bucket: str) -> list[str]:
    return [u["Key"] for u in server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def _tree(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "weights.bin").write_bytes(os.urandom(300_000))
    (root / "sub" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "sub" / "run.sh", 0o755)
    return root


def test_put_get_dedupe_multipart_and_a_cold_worker(moto_s3: MotoServer, s3_bucket: str, tmp_path: Path) -> None:
    a = _store(moto_s3, s3_bucket, tmp_path / "a")
    big = os.urandom(5 * PART + 1234)  # six parts
    ref = a.put(big, ArtifactKind.ENGINE)
    assert ref.sha256 == hashlib.sha256(big).hexdigest() and (ref.size, ref.packing) == (len(big), Packing.FILE)
    f = tmp_path / "small.json"
    f.write_bytes(b'{"ok": 1}')
    small = a.put(f, ArtifactKind.REPORT)
    tree = a.put(_tree(tmp_path / "onnx"), ArtifactKind.ONNX)
    local = ArtifactStore(tmp_path / "local")  # the same tree has the same name in both stores
    assert tree.packing is Packing.TAR and local.put(tmp_path / "onnx").sha256 == tree.sha256
    assert a.put(big).sha256 == ref.sha256  # stored once
    assert sorted(_keys(moto_s3, s3_bucket)) == sorted(_key(r.sha256) for r in (ref, small, tree))
    assert sorted(a.list()) == sorted(r.sha256 for r in (ref, small, tree))
    assert _uploads(moto_s3, s3_bucket) == []

    b = _store(moto_s3, s3_bucket, tmp_path / "b")  # another worker: an empty cache
    assert b.ref(ref.sha256, ArtifactKind.ENGINE, Packing.FILE) == ref
    assert b.read_bytes(ref.sha256) == big
    assert b.get_file(small.sha256, tmp_path / "out" / "s.json").read_bytes() == b'{"ok": 1}'
    out = b.extract(tree.sha256, tmp_path / "restored")
    assert (out / "weights.bin").read_bytes() == (tmp_path / "onnx" / "weights.bin").read_bytes()
    assert os.access(out / "sub" / "run.sh", os.X_OK)
    assert b.verify() == [] and b.has(ref.sha256)
    with pytest.raises(MissingArtifactError, match="0" * 64):
        b.read_bytes("0" * 64)
    with pytest.raises(MissingArtifactError, match="s3://"):
        b.ref("0" * 64, ArtifactKind.ENGINE, Packing.FILE)
    assert not b.has("0" * 64)
    with pytest.raises(ConfigurationError, match="'nothex'"):
        b.has("nothex")
    with pytest.raises(ConfigurationError, match="tarball"):
        b.put(b"x", "tarball")


def test_server_killed_mid_upload_leaves_nothing_and_a_retry_succeeds(moto_s3: MotoServer, s3_bucket: str,
                                                                     tmp_path: Path) -> None:
    link = Link(target=moto_s3.port)
    link.start()
    store = _store(moto_s3, s3_bucket, tmp_path / "cache", endpoint=link.endpoint)
    data = os.urandom(16 * PART)
    sha = hashlib.sha256(data).hexdigest()
    link.on_cut.append(moto_s3.kill)
    link.cut_after(5 * PART)  # a few parts in
    try:
        t0 = time.monotonic()
        with pytest.raises(InfrastructureError, match=r"S3 \w+ s3://.* failed 3 time\(s\)") as err:
            store.put(data, ArtifactKind.ENGINE)
        assert time.monotonic() - t0 < 20 and "testing-secret" not in str(err.value)
    finally:
        moto_s3.kill()
        moto_s3.start()  # a crashed server comes back (moto's comes back empty: the bucket is made again)
        moto_s3.create_bucket(s3_bucket)
        link.restore()
    assert _keys(moto_s3, s3_bucket, "") == [] and _uploads(moto_s3, s3_bucket) == []
    ref = store.put(data, ArtifactKind.ENGINE)  # the stage's retry
    assert ref.sha256 == sha and _keys(moto_s3, s3_bucket) == [_key(sha)]
    assert _store(moto_s3, s3_bucket, tmp_path / "cold", endpoint=link.endpoint).read_bytes(sha) == data
    link.close()


def test_a_dropped_connection_is_retried_with_backoff(moto_s3: MotoServer, s3_bucket: str, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    link = Link(target=moto_s3.port)
    link.start()
    store = _store(moto_s3, s3_bucket, tmp_path / "cache", endpoint=link.endpoint)
    data = os.urandom(6 * PART)
    link.cut_after(2 * PART, stay_down=False)  # the connections drop once; the server lives on
    with caplog.at_level(logging.WARNING, logger="edgefarm.artifacts.s3"):
        ref = store.put(data)
    link.close()
    assert link.cuts == 1 and any("try 2 of 3" in r.getMessage() for r in caplog.records)
    assert _keys(moto_s3, s3_bucket) == [_key(ref.sha256)] and _uploads(moto_s3, s3_bucket) == []
    assert _store(moto_s3, s3_bucket, tmp_path / "cold").read_bytes(ref.sha256) == data


def test_a_refused_upload_is_aborted_and_a_running_one_survives_gc(moto_s3: MotoServer, s3_bucket: str,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # parts under the server's minimum: refused at completion (a request error, not retried), the upload aborted
    tiny = S3ArtifactStore(S3Location(s3_bucket, "farm"), cache_dir=tmp_path / "c", cache_bytes=1 << 20,
                           environ=moto_s3.env(), part_size=16 * 1024, retry=FAST)
    with pytest.raises(ConfigurationError, match="EntityTooSmall"):
        tiny.put(os.urandom(40 * 1024))
    assert _uploads(moto_s3, s3_bucket) == [] and _keys(moto_s3, s3_bucket) == []
    assert _keys(moto_s3, s3_bucket, "farm/uploads/") == []

    # a put still running (held inside its second part) is never aborted, even by gc(older_than_s=0)
    store = _store(moto_s3, s3_bucket, tmp_path / "cache", put_deadline_s=1.0)
    entered, go_on = threading.Event(), threading.Event()
    send = store._client.upload_part

    def held_part(**kwargs: object) -> object:
        if kwargs["PartNumber"] == 2:
            entered.set()
            go_on.wait(30)
        return send(**kwargs)

    monkeypatch.setattr(store._client, "upload_part", held_part)
    data, refs = os.urandom(4 * PART), []
    writer = threading.Thread(target=lambda: refs.append(store.put(data)))
    writer.start()
    assert entered.wait(30)
    store.gc(set(), older_than_s=0)
    go_on.set()
    writer.join(30)
    assert len(refs) == 1 and _keys(moto_s3, s3_bucket) == [_key(refs[0].sha256)]
    assert _uploads(moto_s3, s3_bucket) == [] and _keys(moto_s3, s3_bucket, "farm/uploads/") == []


def test_corrupt_object_is_quarantined_and_a_miss_so_it_is_rebuilt(moto_s3: MotoServer, s3_bucket: str,
                                                                   tmp_path: Path) -> None:
    producer = _store(moto_s3, s3_bucket, tmp_path / "producer")
    data = os.urandom(3 * PART)
    ref = producer.put(data, ArtifactKind.ENGINE)
    client = moto_s3.client()

    def rot() -> None:  # same size and metadata: only the bytes say it is wrong
        client.put_object(Bucket=s3_bucket, Key=_key(ref.sha256), Body=os.urandom(len(data)),
                          Metadata={"sha256": ref.sha256})

    rot()
    assert producer.verify() == [ref.sha256]
    consumer = _store(moto_s3, s3_bucket, tmp_path / "consumer")
    assert not consumer.has(ref.sha256)  # a miss, not a failure
    assert _keys(moto_s3, s3_bucket) == [_key(ref.sha256)]  # kept: a reader removes nothing (issue 40 item 1)
    with pytest.raises(CorruptArtifactError):
        consumer.read_bytes(ref.sha256)
    assert producer.put(data, ArtifactKind.ENGINE) == ref  # the stage runs again: read back, found corrupt, replaced
    assert consumer.has(ref.sha256) and consumer.read_bytes(ref.sha256) == data

    rot()  # a read without has(): never served, nothing half-written at the destination, nothing removed
    dest = tmp_path / "engine.bin"
    with pytest.raises(CorruptArtifactError, match=f"sha256:{ref.sha256}.*corrupt"):
        _store(moto_s3, s3_bucket, tmp_path / "third").get_file(ref.sha256, dest)
    assert not dest.exists() and _keys(moto_s3, s3_bucket) == [_key(ref.sha256)]

    # a rotten copy in a worker's cache is fetched again from the bucket (the bucket's copy is good)
    producer.put(data)
    cached = consumer.cache.local.path(ref.sha256)
    os.chmod(cached, 0o644)
    cached.write_bytes(b"bit rot")
    assert consumer.has(ref.sha256) and consumer.read_bytes(ref.sha256) == data


def test_two_writers_put_the_same_content_at_once(moto_s3: MotoServer, s3_bucket: str, tmp_path: Path) -> None:
    data = os.urandom(12 * PART)
    writers = [_store(moto_s3, s3_bucket, tmp_path / f"w{i}") for i in range(2)]
    start = threading.Barrier(2)
    refs, errors = [], []

    def put(store: S3ArtifactStore) -> None:
        start.wait()
        try:
            refs.append(store.put(data, ArtifactKind.ENGINE))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and len(refs) == 2 and refs[0] == refs[1]
    assert _keys(moto_s3, s3_bucket) == [_key(refs[0].sha256)] and _uploads(moto_s3, s3_bucket) == []
    assert _store(moto_s3, s3_bucket, tmp_path / "reader").read_bytes(refs[0].sha256) == data


def test_read_through_cache_is_bounded_lru_and_never_evicts_what_is_in_use(moto_s3: MotoServer, s3_bucket: str,
                                                                           tmp_path: Path) -> None:
    store = _store(moto_s3, s3_bucket, tmp_path / "cache", cache_bytes=250_000)
    blobs = [os.urandom(100_000) for _ in range(3)]
    refs = [store.put(b) for b in blobs]

    def cached() -> set[int]:
        return {i for i, r in enumerate(refs) if store.cache.local.path(r.sha256).exists()}

    assert cached() == {1, 2} and store.cache.size() <= 250_000  # the least recently used went first
    held = store.cache.open(refs[1].sha256)  # in use (e.g. being copied to a device)
    assert held is not None
    store.read_bytes(refs[2].sha256)  # refs[2] used after refs[1]: refs[1] is the least recently used now
    assert store.read_bytes(refs[0].sha256) == blobs[0]  # fetched again; room is made by evicting ...
    assert cached() == {0, 1}  # ... refs[2], not the held refs[1]
    small = _store(moto_s3, s3_bucket, tmp_path / "cache", cache_bytes=50_000)  # a bound below what is held
    small.cache.shrink()
    assert cached() == {1}  # over the bound only by what is in use
    held.close()
    small.cache.shrink()
    assert cached() == set() and len(_keys(moto_s3, s3_bucket)) == 3  # the bucket keeps every blob


def test_gc_keeps_referenced_young_and_reput_blobs_and_aborts_dead_uploads(moto_s3: MotoServer, s3_bucket: str,
                                                                            tmp_path: Path) -> None:
    store = _store(moto_s3, s3_bucket, tmp_path / "cache", put_deadline_s=1.0)
    kept, garbage, reput = store.put(b"referenced"), store.put(b"garbage"), store.put(b"put again later")
    store._begin_upload(_key("a" * 64), {})  # what a killed put leaves: an upload nobody completes
    store.gc({kept.sha256, garbage.sha256, reput.sha256}, older_than_s=0)
    assert _uploads(moto_s3, s3_bucket) == [_key("a" * 64)]  # it could still be a running put's
    time.sleep(3.0)  # S3 times have a resolution of a second
    store._begin_upload(_key("b" * 64), {})
    young = store.put(b"young")
    store.put(b"put again later")  # deduplicated: only its marker is rewritten, so gc spares the new reference
    assert store.gc({kept.sha256}, older_than_s=2.0) == [garbage.sha256]
    assert sorted(store.list()) == sorted(r.sha256 for r in (kept, reput, young))
    assert not store.cache.local.path(garbage.sha256).exists()
    # the dead upload (older than twice the put deadline) is aborted, the young one kept
    assert _uploads(moto_s3, s3_bucket) == [_key("b" * 64)] and len(_keys(moto_s3, s3_bucket, "farm/uploads/")) == 1
    with pytest.raises(ConfigurationError, match="-1"):
        store.gc(set(), older_than_s=-1)


def test_a_store_outage_while_staging_inputs_blames_no_device(moto_s3: MotoServer, s3_bucket: str,
                                                              s3_env: dict[str, str], tmp_path: Path) -> None:
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgefarm.tasks.device_exec import run_stage
    from edgefarm.tasks.farm import Farm, FarmContext

    inventory, db = tmp_path / "inventory", f"sqlite:///{tmp_path / 'farm.db'}"
    inventory.mkdir()
    (inventory / "box.yaml").write_text(f"type: x86-cpu\ntransport: local\nwork_dir: {tmp_path / 'device'}\n"
                                        f"python: {sys.executable}\nenv: {{PYTHONPATH: {REPO}}}\n")
    engine = make_engine(db)
    upgrade(engine)
    engine.dispose()
    ctx = FarmContext(run_id=1, db_url=db, data_dir=str(tmp_path / "data"), inventory_dir=str(inventory),
                      artifacts=f"s3://{s3_bucket}/farm")
    farm = Farm.get(ctx)
    try:
        assert isinstance(farm.store, S3ArtifactStore)
        ref = farm.store.put(b"an input" * 1000)
        farm.store = _store(moto_s3, s3_bucket, tmp_path / "cold", endpoint=f"http://127.0.0.1:{free_port()}")
        with pytest.raises(StoreError, match=r"GetObject .* failed 3 time\(s\)"):
            run_stage(farm, platform="x86-cpu", what="test stage", argv=lambda d, t, j: ["true"], inputs=[ref],
                      timeout=60)
        assert farm.bad_devices == set()  # the device did nothing wrong: the stage's own retry applies
    finally:
        Farm.close(ctx)


@pytest.mark.parametrize(("url", "message"), [
    ("s3://AKIAEXAMPLE:hunter2@bucket/x", r"'s3://AKIAEXAMPLE:\*\*\*@bucket/x'.*credentials do not go in the URL"),
    ("s3://bucket/x?secret=hunter2", r"secret=\*\*\*.*no query"),
    ("s3://", "no bucket"),
    ("s3://Bad_Bucket/x", "bad S3 bucket name 'Bad_Bucket'"),
    ("gs://bucket", "unknown scheme 'gs'"),
    ("relative/dir", "unknown scheme 'none'"),
    ("file://host/dir", "absolute local path"),
])
def test_a_bad_artifacts_url_is_refused_with_secrets_hidden(url: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=message) as err:
        Settings.resolve(data_dir=tmp_path, create=False, environ={"EDGEFARM_ARTIFACTS": url})
    assert "hunter2" not in str(err.value) and "EDGEFARM_ARTIFACTS" in str(err.value)


def test_the_store_is_chosen_by_edgefarm_artifacts(moto_s3: MotoServer, s3_bucket: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    default = Settings.resolve(data_dir=data, environ={})
    assert default.artifacts is None
    store = default.artifact_store()
    assert isinstance(store, ArtifactStore) and store.root == data / "artifacts"
    assert isinstance(open_store(f"file://{tmp_path}/shared", data, environ={}), ArtifactStore)
    assert parse_artifacts_url("/mnt/store") == Path("/mnt/store")

    env = {**moto_s3.env(), "EDGEFARM_ARTIFACTS": f"s3://{s3_bucket}/farm/", "EDGEFARM_ARTIFACT_CACHE_GB": "0.5"}
    settings = Settings.resolve(data_dir=data, environ=env)
    assert (settings.artifacts, settings.artifact_cache_gb) == (f"s3://{s3_bucket}/farm/", 0.5)
    assert "testing-secret" not in repr(settings)
    s3 = open_store(settings.artifacts, data, cache_gb=settings.artifact_cache_gb, environ=env)
    assert isinstance(s3, S3ArtifactStore) and s3.location == S3Location(s3_bucket, "farm")
    assert s3.cache.max_bytes == 1 << 29 and s3.cache.local.root == data / "artifact-cache"
    assert "testing" not in repr(s3)

    with pytest.raises(ConfigurationError, match=r"bucket 'no-such-bucket' does not exist.*EDGEFARM_ARTIFACTS"):
        open_store("s3://no-such-bucket/farm", data, environ=env)
    no_keys = {k: v for k, v in env.items() if k != "AWS_SECRET_ACCESS_KEY"}
    with pytest.raises(ConfigurationError, match="AWS_SECRET_ACCESS_KEY not set"):
        open_store(settings.artifacts, data, environ=no_keys)
    leaky = {**env, "AWS_ENDPOINT_URL": f"http://user:hunter2@127.0.0.1:{moto_s3.port}"}
    with pytest.raises(ConfigurationError, match="bad AWS_ENDPOINT_URL") as err:  # refused (issue 40 item 6)
        _store(moto_s3, s3_bucket, tmp_path / "c", endpoint=leaky["AWS_ENDPOINT_URL"])
    assert "hunter2" not in str(err.value) and "***@127.0.0.1" in str(err.value)
    with pytest.raises(ConfigurationError, match="EDGEFARM_ARTIFACT_CACHE_GB 'lots'"):
        Settings.resolve(data_dir=data, environ={"EDGEFARM_ARTIFACT_CACHE_GB": "lots"})


def test_a_farm_run_keeps_its_artifacts_in_the_bucket(prefect_harness: Path, moto_s3: MotoServer, s3_bucket: str,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgefarm.cli import app
    from edgefarm.results.db import make_engine
    from edgefarm.results.models import ArtifactRecord

    data, inventory = tmp_path / "data", tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"),
        "labels": ["cpu", "local"], "max_jobs": 2,
        "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    matrix = tmp_path / "s3.yml"
    matrix.write_text(yaml.safe_dump({
        "name": "s3", "models": ["stories260K"], "precisions": ["fp32"], "platforms": ["x86-cpu"],
        "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                     "stages": ["export", "build", "infer"]}}))
    for name, value in moto_s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("EDGEFARM_ARTIFACTS", f"s3://{s3_bucket}/farm")
    monkeypatch.setenv("EDGEFARM_ARTIFACT_CACHE_GB", "0.001")  # about 1 MB: entries are evicted as the run goes
    monkeypatch.delenv("EDGEFARM_DB_URL", raising=False)
    result = CliRunner().invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--inventory", str(inventory),
                                      "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    summary, _ = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index('{\n  "run_id"'):])
    assert summary["failed"] == [] and summary["plan"] == {"run": 1}

    stored = set(_keys(moto_s3, s3_bucket))
    engine = make_engine(f"sqlite:///{data / 'edgefarm.db'}")
    with Session(engine) as s:
        recorded = set(s.scalars(select(ArtifactRecord.sha256)))
    engine.dispose()
    assert recorded and {_key(sha) for sha in recorded} <= stored  # every recorded artifact is in the bucket
    assert not (data / "artifacts").exists()  # no local store
    cache = data / "artifact-cache" / "sha256"
    cached = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    assert cached <= (1 << 30) * 0.001 < sum(o["Size"] for o in moto_s3.client().list_objects_v2(
        Bucket=s3_bucket, Prefix="farm/sha256/")["Contents"])
    assert "testing-secret" not in result.output
    swept = CliRunner().invoke(app, ["gc", "--older-than-days", "0", "--data-dir", str(data)])
    assert swept.exit_code == 0 and "referenced blob(s) kept" in swept.output, swept.output
    assert {_key(sha) for sha in recorded} <= set(_keys(moto_s3, s3_bucket))  # gc kept every live result's
