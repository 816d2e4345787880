"""Hostile inputs, round three (issue 40, items 1, 4, 6, 7, 12): the artifact store's reader never destroys evidence
(a damaged transfer is fetched again, a corrupt object is quarantined, never deleted), a put never returns a
reference to bad bytes, secrets in any form of URL never show, stage commands get no credentials, and a URL with
control characters is refused."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from botocore.exceptions import EndpointConnectionError
from botocore.response import StreamingBody
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.artifacts.location import S3Location, open_store
from edgefarm.artifacts.s3 import Retry, S3ArtifactStore
from edgefarm.artifacts.store import ArtifactStore, CorruptArtifactError, StoreError
from edgefarm.cli import app
from edgefarm.devices.transport.local import LocalTransport
from edgellm.errors import ConfigurationError, InfrastructureError
from edgellm.redact import HIDDEN, redact
from tests.fixtures.moto import Link, MotoServer
from tests.test_cli_show import _farm

AWS_SECRET = "wJalr/K7MD+bPx"  # AWS secret keys hold '/' and '+'
FAST = Retry(attempts=5, base_s=0.0, max_s=0.0)


def _show(tmp_path: Path, env: dict[str, str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["show", "00000000", "--data-dir", str(tmp_path)],
                                env={"COLUMNS": "250", **env})
    return result.exit_code, result.stdout + result.stderr


# --- 6. a secret in any form of URL never shows ------------------------------------------------------------------

SECRET_TEXTS = [
    f"s3://AKIAX:{AWS_SECRET}@farm/edge",
    f"http://AKIAX:{AWS_SECRET}@127.0.0.1:9000/farm",
    f"https://u:p@{AWS_SECRET}@minio.example/farm",  # an '@' in the secret: up to the last '@'
    f'Could not connect to the endpoint URL: "http://AKIAX:{AWS_SECRET}@127.0.0.1:9/farm"',
    f"https://minio.example/farm/x?X-Amz-Credential=AKIAX%2F20261206&X-Amz-Signature={AWS_SECRET}",
    f"https://h/x?X-Amz-Security-Token={AWS_SECRET}&x=1",
    f"https://h/x?AWSAccessKeyId=AKIAX&Signature={AWS_SECRET}",
    f"https://h/x?password={AWS_SECRET}",
    f"https://ghp_{AWS_SECRET.replace('/', 'a')}xxxxxxxxxx@github.com/x",  # a token as the user name
    f"Authorization: AWS4-HMAC-SHA256 Credential=AKIAX/20261206/us-east-1, Signature={AWS_SECRET}",
    f"postgresql+psycopg://farm:{AWS_SECRET}@db.example/edgefarm",
]


@pytest.mark.parametrize("text", SECRET_TEXTS)
def test_every_form_of_url_secret_is_hidden(text: str) -> None:
    shown = redact(text)
    secret = AWS_SECRET.replace("/", "a") if "ghp_" in text else AWS_SECRET
    assert secret not in shown and "K7MD" not in shown and "***" in shown, shown
    assert "wJalr" not in shown, shown  # not even the part before the '/'


def test_a_plain_url_keeps_what_identifies_the_place() -> None:
    assert redact("s3://farm/edge at http://127.0.0.1:9000") == "s3://farm/edge at http://127.0.0.1:9000"
    assert redact("postgresql://farm@db/e?sslmode=require") == "postgresql://farm@db/e?sslmode=require"
    assert redact("mail admin@example.com") == "mail admin@example.com"


@pytest.mark.parametrize("url", [f"s3://AKIAX:{AWS_SECRET}@farm/edge", f"s3://AKIAX:{AWS_SECRET}@farm",
                                 f"s3://farm/edge?X-Amz-Signature={AWS_SECRET}"])
def test_show_never_prints_a_secret_of_the_artifacts_url(url: str, tmp_path: Path) -> None:
    code, output = _show(tmp_path, {"EDGEFARM_ARTIFACTS": url})
    assert code == 2, output
    assert "EDGEFARM_ARTIFACTS" in output, output
    assert "wJalr" not in output and "K7MD" not in output, output


def test_an_endpoint_with_credentials_is_refused_without_showing_them(tmp_path: Path) -> None:
    env = {"AWS_ENDPOINT_URL": f"http://AKIAX:{AWS_SECRET}@127.0.0.1:9", "AWS_ACCESS_KEY_ID": "id",
           "AWS_SECRET_ACCESS_KEY": "key"}
    with pytest.raises(ConfigurationError, match="AWS_ENDPOINT_URL") as err:
        open_store("s3://farm/edge", tmp_path, environ=env)
    assert "wJalr" not in str(err.value) and "K7MD" not in str(err.value)


def test_retry_warnings_and_the_final_error_hide_a_secret_the_client_names(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "key"}
    store = S3ArtifactStore(S3Location("farm", "edge"), cache_dir=tmp_path, cache_bytes=1 << 20, environ=env,
                            retry=FAST)

    def refuse(**_: object) -> None:  # what botocore raises, naming the URL it used (a proxy's, say)
        raise EndpointConnectionError(endpoint_url=f"http://AKIAX:{AWS_SECRET}@127.0.0.1:9/farm")

    store._client.head_bucket = refuse
    with caplog.at_level(logging.WARNING, logger="edgefarm.artifacts.s3"), pytest.raises(StoreError) as err:
        store.check()
    warnings = [r.getMessage() for r in caplog.records if "HeadBucket" in r.getMessage()]
    assert len(warnings) == 4  # five tries, a warning before each of the last four
    for text in [*warnings, str(err.value)]:
        assert "wJalr" not in text and "K7MD" not in text and "***" in text, text


# --- 12. a URL with control or invisible characters is refused ---------------------------------------------------

@pytest.mark.parametrize(("url", "escaped"), [
    ("s3://fa\nrm/edge", r"s3://fa\nrm/edge"),
    ("s3://farm/ed\tge", r"s3://farm/ed\tge"),
    ("s3://farm\r/edge", r"s3://farm\r/edge"),
    ("s3://farm/\x1b[31medge", r"\x1b[31medge"),
    ("s3://farm\u202e/egde", r"\u202e"),
    ("/srv/arti\nfacts", r"/srv/arti\nfacts"),
])
def test_a_url_with_control_characters_is_refused_naming_it_escaped(url: str, escaped: str, tmp_path: Path) -> None:
    code, output = _show(tmp_path, {"EDGEFARM_ARTIFACTS": url})
    assert code == 2, output
    assert escaped in output and "control or invisible character" in output and "valid: " in output, output


# --- 1. a reader never deletes evidence; 4. a put never returns a reference to bad bytes -------------------------

PART = 128 * 1024


class Damage:
    """A transfer that flips one byte of what GetObject hands over (after botocore, so its response checksums
    cannot see it), for the next ``times`` blob reads; ``vary``: a different byte each time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, times: int, *, vary: bool = False) -> None:
        self.left, self.done = times, 0
        original = StreamingBody.iter_chunks

        def iter_chunks(body: StreamingBody, chunk_size: int = 1024) -> Iterator[bytes]:
            damage = self.left > 0
            if damage:
                self.left, self.done = self.left - 1, self.done + 1
            for i, chunk in enumerate(original(body, chunk_size)):
                if damage and i == 0 and chunk:
                    at = self.done % len(chunk) if vary else 0
                    chunk = chunk[:at] + bytes([chunk[at] ^ 0xFF]) + chunk[at + 1:]
                yield chunk

        monkeypatch.setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")  # MinIO/Ceph settings
        monkeypatch.setattr(StreamingBody, "iter_chunks", iter_chunks)


def _s3(server: MotoServer, bucket: str, cache: Path) -> S3ArtifactStore:
    return S3ArtifactStore(S3Location(bucket, "farm"), cache_dir=cache, cache_bytes=64 << 20, environ=server.env(),
                           part_size=PART, retry=Retry(attempts=3, base_s=0.01, max_s=0.02))


def _objects(server: MotoServer, bucket: str, prefix: str) -> dict[str, bytes]:
    client = server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return {k: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}


def _rot(server: MotoServer, bucket: str, sha: str, size: int) -> bytes:
    """The object's bytes replaced, same size and metadata: only its bytes say it is wrong."""
    bad = os.urandom(size)
    server.client().put_object(Bucket=bucket, Key=f"farm/sha256/{sha[:2]}/{sha[2:]}", Body=bad,
                               Metadata={"sha256": sha})
    return bad


def test_a_transfer_damaged_once_is_fetched_again_and_served(moto_s3: MotoServer, s3_bucket: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    data = os.urandom(2 * PART)
    ref = _s3(moto_s3, s3_bucket, tmp_path / "producer").put(data, ArtifactKind.ENGINE)
    before = _objects(moto_s3, s3_bucket, "farm/sha256/")
    Damage(monkeypatch, times=1)
    with caplog.at_level(logging.WARNING, logger="edgefarm.artifacts.s3"):
        assert _s3(moto_s3, s3_bucket, tmp_path / "reader").read_bytes(ref.sha256) == data
    assert _objects(moto_s3, s3_bucket, "farm/sha256/") == before  # nothing removed
    assert _objects(moto_s3, s3_bucket, "farm/quarantine/") == {}  # nothing judged corrupt
    assert any("fetched again" in r.getMessage() for r in caplog.records)


def test_a_transfer_damaged_every_time_is_the_networks_fault_and_removes_nothing(
        moto_s3: MotoServer, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(2 * PART)
    ref = _s3(moto_s3, s3_bucket, tmp_path / "producer").put(data, ArtifactKind.ENGINE)
    before = _objects(moto_s3, s3_bucket, "farm/sha256/")
    Damage(monkeypatch, times=99, vary=True)
    reader = _s3(moto_s3, s3_bucket, tmp_path / "reader")
    with pytest.raises(StoreError, match="damaged on the way") as err:
        reader.read_bytes(ref.sha256)
    assert not isinstance(err.value, CorruptArtifactError) and isinstance(err.value, InfrastructureError)
    assert _objects(moto_s3, s3_bucket, "farm/sha256/") == before
    assert _objects(moto_s3, s3_bucket, "farm/quarantine/") == {}


def test_a_corrupt_object_is_quarantined_never_deleted(moto_s3: MotoServer, s3_bucket: str, tmp_path: Path) -> None:
    data = os.urandom(2 * PART)
    ref = _s3(moto_s3, s3_bucket, tmp_path / "producer").put(data, ArtifactKind.ENGINE)
    bad = _rot(moto_s3, s3_bucket, ref.sha256, len(data))
    reader = _s3(moto_s3, s3_bucket, tmp_path / "reader")
    with pytest.raises(CorruptArtifactError, match="copied aside"):
        reader.read_bytes(ref.sha256)
    assert not reader.has(ref.sha256)  # a miss: its stage runs again
    assert list(_objects(moto_s3, s3_bucket, "farm/sha256/").values()) == [bad]  # kept where it was
    aside = _objects(moto_s3, s3_bucket, "farm/quarantine/")
    copies = [v for k, v in aside.items() if not k.endswith(".json")]
    records = [json.loads(v) for k, v in aside.items() if k.endswith(".json")]
    assert copies == [bad] and len(records) == 1  # once per object, however often it is read
    assert records[0]["sha256"] == ref.sha256 and records[0]["content_sha256"] == hashlib.sha256(bad).hexdigest()
    assert records[0]["found_by"] == "a read"


def test_a_put_over_a_corrupt_copy_replaces_it_and_keeps_the_evidence(moto_s3: MotoServer, s3_bucket: str,
                                                                     tmp_path: Path) -> None:
    data = os.urandom(2 * PART)
    ref = _s3(moto_s3, s3_bucket, tmp_path / "first").put(data, ArtifactKind.ENGINE)
    bad = _rot(moto_s3, s3_bucket, ref.sha256, len(data))
    again = _s3(moto_s3, s3_bucket, tmp_path / "second").put(data, ArtifactKind.ENGINE)  # HEAD looks right
    assert again == ref
    assert list(_objects(moto_s3, s3_bucket, "farm/sha256/").values()) == [data]  # the reference is to good bytes
    assert _s3(moto_s3, s3_bucket, tmp_path / "reader").read_bytes(ref.sha256) == data
    copies = [v for k, v in _objects(moto_s3, s3_bucket, "farm/quarantine/").items() if not k.endswith(".json")]
    assert copies == [bad]

    truncated = data[:PART]  # another size: not even read, but kept aside before it is replaced
    moto_s3.client().put_object(Bucket=s3_bucket, Key=f"farm/sha256/{ref.sha256[:2]}/{ref.sha256[2:]}",
                                Body=truncated)
    assert _s3(moto_s3, s3_bucket, tmp_path / "third").put(data, ArtifactKind.ENGINE) == ref
    assert list(_objects(moto_s3, s3_bucket, "farm/sha256/").values()) == [data]
    copies = [v for k, v in _objects(moto_s3, s3_bucket, "farm/quarantine/").items() if not k.endswith(".json")]
    assert sorted(copies) == sorted([bad, truncated])


def test_show_over_a_damaged_transfer_removes_nothing(tmp_path: Path, s3_env: dict[str, str], s3_bucket: str,
                                                     moto_s3: MotoServer, monkeypatch: pytest.MonkeyPatch) -> None:
    url, data = f"s3://{s3_bucket}/farm", tmp_path / "data"
    store = open_store(url, data, environ=s3_env)
    try:
        refs = _farm(data, store)
    finally:
        store.close()
    shutil.rmtree(data / "artifact-cache")  # what show reads comes from the bucket
    before = _objects(moto_s3, s3_bucket, "farm/sha256/")
    log_id = f"log:{refs['log'].sha256[:12]}"
    Damage(monkeypatch, times=1)
    result = CliRunner().invoke(app, ["show", log_id, "--tail", "1", "--data-dir", str(data)],
                                env={"EDGEFARM_ARTIFACTS": url})
    assert result.exit_code == 0 and result.stdout == "last line\n", result.output
    Damage(monkeypatch, times=99)  # the same byte every time: judged corrupt, yet nothing is removed
    shutil.rmtree(data / "artifact-cache")
    result = CliRunner().invoke(app, ["show", log_id, "--data-dir", str(data)], env={"EDGEFARM_ARTIFACTS": url})
    assert result.exit_code == 3 and "corrupt" in result.output, result.output
    assert _objects(moto_s3, s3_bucket, "farm/sha256/") == before


# --- 7. stage commands on a local device get no credential of ours -----------------------------------------------

CREDENTIALS = {
    "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "AWS_ACCESS_KEY_ID": "AKIAX", "AWS_SESSION_TOKEN": "s3ss10n",
    "EDGEFARM_DB_URL": "postgresql+psycopg://farm:pw0rd@db/edgefarm", "PGPASSWORD": "pgpw0rd",
    "GITHUB_TOKEN": "ghp_t0ken", "HF_TOKEN": "hf_t0ken", "VENDOR_API_KEY": "k3y", "SERVICE_PASSWORD": "sp4ss",
    "MY_CLIENT_SECRET": "cl13nt", "PREFECT_API_AUTH_STRING": "admin:4uth", "SSH_AUTH_SOCK": "/tmp/agent.sock",
    "HTTPS_PROXY": "http://proxyuser:pr0xypw@proxy.example:3128",  # a secret in the value, not the name
}


def test_a_stage_command_on_a_local_device_gets_no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # no credential, though its name starts like one
    transport = LocalTransport("local-cpu", tmp_path, env={"DEVICE_SETTING": "from the inventory"})
    result = transport.run(["env"], timeout=60, env={"STEP_SETTING": "from the step"})
    assert result.ok, result.stderr
    seen = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert sorted(set(CREDENTIALS) & set(seen)) == []
    for value in CREDENTIALS.values():
        assert value not in result.stdout
    assert seen["PATH"] == os.environ["PATH"] and seen["TOKENIZERS_PARALLELISM"] == "false"
    assert seen["DEVICE_SETTING"] == "from the inventory" and seen["STEP_SETTING"] == "from the step"


def test_a_host_tool_of_a_toolchain_gets_no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgefarm.toolchains.onnxruntime_genai.export import offline_env
    from edgefarm.toolchains.process import run_tool

    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    run = run_tool(["env"], env={"HF_HUB_OFFLINE": "1"}, log=tmp_path / "env.log", timeout=60)
    text = (tmp_path / "env.log").read_text()
    assert run.returncode == 0 and "HF_HUB_OFFLINE=1" in text and "PATH=" in text
    builder = offline_env(tmp_path)
    assert builder["HF_HUB_OFFLINE"] == "1" and builder["PATH"] == os.environ["PATH"]
    for name, value in CREDENTIALS.items():
        assert value not in text and name not in builder, name


def test_the_local_store_moves_a_corrupt_blob_aside_never_deletes_it(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "artifacts")
    data = os.urandom(4096)
    ref = store.put(data, ArtifactKind.ENGINE)

    def rot() -> bytes:
        blob = store.path(ref.sha256)
        os.chmod(blob, 0o644)
        bad = os.urandom(len(data))
        blob.write_bytes(bad)
        return bad

    first = rot()
    assert not store.has(ref.sha256) and not store.path(ref.sha256).exists()  # a miss: rebuilt
    assert store.put(data, ArtifactKind.ENGINE) == ref and store.read_bytes(ref.sha256) == data
    second = rot()
    assert store.put(data, ArtifactKind.ENGINE) == ref and store.read_bytes(ref.sha256) == data  # replaced
    aside = {p.name: p.read_bytes() for p in (tmp_path / "artifacts" / "quarantine").iterdir()}
    assert aside == {f"{ref.sha256}.{hashlib.sha256(b).hexdigest()}": b for b in (first, second)}
    assert list(store.list()) == [ref.sha256]


@pytest.mark.parametrize("url", ["sqlite:////tmp/fa\nrm.db", "postgresql+psycopg://u:pw@h\n/db",
                                 "postgresql+psycopg://u@h/d\u202eb"])
def test_a_database_url_with_control_characters_is_refused(url: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["show", "00000000", "--db", url, "--data-dir", str(tmp_path)],
                                env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.output
    assert "control or invisible character" in result.output and "valid: sqlite:///PATH or postgresql" in result.output
    assert "USER:PASSWORD@HOST" in result.output and ":pw@" not in result.output


def test_a_byte_flipped_on_the_wire_is_fetched_again_and_nothing_is_removed(
        moto_s3: MotoServer, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")  # the SDK's own check off (MinIO/Ceph)
    data = os.urandom(4 * PART)
    ref = _s3(moto_s3, s3_bucket, tmp_path / "producer").put(data, ArtifactKind.ENGINE)
    before = _objects(moto_s3, s3_bucket, "farm/sha256/")
    link = Link(moto_s3.port)
    link.start()
    try:
        env = {**moto_s3.env(), "AWS_ENDPOINT_URL": link.endpoint}
        reader = S3ArtifactStore(S3Location(s3_bucket, "farm"), cache_dir=tmp_path / "reader", cache_bytes=64 << 20,
                                 environ=env, retry=Retry(attempts=3, base_s=0.01, max_s=0.02))
        link.flip_next(1)
        assert reader.read_bytes(ref.sha256) == data and link.flipped == 1
        reader.cache.evict(ref.sha256)
        link.flip_next(99)  # every transfer damaged: refused, as the network's fault or the object's, never deleted
        with pytest.raises(StoreError):
            reader.read_bytes(ref.sha256)
    finally:
        link.close()
    assert _objects(moto_s3, s3_bucket, "farm/sha256/") == before
    for key, kept in _objects(moto_s3, s3_bucket, "farm/quarantine/").items():  # a copy made by the server
        assert key.endswith(".json") or kept == data


@pytest.mark.parametrize("text", [" " * 20_000 + "x", "a://" * 50_000, "a." * 100_000, "&k='" * 50_000,
                                  ("k" + " " * 50) * 4_000, "http://u:p@" * 20_000])
def test_redaction_is_linear_on_hostile_text(text: str) -> None:
    started = time.monotonic()
    redact(text)
    assert time.monotonic() - started < 2.0  # quadratic patterns took 25 s on 20,000 spaces


@settings(max_examples=200, deadline=None)
@given(secret=st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=8,
                      max_size=40).filter(lambda s: s.strip() == s and not s.isspace()),
       scheme=st.sampled_from(["s3", "http", "https", "postgresql+psycopg", "redis"]),
       where=st.sampled_from(["", "Error: ", "could not reach '", 'endpoint URL: "', "at <"]))
def test_a_password_of_any_characters_never_shows(secret: str, scheme: str, where: str) -> None:
    rest = "@db.example:5432/edge?sslmode=require"
    text = f"{where}{scheme}://farm:{secret}{rest}"
    assume(secret not in f"{where}{scheme}://farm:{rest}" and secret not in ("PASSWORD", "SECRET"))
    assume(not any(c.isspace() for c in secret))
    shown = redact(text)
    assert secret not in shown and f"farm:{HIDDEN}@db.example" in shown, shown
