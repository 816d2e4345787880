"""A corrupt blob of the S3 store is quarantined, never destroyed: the object is copied aside, server-side, to
``<prefix>/quarantine/ab/cdef.../<etag>`` (the bytes as the bucket holds them, whatever a transfer did to them on
the way) beside ``<etag>.json``, a record of what was seen: the name, what its content hashed to, by whom (a read, a
put, verify), when and on which host. Nothing under ``quarantine/`` is ever removed by the store (gc walks only
``sha256/``, ``touched/`` and ``uploads/``): the evidence stays until a person removes it.

The blob itself stays at its key: a reader removes nothing (``edgefarm show`` is read-only); the next put of that
content, which reads the object back before trusting it, finds it corrupt and replaces it, the copy kept here.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from boto3.s3.transfer import TransferConfig

from edgefarm.artifacts.cache import ContentMismatch
from edgellm.errors import EdgeLLMError

if TYPE_CHECKING:
    from edgefarm.artifacts.s3 import S3ArtifactStore

log = logging.getLogger(__name__)

FOLDER = "quarantine"
# CopyObject copies up to 5 GiB in one request; larger objects go as a multipart copy (UploadPartCopy)
_COPY = TransferConfig(multipart_threshold=1 << 30, multipart_chunksize=256 << 20, use_threads=False)
_ETAG_CHARS = re.compile(r"[^A-Za-z0-9-]")


def quarantine_key(store: S3ArtifactStore, sha256: str, etag: str | None) -> str:
    """Where the object with that ETag (the bytes it names) is kept aside."""
    tag = _ETAG_CHARS.sub("", etag or "")[:80] or "unknown-etag"
    return store.location.key(FOLDER, sha256[:2], sha256[2:], tag)


def quarantine(store: S3ArtifactStore, sha256: str, bad: ContentMismatch, by: str) -> str:
    """Copy the corrupt object of ``sha256`` aside with a record of what ``by`` saw; what was done, for the error
    message. Once per object (its ETag): a copy already there is kept. Credentials that may not write (a reader's)
    leave it where it is, said so in the message and a warning: nothing is ever removed either way."""
    src, dst = store._blob_key(sha256), quarantine_key(store, sha256, bad.etag)
    bucket = store.location.bucket
    record = json.dumps({"sha256": sha256, "content_sha256": bad.actual, "etag": bad.etag, "found_by": by,
                         "found_at": datetime.now(UTC).isoformat(timespec="seconds"), "host": socket.gethostname()},
                        indent=1).encode()
    try:
        if store._head(dst) is None:
            extra = {"CopySourceIfMatch": bad.etag} if bad.etag else {}  # exactly the object whose bytes were seen
            store._call("CopyObject", dst, lambda: store._client.copy({"Bucket": bucket, "Key": src}, bucket, dst,
                                                                      ExtraArgs=extra, Config=_COPY))
            store._call("PutObject", dst + ".json", lambda: store._client.put_object(Bucket=bucket, Key=dst + ".json",
                                                                                     Body=record))
    except EdgeLLMError as exc:
        why = str(exc).splitlines()[0]
        log.warning("corrupt artifact sha256:%s in %s could not be copied aside to %s (%s): left where it is",
                    sha256, store.location.url, store._url(dst), why)
        return f"left in the bucket (copying it aside to {store._url(dst)} failed: {why})"
    log.warning("corrupt artifact sha256:%s in %s (found by %s): kept in place and copied aside to %s", sha256,
                store.location.url, by, store._url(dst))
    return f"kept in the bucket and copied aside to {store._url(dst)}"
