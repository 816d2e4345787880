"""Where the artifact store keeps its bytes, chosen by one URL (``$EDGEFARM_ARTIFACTS``, read by flows.settings
and handed here):

- unset or empty: the embedded default, a local directory ``<data dir>/artifacts`` (``artifacts.store``);
- ``/an/absolute/path`` or ``file:///an/absolute/path``: a local (or mounted) directory there;
- ``s3://bucket`` or ``s3://bucket/prefix``: an S3-compatible bucket (``artifacts.s3``), with a size-bounded
  read-through cache under ``<data dir>/artifact-cache``.

The URL names a place, never a secret: the S3 endpoint, region and credentials come only from the standard
``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY`` of the environment the
opener hands in (its process's); a URL carrying credentials or a query is refused, and shown with them hidden.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from edgefarm.artifacts.store import ArtifactStore, Store
from edgellm.errors import ConfigurationError
from edgellm.redact import redact, unseen

SETTING = "$EDGEFARM_ARTIFACTS"  # named in messages (flows.settings reads it)
DEFAULT_CACHE_GB = 5.0
VALID = "unset (the data dir's artifacts/), an absolute directory, file:///DIR, s3://BUCKET or s3://BUCKET/PREFIX"
# S3's bucket naming rules: 3-63 of lowercase letters, digits, dots and hyphens, a letter or digit at each end
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
def redact_url(text: str) -> str:
    """``text`` with the secrets of any URL in it hidden (``edgellm.redact``, the one redaction)."""
    return redact(text)


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str = ""  # no leading or trailing slash; "" = the bucket's root

    def __post_init__(self) -> None:
        if not _BUCKET.fullmatch(self.bucket) or ".." in self.bucket:
            raise ConfigurationError(f"bad S3 bucket name {self.bucket!r}: need 3-63 lowercase letters, digits, "
                                     f"dots or hyphens, starting and ending with a letter or digit")
        if self.prefix != self.prefix.strip("/") or "//" in self.prefix:
            raise ConfigurationError(f"bad S3 prefix {self.prefix!r}: no leading, trailing or doubled slash")

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)


def parse_artifacts_url(url: str | None) -> S3Location | Path | None:
    """The store a URL names: None for the default, a Path for a local directory, an S3Location for a bucket.
    Refuses (naming the URL with any secret hidden, and the valid forms) what it cannot use."""
    if url is None or not url.strip():
        return None
    url = url.strip()
    shown = redact(url)
    if unseen(url):
        raise ConfigurationError(f"bad {SETTING} {shown!r}: it holds a control or invisible character (shown "
                                 f"escaped); a URL is printable text; valid: {VALID}")
    if url.startswith("/"):
        return Path(url)
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ConfigurationError(f"bad {SETTING} {shown!r}: a file URL names an absolute local path "
                                     f"(file:///DIR); valid: {VALID}")
        return Path(parts.path)
    if parts.scheme != "s3":
        raise ConfigurationError(f"bad {SETTING} {shown!r}: unknown scheme {parts.scheme or 'none'!r}; "
                                 f"valid: {VALID}")
    if "@" in url:  # anywhere: a secret holding '/' ends urlsplit's netloc before its '@'
        raise ConfigurationError(f"bad {SETTING} {shown!r}: no '@' allowed: credentials do not go in the URL; take "
                                 f"them out and set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY where the farm runs")
    if parts.query or parts.fragment or "?" in url or "#" in url:
        raise ConfigurationError(f"bad {SETTING} {shown!r}: no query or fragment allowed "
                                 f"(endpoint and region come from AWS_ENDPOINT_URL and AWS_REGION); valid: {VALID}")
    if not parts.netloc:
        raise ConfigurationError(f"bad {SETTING} {shown!r}: no bucket; valid: {VALID}")
    try:
        return S3Location(parts.netloc, parts.path.strip("/"))
    except ConfigurationError as exc:
        raise ConfigurationError(f"bad {SETTING} {shown!r}: {exc}") from None


def cache_bytes(gb: float) -> int:
    return int(gb * (1 << 30))


def open_store(url: str | None, data_dir: Path | str, *, environ: Mapping[str, str],
               cache_gb: float = DEFAULT_CACHE_GB) -> Store:
    """The store ``url`` names (see :func:`parse_artifacts_url`). An S3 store is checked at once (its bucket is
    there and the credentials are accepted), so a wrong setting fails before any work, naming what to set."""
    where = parse_artifacts_url(url)
    data_dir = Path(data_dir)
    if where is None:
        return ArtifactStore(data_dir / "artifacts")
    if isinstance(where, Path):
        return ArtifactStore(where)
    try:
        from edgefarm.artifacts.s3 import S3ArtifactStore  # boto3 is imported only when a bucket is used
    except ImportError as exc:
        raise ConfigurationError(f"{SETTING} names the bucket {where.url!r} but the S3 client is not "
                                 f"installed ({exc}): pip install 'edgellm-farm[s3]'") from None
    store = S3ArtifactStore(where, cache_dir=data_dir / "artifact-cache", cache_bytes=cache_bytes(cache_gb),
                            environ=environ)
    store.check()
    return store
