"""Air-gapped toolchains (issue 22 item 4): ``edgefarm toolchains mirror NAME==VERSION`` stores a toolchain's wheels
in the artifact store under a well-known name; installing that version takes them from there (no package registry);
a missing mirror with the registry disabled is a skip reason the plan shows.

The store's names (``set_ref``/``get_ref``) are tested on both backends: the local directory and a bucket (moto in
server mode on 127.0.0.1). Nothing here reaches a package registry: the wheels are built in the test (``_wheel``),
and pip's index is a dead 127.0.0.1 port wherever pip runs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from artifacts.location import S3Location
from artifacts.s3 import Retry, S3ArtifactStore
from artifacts.store import ArtifactStore, MissingArtifactError, Store, StoreError
from edgellm.errors import ConfigurationError
from tests.fixtures.moto import MotoServer

FAST = Retry(attempts=3, base_s=0.02, max_s=0.1)


@pytest.fixture(params=["local", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each backend in turn: a local directory store, then a bucket of the session's moto server."""
    if request.param == "local":
        store: Store = ArtifactStore(tmp_path / "store")
    else:
        server: MotoServer = request.getfixturevalue("moto_s3")
        store = S3ArtifactStore(S3Location(server.create_bucket(), "farm"), cache_dir=tmp_path / "cache",
                                cache_bytes=64 << 20, environ=server.env(), retry=FAST)
    try:
        yield store
    finally:
        store.close()


# --- the store's names ----------------------------------------------------------------------------------------------

def test_a_name_names_a_blob_is_replaced_whole_and_refuses_what_is_not_stored(any_store: Store) -> None:
    assert any_store.get_ref("toolchains/x/1.0/cp311-linux-x86_64") is None  # never set: no name, no error
    first, kept = any_store.put(b"manifest one"), any_store.put(b"a wheel")
    any_store.set_ref("toolchains/x/1.0/cp311-linux-x86_64", first.sha256, keeps=[kept.sha256])
    assert any_store.get_ref("toolchains/x/1.0/cp311-linux-x86_64") == first.sha256
    second = any_store.put(b"manifest two")
    any_store.set_ref("toolchains/x/1.0/cp311-linux-x86_64", second.sha256)
    assert any_store.get_ref("toolchains/x/1.0/cp311-linux-x86_64") == second.sha256
    absent = "0" * 64
    with pytest.raises(MissingArtifactError, match=absent):
        any_store.set_ref("toolchains/x/2.0/cp311-linux-x86_64", absent)
    with pytest.raises(MissingArtifactError, match=absent):
        any_store.set_ref("toolchains/x/2.0/cp311-linux-x86_64", first.sha256, keeps=[absent])
    assert any_store.get_ref("toolchains/x/2.0/cp311-linux-x86_64") is None  # nothing half-set


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "../up", ".hidden", "a//b", "a/", "sp ace", "a\nb",
                                 "x" * 300, "/".join("a" * 9)])
def test_a_bad_name_is_refused_naming_it_and_what_is_valid(bad: str, tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    blob = store.put(b"x")
    for call in (lambda: store.set_ref(bad, blob.sha256), lambda: store.get_ref(bad)):
        with pytest.raises(ConfigurationError) as caught:
            call()
        assert f"bad artifact name {bad!r}" in str(caught.value) and "letters, digits" in str(caught.value)
    assert not (tmp_path / "store" / "refs").exists()


def test_gc_keeps_what_a_name_names_and_keeps_and_nothing_else(any_store: Store) -> None:
    named, kept, loose = any_store.put(b"named"), any_store.put(b"kept"), any_store.put(b"loose")
    any_store.set_ref("mirror/a", named.sha256, keeps=[kept.sha256])
    any_store.close()  # drop a local store's pins: only names and references keep blobs now
    time.sleep(1.1)  # S3's object times have whole seconds
    assert any_store.gc(set(), older_than_s=0) == [loose.sha256]
    assert sorted(any_store.list()) == sorted([named.sha256, kept.sha256])
    any_store.set_ref("mirror/a", kept.sha256)  # the name moved on: the old blob is no longer kept
    assert any_store.gc(set(), older_than_s=0) == [named.sha256]


def test_a_name_record_that_is_not_one_fails_as_the_store_s_fault(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    (tmp_path / "store" / "refs" / "mirror").mkdir(parents=True)
    (tmp_path / "store" / "refs" / "mirror" / "a").write_text(json.dumps({"sha256": "nope", "keeps": []}))
    with pytest.raises(StoreError, match=r"artifact name 'mirror/a' in .* is not a name record"):
        store.get_ref("mirror/a")
    with pytest.raises(StoreError, match="is not a name record"):  # gc never guesses what a broken name kept
        store.gc(set(), older_than_s=0)
