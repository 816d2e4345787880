"""Content-addressed artifact store on an S3-compatible bucket (AWS S3, MinIO, Ceph RGW, ...), through boto3.

Layout under ``s3://<bucket>/<prefix>/``: ``sha256/ab/cdef...`` the blobs (the local store's names and bytes: a
directory is the same deterministic tar), ``touched/ab/cdef...`` an empty marker rewritten by every put of that blob
and ``uploads/<digest>`` one per multipart upload in progress (their times are what gc ages by); ``refs/<name>`` the
local store's name records (``set_ref``: one PUT each, replaced whole). Endpoint, region
and credentials come only from ``AWS_ENDPOINT_URL``, ``AWS_REGION`` (default us-east-1), ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY`` (plus ``AWS_SESSION_TOKEN`` when set) of the mapping handed in (the process's
environment); no credential is ever part of a URL, message or repr.

The local store's contract, kept on a bucket:

- content-addressed and deduplicated: ``put`` writes the source (a directory as a deterministic tar) into the
  worker's cache while hashing it, then uploads it under its sha256 unless the bucket already holds that blob (its
  bytes read back and hashed): then only its marker is refreshed, so gc spares the new reference.
- atomic: S3 makes an object visible whole or not at all on PutObject and CompleteMultipartUpload, so the final key
  is written directly, no temporary key. Blobs over one part go up as a multipart upload (parts of ``part_size``,
  ``concurrency`` at once); a put that fails aborts its upload; one whose process died is aborted by ``gc`` once
  older than twice the put deadline (a put running past it gives up by itself, so gc never aborts a live one).
- verified on read: every byte handed out was hashed against its name. Bytes that do not match are fetched again
  before anything is judged: wrong bytes different every time are a transfer damaged on the way (StoreError,
  infrastructure, retried); the same wrong bytes twice are the object's: it is quarantined (copied aside with a
  record, ``artifacts.s3_quarantine``), never deleted, ``has`` reports a miss and a read raises
  CorruptArtifactError, so the stage that makes it runs again; a reader removes nothing from the bucket.
- a put trusts no HEAD: an object already at the blob's key is read back and hashed before the put returns its
  reference; a corrupt one (or one of another size) is quarantined, then replaced.
- retries: a connection error, a timeout, a 5xx or a throttle answer is retried with exponential backoff and
  jitter (``Retry``), then raised as StoreError, an InfrastructureError (Prefect's stage retries apply; no device
  is blamed for it); botocore's own retries are off so this is the one policy. A missing bucket or refused
  credentials is a ConfigurationError naming the bucket and what to set, found by ``check`` before any work.
- gc: removes blobs no live result refers to whose last put (object or marker, the later) is older than the age
  given; aborts stale multipart uploads (above); sweeps the cache's stale temp files (flock-held ones survive).
- a worker reads through its own cache (``artifacts.cache``): bounded, least recently used first, never evicting
  an entry in use.

Why boto3: measured, not assumed (``benchmarks/bench_artifact_store.py``: a 1 GiB blob, 3 rounds against moto in
server mode on 127.0.0.1, 2 shared CPUs; ``benchmarks/results/artifact_store.json``, medians): uploads boto3 66 MB/s,
obstore 44, s3fs 39 (an earlier run, ``artifact_store-earlier.json``: 50, 41, 38); one streamed GET boto3 148 MB/s,
obstore 137 (boto3's parallel ranged ``download_file`` 62 on moto, which reads the whole object per range: hence the
single GET here). In the script's first runs obstore and s3fs each lost a 1 GiB upload whose completion was answered
late (retried, then aborted); boto3 none. Its low-level calls (CreateMultipartUpload, UploadPart, Complete, Abort)
also let this module own the retry policy, the abort and the put deadline; obstore retries and aborts inside its Rust
core, where the error kinds the farm decides by are not visible. (Measured with boto3 1.43.117 beside s3fs, which
pins an older botocore; the project pins boto3 1.44.8.)
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ParamValidationError
from urllib3.exceptions import HTTPError

from edgefarm.artifacts.cache import ContentMismatch, ReadThroughCache
from edgefarm.artifacts.inuse import remove_stale
from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.artifacts.location import S3Location
from edgefarm.artifacts.s3_quarantine import quarantine
from edgefarm.artifacts.store import (
    SHA256_RE,
    ArtifactRef,
    CorruptArtifactError,
    MissingArtifactError,
    Shas,
    StoreError,
    check_ref_name,
    check_sha,
    new_extract_dest,
    parse_ref,
    ref_record,
    untar,
)
from edgellm.errors import ConfigurationError, EdgeLLMError
from edgellm.files import atomic_output
from edgellm.redact import redact, unseen

log = logging.getLogger(__name__)

T = TypeVar("T")
MB = 1 << 20
MAX_PARTS = 10_000  # S3's limit per multipart upload: larger blobs get larger parts
_CHUNK = MB
# answers worth another try: the server is overloaded or broke, not the request
_RETRY_CODES = {"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling",
                "ThrottlingException", "RequestTimeTooSkewed", "OperationAborted"}
_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                 "InvalidClientTokenId", "AuthorizationHeaderMalformed", "PermanentRedirect"}
_SET_CREDENTIALS = "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
FETCHES = 3  # GETs of a blob whose bytes do not match before it is judged: the same wrong bytes twice, the object's


@dataclass(frozen=True)
class Retry:
    """Tries per request, and the backoff between them: base_s, doubling, at most max_s, with +-50% jitter."""

    attempts: int = 5
    base_s: float = 0.5
    max_s: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_s < 0 or self.max_s < 0:
            raise ConfigurationError(f"bad retry policy {self!r}: need attempts >= 1 and delays >= 0")

    def delay(self, attempt: int) -> float:
        return min(self.max_s, self.base_s * 2 ** attempt) * random.uniform(0.5, 1.5)


@dataclass(frozen=True)
class _Retryable:
    reason: str


class S3ArtifactStore:
    def __init__(self, location: S3Location, *, cache_dir: Path | str, cache_bytes: int,
                 environ: Mapping[str, str], part_size: int = 64 * MB, concurrency: int = 4,
                 retry: Retry | None = None, put_deadline_s: float = 6 * 3600, timeout_s: float = 60.0) -> None:
        if part_size < 1 or concurrency < 1 or put_deadline_s <= 0:
            raise ConfigurationError(f"bad S3 store settings: part_size {part_size!r}, concurrency {concurrency!r}, "
                                     f"put_deadline_s {put_deadline_s!r} (all must be > 0)")
        self.location = location
        self.cache = ReadThroughCache(cache_dir, cache_bytes)
        self.part_size = part_size
        self.concurrency = concurrency
        self.retry = retry or Retry()
        self.put_deadline_s = put_deadline_s
        self.endpoint = environ.get("AWS_ENDPOINT_URL") or None
        self.region = environ.get("AWS_REGION") or "us-east-1"
        self._client = _make_client(location, environ, self.endpoint, self.region, concurrency, timeout_s)

    def __repr__(self) -> str:
        return f"S3ArtifactStore({self.location.url!r}, endpoint={self.where!r})"

    @property
    def where(self) -> str:
        return redact(self.endpoint) if self.endpoint else f"AWS S3 ({self.region})"

    def _blob_key(self, sha256: str) -> str:
        check_sha(sha256)
        return self.location.key("sha256", sha256[:2], sha256[2:])

    def _marker_key(self, sha256: str) -> str:
        return self.location.key("touched", sha256[:2], sha256[2:])

    def _url(self, key: str) -> str:
        return f"s3://{self.location.bucket}/{key}"

    # requests ------------------------------------------------------------------------------------------------------
    def _call(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        """``fn`` (one request) with this store's retries; what is not worth retrying is raised at once with its
        kind; after the last try, StoreError (infrastructure) naming the request and why."""
        where = self._url(key) if key else f"s3://{self.location.bucket}"
        reason = ""
        for attempt in range(self.retry.attempts):
            try:
                return fn()
            except (EdgeLLMError, ContentMismatch, _Cancelled):
                raise
            except Exception as exc:  # a client library error of any kind: classified below
                verdict = self._classify(exc, op, where)
                if not isinstance(verdict, _Retryable):
                    raise verdict from exc
                reason = verdict.reason
            if attempt + 1 < self.retry.attempts:
                delay = self.retry.delay(attempt)
                log.warning("S3 %s %s failed (%s): try %d of %d in %.1f s", op, where, reason, attempt + 2,
                            self.retry.attempts, delay)
                time.sleep(delay)
        raise StoreError(f"S3 {op} {where} at {self.where} failed {self.retry.attempts} time(s): {reason}")

    def _classify(self, exc: Exception, op: str, where: str) -> EdgeLLMError | _Retryable:
        text = redact(" ".join(str(exc).split()))[:300]
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            bucket = self.location.bucket
            if code == "NoSuchBucket" or (op == "HeadBucket" and status == 404):  # a HEAD answer has no body
                return ConfigurationError(f"S3 bucket {bucket!r} does not exist at {self.where}: create it, or set "
                                          f"EDGEFARM_ARTIFACTS to s3://<an existing bucket>/<prefix> (and "
                                          f"AWS_ENDPOINT_URL to its server)")
            if code in _ACCESS_CODES or status in (301, 401, 403):
                return ConfigurationError(f"S3 refused {op} on bucket {bucket!r} at {self.where} ({code or status}): "
                                          f"set {_SET_CREDENTIALS} to credentials allowed to read, write, list and "
                                          f"delete in it, and AWS_REGION to the bucket's region ({self.region} now)")
            if code in _RETRY_CODES or status >= 500 or status == 429:
                return _Retryable(f"{code or status}: {text}")
            return ConfigurationError(f"S3 {op} {where} at {self.where} was refused ({code or status}): {text}")
        if isinstance(exc, NoCredentialsError):
            return ConfigurationError(f"no S3 credentials for bucket {self.location.bucket!r}: set {_SET_CREDENTIALS}")
        if isinstance(exc, ParamValidationError):
            return EdgeLLMError(f"S3 {op} {where}: bad request built by the store: {text}")  # a bug
        # connection refused or lost, timeouts, a response body cut short (urllib3's errors while it streams)
        if isinstance(exc, BotoCoreError | OSError | HTTPError):
            return _Retryable(f"{type(exc).__name__}: {text}")
        return EdgeLLMError(f"S3 {op} {where}: unexpected {type(exc).__name__}: {text}")

    def _head(self, key: str) -> dict[str, Any] | None:
        def head() -> dict[str, Any] | None:
            try:
                return dict(self._client.head_object(Bucket=self.location.bucket, Key=key))
            except ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise

        return self._call("HeadObject", key, head)

    def _delete(self, key: str) -> None:
        self._call("DeleteObject", key, lambda: self._client.delete_object(Bucket=self.location.bucket, Key=key))

    def _listing(self, prefix: str) -> Iterator[dict[str, Any]]:
        token: str | None = None
        while True:
            args: dict[str, Any] = {"Bucket": self.location.bucket, "Prefix": prefix}
            if token:
                args["ContinuationToken"] = token
            page = self._call("ListObjectsV2", prefix, partial(self._client.list_objects_v2, **args))
            yield from page.get("Contents", [])
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]

    def check(self) -> None:
        """The bucket is there and these credentials may use it (ConfigurationError naming what to set if not)."""
        self._call("HeadBucket", None, lambda: self._client.head_bucket(Bucket=self.location.bucket))

    # the Store contract ---------------------------------------------------------------------------------------------
    def has(self, sha256: str) -> bool:
        """Whether the bucket holds the blob *and* its bytes hash to its name (checked through the cache, which
        then holds it for the read that usually follows). A corrupt blob is a miss, so it is rebuilt (quarantined,
        left in the bucket until that put replaces it)."""
        if self._head(self._blob_key(sha256)) is None:
            self.cache.evict(sha256)
            return False
        try:
            with self._held(sha256):
                return True
        except (CorruptArtifactError, MissingArtifactError):
            return False

    def ref(self, sha256: str, kind: ArtifactKind, packing: Packing) -> ArtifactRef:
        head = self._head(self._blob_key(sha256))
        if head is None:
            raise MissingArtifactError(f"artifact sha256:{sha256} is not in the store {self.location.url!r}")
        return ArtifactRef(sha256, int(head["ContentLength"]), kind, packing)

    def put(self, src: Path | str | bytes, kind: ArtifactKind | str = ArtifactKind.OTHER) -> ArtifactRef:
        """Store a file, a directory (as a deterministic tar) or bytes; returns its reference."""
        for _ in range(3):
            ref = self.cache.local.put(src, kind)  # spooled and hashed into the cache (kind checked there)
            f = self.cache.open(ref.sha256)
            if f is None:  # evicted by a concurrent shrink before it could be held: spool it again
                continue
            try:
                key = self._blob_key(ref.sha256)
                head = self._head(key)
                self._touch(ref.sha256)  # before the upload completes: gc's age of the blob is this put's
                if self._holds(key, ref, head):
                    log.debug("artifact sha256:%s already in %s (read back: verified)", ref.sha256, self.location.url)
                elif self._upload(f, key, ref.sha256, ref.size):
                    self._touch(ref.sha256)  # a multipart object's time is when its upload began: now is later
            finally:
                f.close()
            self.cache.shrink()
            return ref
        raise StoreError(f"artifact cache {str(self.cache.local.root)!r} evicted a blob being stored three "
                         f"times: its bound ({self.cache.max_bytes} bytes) is too small for the work")

    def _holds(self, key: str, ref: ArtifactRef, head: dict[str, Any] | None) -> bool:
        """Whether the object at ``key`` is ``ref``'s bytes: read back and hashed, never taken from its HEAD (a
        corrupt copy keeps its size and metadata). One that is not is quarantined first (copied aside, never
        destroyed), so the put that replaces it keeps the evidence."""
        if head is None:
            return False
        if int(head["ContentLength"]) != ref.size or head.get("Metadata", {}).get("sha256") != ref.sha256:
            quarantine(self, ref.sha256, ContentMismatch(f"unread: {head['ContentLength']} bytes", head.get("ETag")),
                       "a put")
            return False
        try:
            self._judged(ref.sha256, partial(self._check_bytes, key, ref.sha256), "a put")
        except (CorruptArtifactError, MissingArtifactError):  # quarantined, or gone since the HEAD: upload it
            return False
        return True

    def _touch(self, sha256: str) -> None:
        key = self._marker_key(sha256)
        self._call("PutObject", key, lambda: self._client.put_object(Bucket=self.location.bucket, Key=key, Body=b""))

    def _upload(self, f: BinaryIO, key: str, sha256: str, size: int) -> bool:
        """Upload the blob to its final key; whether it went as a multipart upload."""
        bucket, meta = self.location.bucket, {"sha256": sha256}
        if size <= self.part_size:
            f.seek(0)
            data = f.read()
            self._call("PutObject", key, lambda: self._client.put_object(Bucket=bucket, Key=key, Body=data,
                                                                         Metadata=meta))
            return False
        part = max(self.part_size, -(-size // MAX_PARTS))
        count = -(-size // part)
        started = time.monotonic()
        upload_id = self._begin_upload(key, meta)
        failed = threading.Event()
        lock = threading.Lock()

        def send(number: int) -> dict[str, Any]:
            if failed.is_set():
                raise _Cancelled
            self._check_deadline(started, key)
            offset = (number - 1) * part
            with lock:  # one reader of the shared file position at a time; the uploads overlap
                f.seek(offset)
                data = f.read(min(part, size - offset))
            answer = self._call("UploadPart", key, lambda: self._client.upload_part(
                Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data))
            return {"ETag": answer["ETag"], "PartNumber": number}

        try:
            with ThreadPoolExecutor(self.concurrency, thread_name_prefix="s3-part") as pool:
                futures: list[Future[dict[str, Any]]] = [pool.submit(send, n) for n in range(1, count + 1)]
                done, _ = wait(futures, return_when=FIRST_EXCEPTION)
                error = next((e for fut in done if (e := fut.exception()) is not None), None)
                if error is not None:  # the first failed part fails the upload; the parts not yet sent are not
                    failed.set()
                    for fut in futures:
                        fut.cancel()
                    raise error
                parts = [fut.result() for fut in futures]
            self._check_deadline(started, key)
            self._complete(key, upload_id, parts, size, sha256)
        except BaseException:
            self._abort(key, upload_id)
            raise
        self._delete(self._upload_marker_key(upload_id))
        return True

    def _upload_marker_key(self, upload_id: str) -> str:
        return self.location.key("uploads", hashlib.sha256(upload_id.encode()).hexdigest()[:32])

    def _begin_upload(self, key: str, meta: dict[str, str]) -> str:
        """A new multipart upload, and its marker ``uploads/<id digest>``: when it began, by this host's put (gc
        ages it by that; an upload with no marker, by the server's Initiated)."""
        upload = self._call("CreateMultipartUpload", key, lambda: self._client.create_multipart_upload(
            Bucket=self.location.bucket, Key=key, Metadata=meta))
        upload_id = str(upload["UploadId"])
        try:
            marker = self._upload_marker_key(upload_id)
            self._call("PutObject", marker, lambda: self._client.put_object(Bucket=self.location.bucket, Key=marker,
                                                                            Body=b""))
        except BaseException:
            self._abort(key, upload_id)
            raise
        return upload_id

    def _complete(self, key: str, upload_id: str, parts: list[dict[str, Any]], size: int, sha256: str) -> None:
        tries = 0

        def complete() -> None:
            nonlocal tries
            tries += 1
            if tries > 1:  # the last try's answer was lost: the server may have completed it (then the upload is
                head = self._head(key)  # gone and a new try fails: NoSuchUpload on S3, a 500 on moto)
                if head is not None and int(head["ContentLength"]) == size \
                        and head.get("Metadata", {}).get("sha256") == sha256:
                    return
            self._client.complete_multipart_upload(Bucket=self.location.bucket, Key=key, UploadId=upload_id,
                                                   MultipartUpload={"Parts": parts})

        self._call("CompleteMultipartUpload", key, complete)

    def _abort(self, key: str, upload_id: str) -> None:
        try:
            self._call("AbortMultipartUpload", key, lambda: self._client.abort_multipart_upload(
                Bucket=self.location.bucket, Key=key, UploadId=upload_id))
            self._delete(self._upload_marker_key(upload_id))
        except EdgeLLMError as exc:
            log.warning("could not abort the multipart upload %s of %s (gc aborts it once older than %.1f h): %s",
                        upload_id, self._url(key), 2 * self.put_deadline_s / 3600, str(exc).splitlines()[0])

    def _check_deadline(self, started: float, key: str) -> None:
        if time.monotonic() - started > self.put_deadline_s:
            raise StoreError(f"upload of {self._url(key)} to {self.where} took longer than "
                                      f"{self.put_deadline_s:.0f} s: given up (gc would abort it past that age)")

    # reading (always verified) -------------------------------------------------------------------------------------
    def _stream(self, key: str, sink: Callable[[bytes], object] | None) -> tuple[str, str | None]:
        """One GET of the blob at ``key``, its bytes handed to ``sink`` as they arrive: their sha256 and the object's
        ETag. MissingArtifactError when there is no such object."""
        try:
            answer = self._client.get_object(Bucket=self.location.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                name = key.removeprefix(self.location.key("sha256") + "/").replace("/", "")
                raise MissingArtifactError(f"no artifact sha256:{name} in store {self.location.url!r}") from None
            raise
        body, h = answer["Body"], hashlib.sha256()
        try:
            for chunk in body.iter_chunks(_CHUNK):
                h.update(chunk)
                if sink is not None:
                    sink(chunk)
        finally:
            body.close()
        return h.hexdigest(), answer.get("ETag")

    def _check_bytes(self, key: str, sha256: str) -> None:
        """The object at ``key`` read and hashed (kept nowhere): ContentMismatch unless it is ``sha256``'s bytes."""
        actual, etag = self._stream(key, None)
        if actual != sha256:
            raise ContentMismatch(actual, etag)

    def _judged(self, sha256: str, fetch: Callable[[], T], by: str) -> T:
        """``fetch()``: one GET of the blob that hashes its bytes and raises ContentMismatch unless they are
        ``sha256``'s. A mismatch is fetched again before anything is judged: the same wrong bytes twice are the
        object's (quarantined, see ``artifacts.s3_quarantine``; CorruptArtifactError), wrong bytes different every
        time are the transfer's (StoreError, infrastructure: retried). Nothing is removed on a reader's word."""
        key = self._blob_key(sha256)
        seen: list[str] = []
        for _ in range(FETCHES):
            try:
                return self._call("GetObject", key, fetch)
            except ContentMismatch as bad:
                if bad.actual in seen:
                    kept = quarantine(self, sha256, bad, by)
                    raise CorruptArtifactError(
                        f"artifact sha256:{sha256} at {self._url(key)} is corrupt: fetched {len(seen) + 1} times, its "
                        f"content hashes to {bad.actual}; not served; {kept}; its stage runs again and its next put "
                        "replaces it") from None
                seen.append(bad.actual)
                log.warning("S3 GetObject %s: the bytes received hash to %s, not to their name: fetched again (a "
                            "transfer damaged on the way is the network's fault)", self._url(key), bad.actual)
        raise StoreError(f"S3 GetObject {self._url(key)} at {self.where}: {FETCHES} fetches gave {FETCHES} different "
                         f"wrong contents: the transfer is damaged on the way (network, proxy or server); nothing "
                         f"judged, nothing removed")

    def _download(self, sha256: str) -> BinaryIO:
        """The blob fetched into the cache, hashed on the way (``_judged``); held open."""
        key = self._blob_key(sha256)

        def fetch() -> BinaryIO:
            etag: list[str | None] = []

            def fill(out: BinaryIO) -> str:
                actual, tag = self._stream(key, out.write)
                etag.append(tag)
                return actual

            try:
                return self.cache.add(sha256, fill)
            except ContentMismatch as bad:
                raise ContentMismatch(bad.actual, etag[-1] if etag else None) from None

        return self._judged(sha256, fetch, "a read")

    @contextmanager
    def _held(self, sha256: str) -> Iterator[BinaryIO]:
        """The blob as a file of this worker's cache, verified, held in use (never evicted) while the block runs."""
        f = self.cache.open(sha256)
        if f is not None and _hash(f) != sha256:
            log.warning("cached copy of artifact sha256:%s is corrupt: evicted from the cache, fetched again", sha256)
            f.close()
            self.cache.evict(sha256)
            f = None
        if f is None:
            f = self._download(sha256)
        try:
            f.seek(0)
            yield f
        finally:
            f.close()
            self.cache.shrink()  # now that it is no longer in use, it may go too

    def read_bytes(self, sha256: str) -> bytes:
        with self._held(sha256) as f:
            return f.read()

    def get_file(self, sha256: str, dest: Path | str) -> Path:
        """Copy a blob to ``dest`` (atomically: nothing is written at ``dest`` unless it verified)."""
        dest = Path(dest)
        with self._held(sha256) as f, atomic_output(dest) as out:
            shutil.copyfileobj(f, out, _CHUNK)
        return dest

    def extract(self, sha256: str, dest: Path | str) -> Path:
        """Restore a directory stored with ``put(dir)`` into ``dest`` (which must not exist yet)."""
        dest = new_extract_dest(dest)
        with self._held(sha256) as f:
            return untar(f, dest)

    # names ---------------------------------------------------------------------------------------------------------
    def _ref_key(self, name: str) -> str:
        return self.location.key("refs", check_ref_name(name))

    def set_ref(self, name: str, sha256: str, keeps: Collection[str] = ()) -> None:
        """Name the stored blob ``sha256`` (and keep ``keeps`` from gc while the name stands); replaces the name's
        earlier blob. Every blob must be in the bucket (MissingArtifactError otherwise)."""
        key, record = self._ref_key(name), ref_record(sha256, keeps)
        for sha in sorted({sha256, *keeps}):
            self.ref(sha, ArtifactKind.OTHER, Packing.FILE)
        self._call("PutObject", key, lambda: self._client.put_object(Bucket=self.location.bucket, Key=key,
                                                                     Body=record))

    def _read_ref(self, key: str) -> bytes | None:
        def get() -> bytes | None:
            try:
                body = self._client.get_object(Bucket=self.location.bucket, Key=key)["Body"]
            except ClientError as exc:
                if str(exc.response.get("Error", {}).get("Code")) in ("NoSuchKey", "404"):
                    return None
                raise
            try:
                return bytes(body.read())
            finally:
                body.close()

        return self._call("GetObject", key, get)

    def get_ref(self, name: str) -> str | None:
        """The blob ``name`` names, or None when no such name is set."""
        data = self._read_ref(self._ref_key(name))
        return None if data is None else parse_ref(name, data, self.location.url)[0]

    def _named(self) -> set[str]:
        """Every blob a name names or keeps."""
        base = self.location.key("refs") + "/"
        named: set[str] = set()
        for obj in self._listing(base):
            data = self._read_ref(str(obj["Key"]))
            if data is not None:  # removed since the listing
                sha, keeps = parse_ref(str(obj["Key"])[len(base):], data, self.location.url)
                named.update([sha, *keeps])
        return named

    # maintenance ---------------------------------------------------------------------------------------------------
    def _blobs(self, folder: str) -> dict[str, dict[str, Any]]:
        """sha256 -> listing entry of the objects under ``<prefix>/<folder>/``."""
        base = self.location.key(folder) + "/"
        found = {}
        for obj in self._listing(base):
            name = str(obj["Key"])[len(base):].replace("/", "")
            if SHA256_RE.fullmatch(name):
                found[name] = obj
        return found

    def list(self) -> Iterator[str]:
        yield from sorted(self._blobs("sha256"))

    def verify(self) -> Shas:
        """The sha256 of every corrupt blob (content no longer matches its name, in two fetches: ``_judged``); each
        is read from the bucket, and quarantined (copied aside, never removed)."""
        bad = []
        for sha in self.list():
            try:
                self._judged(sha, partial(self._check_bytes, self._blob_key(sha), sha), "verify")
            except CorruptArtifactError:
                bad.append(sha)
            except MissingArtifactError:  # removed by gc since the listing
                continue
        return bad

    def close(self) -> None:
        """Drop the pins the read-through cache's local puts hold (the bucket's blobs are kept by references and
        age: puts on other hosts hold no lock here)."""
        self.cache.local.close()

    def gc(self, referenced: Collection[str] | Callable[[], Collection[str]], older_than_s: float) -> Shas:
        """Remove blobs not in ``referenced`` (a set, or a function read once here) nor named (``set_ref``) whose
        last put is older than ``older_than_s``; abort multipart
        uploads older than twice the put deadline (no running put is that old: the margin covers a last part in
        flight and the clocks of this host and the server); sweep the cache's stale temp files.
        Returns the removed sha256s. Referenced or young blobs are never removed."""
        if not (math.isfinite(older_than_s) and older_than_s >= 0):
            raise ConfigurationError(f"bad gc age {older_than_s!r}: need a finite number of seconds >= 0")
        referenced = set(referenced() if callable(referenced) else referenced) | self._named()
        cutoff = time.time() - older_than_s
        blobs, markers = self._blobs("sha256"), self._blobs("touched")
        removed = []
        for sha, obj in sorted(blobs.items()):
            if sha in referenced or _age(obj, markers.get(sha)) >= cutoff:
                continue
            marker = self._head(self._marker_key(sha))  # a put may have refreshed it since the listing
            if marker is not None and _stamp(marker["LastModified"]) >= cutoff:
                continue
            self._delete(self._blob_key(sha))
            self._delete(self._marker_key(sha))
            self.cache.evict(sha)
            removed.append(sha)
        stale = time.time() - max(older_than_s, 2 * self.put_deadline_s)  # no running put began before that
        for sha, obj in markers.items():  # markers of no blob: a put that died before its upload completed
            if sha not in blobs and _stamp(obj["LastModified"]) < stale:
                self._delete(self._marker_key(sha))
        self._abort_stale_uploads(stale)
        remove_stale(self.cache.local.tmp, "*", older_than_s)  # never a put or fetch in progress (flock-held)
        if removed:
            log.info("gc: removed %d unreferenced blob(s) from %s", len(removed), self.location.url)
        return removed

    def _abort_stale_uploads(self, cutoff: float) -> None:
        prefix = self.location.key("sha256") + "/"
        markers = {str(o["Key"]): _stamp(o["LastModified"]) for o in self._listing(self.location.key("uploads") + "/")}
        live = set()
        args: dict[str, Any] = {"Bucket": self.location.bucket, "Prefix": prefix}
        while True:
            page = self._call("ListMultipartUploads", prefix, partial(self._client.list_multipart_uploads, **args))
            for up in page.get("Uploads", []):
                marker = self._upload_marker_key(str(up["UploadId"]))
                began = markers.get(marker, _stamp(up["Initiated"]))
                if began >= cutoff:
                    live.add(marker)
                    continue
                log.info("gc: aborting the multipart upload %s of %s (a put that died)", up["UploadId"],
                         self._url(up["Key"]))
                self._abort(str(up["Key"]), str(up["UploadId"]))
            if not page.get("IsTruncated"):
                break
            args["KeyMarker"], args["UploadIdMarker"] = page.get("NextKeyMarker"), page.get("NextUploadIdMarker")
        for marker, began in markers.items():  # markers of uploads that ended without removing them
            if marker not in live and began < cutoff:
                self._delete(marker)


class _Cancelled(Exception):
    """A part not sent because another part of the same upload failed."""


def _stamp(value: datetime | str) -> float:
    return value.timestamp() if isinstance(value, datetime) else datetime.fromisoformat(value).timestamp()


def _age(obj: dict[str, Any], marker: dict[str, Any] | None) -> float:
    """When the blob was last put: the later of its object's and its marker's times."""
    times = [_stamp(obj["LastModified"])] + ([_stamp(marker["LastModified"])] if marker else [])
    return max(times)


def _hash(f: BinaryIO) -> str:
    f.seek(0)
    h = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _make_client(location: S3Location, environ: Mapping[str, str], endpoint: str | None, region: str,
                 concurrency: int, timeout_s: float) -> Any:
    key_id, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
    if not key_id or not secret:
        missing = " and ".join(name for name, value in (("AWS_ACCESS_KEY_ID", key_id),
                                                        ("AWS_SECRET_ACCESS_KEY", secret)) if not value)
        raise ConfigurationError(f"artifact store {location.url}: {missing} not set; the store takes its "
                                 f"credentials from {_SET_CREDENTIALS} only (never from the URL)")
    if endpoint is not None and (not endpoint.startswith(("http://", "https://")) or unseen(endpoint)
                                 or any(c in endpoint for c in "@?#")):
        raise ConfigurationError(f"bad AWS_ENDPOINT_URL {redact(endpoint)!r}: need http(s)://HOST[:PORT] (no "
                                 f"credentials, query or control characters: the credentials go in "
                                 f"{_SET_CREDENTIALS})")
    config = Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=min(timeout_s, 10),
                    read_timeout=timeout_s, max_pool_connections=max(10, 2 * concurrency),
                    s3={"addressing_style": "path" if endpoint else "auto"})
    session = boto3.session.Session(aws_access_key_id=key_id, aws_secret_access_key=secret,
                                    aws_session_token=environ.get("AWS_SESSION_TOKEN") or None, region_name=region)
    return session.client("s3", endpoint_url=endpoint, config=config)
