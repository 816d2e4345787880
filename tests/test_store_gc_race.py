"""``edgefarm gc --older-than-days 0`` in a loop against concurrent puts (issue 24 item 11): no put fails because of
gc, and nothing a put handed out is deleted before its caller recorded it (and, recorded, after). Real processes:
the gc loop runs in one of its own, the puts in threads of this one, each thread its own store object that it
closes every few puts (a run ending)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

from edgefarm.artifacts.store import ArtifactStore

REPO = Path(__file__).resolve().parents[1]
# gc in a loop until told to stop; its referenced set: the sha256s "recorded" so far (a file standing for the db)
GC_LOOP = """
import sys
from pathlib import Path
from edgefarm.artifacts.store import ArtifactStore
store, recorded, stop = ArtifactStore(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
def referenced():
    return set(recorded.read_text().split()) if recorded.exists() else set()
rounds = 0
while not stop.exists():
    store.gc(referenced, older_than_s=0)
    rounds += 1
print(rounds)
"""
THREADS, PUTS = 3, 100  # 300 puts, as in the issue


def test_gc_in_a_loop_never_fails_a_put_nor_loses_a_recorded_or_pending_blob(tmp_path: Path) -> None:
    root, recorded, stop = tmp_path / "store", tmp_path / "recorded", tmp_path / "stop"
    ArtifactStore(root).put(b"warm-up")
    gc = subprocess.Popen([sys.executable, "-c", GC_LOOP, str(root), str(recorded), str(stop)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    record_lock = threading.Lock()
    errors: list[str] = []
    lost: list[str] = []

    def record(sha: str) -> None:
        with record_lock, recorded.open("a") as out:
            out.write(sha + "\n")

    def worker(n: int) -> None:
        rng = random.Random(n)
        store = ArtifactStore(root)
        pending: list[str] = []  # put by this store, still open, and not recorded

        def check_pending() -> None:
            lost.extend(f"put {n}: {sha[:12]} gone while its store was open" for sha in pending
                        if not store.path(sha).is_file())
            pending.clear()

        try:
            for i in range(PUTS):
                # a small pool of contents: most puts find their blob already there (the dedup path)
                ref = store.put(f"content {rng.randrange(12)}".encode() * rng.randrange(1, 2000))
                if i % 3:
                    record(ref.sha256)  # its result refers to it
                else:
                    pending.append(ref.sha256)
                if i % 10 == 9:  # the run ends: what it did not record may go now
                    check_pending()
                    store.close()
                    store = ArtifactStore(root)
                time.sleep(rng.random() / 500)
        except Exception as exc:
            errors.append(f"put {n}: {type(exc).__name__}: {exc}")
        finally:
            check_pending()
            store.close()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.touch()
    out, _ = gc.communicate(timeout=120)
    assert gc.returncode == 0
    rounds = int(out.strip())
    store = ArtifactStore(root)
    missing = sorted({sha for sha in recorded.read_text().split() if not store.has(sha)})
    assert errors == [], errors
    assert lost == [] and missing == [], (lost, missing)
    assert rounds > 20  # gc really ran all along
    assert list(store.tmp.iterdir()) == []
