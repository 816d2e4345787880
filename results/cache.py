"""The content-keyed build cache: an export or engine is reused only when everything it was made from is
unchanged (the key is a sha256 over those inputs) and its artifact still verifies in the store.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.results.db import write_session
from edgefarm.results.models import CacheEntry, parse_name, utcnow
from edgefarm.results.recorder import _upsert


def cache_key(inputs: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of ``inputs`` (sorted keys): equal inputs, equal key."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def lookup(engine: Engine, key: str) -> CacheEntry | None:
    with Session(engine) as s:
        return s.get(CacheEntry, key)


def remember(engine: Engine, key: str, kind: ArtifactKind, sha256: str, inputs: Mapping[str, Any], *,
             toolchain: str | None, toolchain_version: str | None) -> None:
    """``toolchain`` None: the entry is no toolchain's product (the transformers reference)."""
    now = utcnow()
    made_by = {"toolchain": None if toolchain is None else parse_name("toolchain", toolchain),
               "toolchain_version": toolchain_version}
    values = {"key": key, "kind": kind, "sha256": sha256, "inputs": dict(inputs), "created_at": now,
              "last_used_at": now, "hits": 0, **made_by}
    with write_session(engine) as s:
        ins = _upsert(s)(CacheEntry).values(**values)
        s.execute(ins.on_conflict_do_update(index_elements=["key"], set_={"sha256": sha256, "kind": kind,
                                                                         "inputs": dict(inputs), "created_at": now,
                                                                         "last_used_at": now, "hits": 0,
                                                                         **made_by}))


def touch(engine: Engine, key: str) -> None:
    with write_session(engine) as s:
        s.execute(update(CacheEntry).where(CacheEntry.key == key)
                  .values(hits=CacheEntry.hits + 1, last_used_at=utcnow()))


def forget(engine: Engine, key: str) -> None:
    with write_session(engine) as s:
        entry = s.get(CacheEntry, key)
        if entry is not None:
            s.delete(entry)


def referenced(engine: Engine) -> set[str]:
    with Session(engine) as s:
        return set(s.scalars(select(CacheEntry.sha256)))
