"""Hostile inputs, round three (issue 40, items 1, 4, 6, 7, 12): the artifact store's reader never destroys evidence
(a damaged transfer is fetched again, a corrupt object is quarantined, never deleted), a put never returns a
reference to bad bytes, secrets in any form of URL never show, stage commands get no credentials, and a URL with
control characters is refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from botocore.exceptions import EndpointConnectionError
from typer.testing import CliRunner

from artifacts.location import S3Location, open_store
from artifacts.s3 import Retry, S3ArtifactStore
from artifacts.store import StoreError
from edgellm.errors import ConfigurationError
from edgellm.redact import redact
from flows.cli import app

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
    with caplog.at_level(logging.WARNING, logger="artifacts.s3"), pytest.raises(StoreError) as err:
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
