"""Artifact store throughput: put/get of one large blob (default 1 GiB) on the local-disk store and on S3 through
each client tried, against a local moto server (its own process on 127.0.0.1). Prints a table (MB/s and the ratio
to the local-disk store) and writes JSON with the machine's load average around every measurement.

    python benchmarks/bench_artifact_store.py [--size-mb 1024] [--clients boto3,obstore,s3fs] [--output FILE]

Rows: ``local store`` (artifacts.store.ArtifactStore: hash while copying, fsync, rename; get re-hashes),
``<client> raw`` (the client's own multipart upload of a file and download to a file, nothing else: boto3's
TransferManager ``upload_file``/``download_file``, the latter in parallel ranged GETs; ``boto3-stream`` the same
upload and one streamed ``get_object``), and ``s3 store``
(artifacts.s3.S3ArtifactStore, the farm's S3 backend: spool + sha256 into its cache, upload, marker; get from an
empty cache: download + verify + copy out; ``warm`` get: from its cache). A client that is not installed is
reported as such; one that fails against the server is recorded under ``errors``. moto is a Python server: its own
throughput bounds every S3 row, so compare the clients with one another in one run, not with a real S3.

s3fs needs an older botocore than boto3's pin, so the kept results come from a virtual environment made for the
comparison (s3fs 2026.9.0, boto3 1.43.117, obstore 0.12.1, moto 5.2.5; the JSON records the versions). Why the farm's
store uses boto3, with these numbers: artifacts/s3.py and the README ("Artifacts").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgefarm.artifacts.kinds import ArtifactKind  # noqa: E402
from edgefarm.artifacts.store import ArtifactStore  # noqa: E402
from tests.fixtures.moto import MotoServer, start_moto  # noqa: E402

MB = 1 << 20
CLIENTS = ("boto3", "boto3-stream", "obstore", "s3fs")


def _write_source(path: Path, size: int) -> None:
    block = os.urandom(16 * MB)  # incompressible; repeated blocks keep generation cheap
    with path.open("wb") as f:
        left = size
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


def _timed(fn: Callable[[], object], size: int) -> dict[str, Any]:
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return {"seconds": round(seconds, 3), "mb_s": round(size / MB / seconds, 1),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def _raw_boto3(server: MotoServer, bucket: str, part: int, concurrency: int,
               stream: bool = False) -> tuple[Callable, Callable]:
    import boto3
    from boto3.s3.transfer import TransferConfig

    e = server.env()
    client = boto3.client("s3", endpoint_url=server.endpoint, region_name=e["AWS_REGION"],
                          aws_access_key_id=e["AWS_ACCESS_KEY_ID"], aws_secret_access_key=e["AWS_SECRET_ACCESS_KEY"])
    cfg = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=concurrency)

    def get_stream(key: str, dest: Path) -> None:  # one GET streamed to the file, as the store reads
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        with dest.open("wb") as f:
            for chunk in body.iter_chunks(8 * MB):
                f.write(chunk)

    return (lambda src, key: client.upload_file(str(src), bucket, key, Config=cfg),
            get_stream if stream else lambda key, dest: client.download_file(bucket, key, str(dest), Config=cfg))


def _raw_obstore(server: MotoServer, bucket: str, part: int, concurrency: int) -> tuple[Callable, Callable]:
    import obstore
    from obstore.store import S3Store

    e = server.env()
    store = S3Store(bucket, endpoint=server.endpoint, region=e["AWS_REGION"], access_key_id=e["AWS_ACCESS_KEY_ID"],
                    secret_access_key=e["AWS_SECRET_ACCESS_KEY"], client_options={"allow_http": True})

    def put(src: Path, key: str) -> None:
        obstore.put(store, key, src, chunk_size=part, max_concurrency=concurrency)

    def get(key: str, dest: Path) -> None:
        with dest.open("wb") as f:
            for chunk in obstore.get(store, key).stream(min_chunk_size=8 * MB):
                f.write(chunk)

    return put, get


def _raw_s3fs(server: MotoServer, bucket: str, part: int, concurrency: int) -> tuple[Callable, Callable]:
    import s3fs

    e = server.env()
    fs = s3fs.S3FileSystem(key=e["AWS_ACCESS_KEY_ID"], secret=e["AWS_SECRET_ACCESS_KEY"],
                           endpoint_url=server.endpoint, client_kwargs={"region_name": e["AWS_REGION"]},
                           max_concurrency=concurrency)
    return (lambda src, key: fs.put_file(str(src), f"{bucket}/{key}", chunksize=part),
            lambda key, dest: fs.get_file(f"{bucket}/{key}", str(dest)))


RAW = {"boto3": _raw_boto3, "boto3-stream": partial(_raw_boto3, stream=True), "obstore": _raw_obstore,
       "s3fs": _raw_s3fs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024, help="the blob's size (default 1024 = 1 GiB)")
    ap.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated, of {', '.join(CLIENTS)}")
    ap.add_argument("--part-mb", type=int, default=64, help="multipart part size (default 64)")
    ap.add_argument("--concurrency", type=int, default=4, help="parts in flight at once (default 4, the store's)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the clients' order rotates each round (default 3)")
    ap.add_argument("--work-dir", type=Path, default=None, help="where the blob and stores go (default: a temp dir)")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "artifact_store.json")
    args = ap.parse_args()
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    unknown = sorted(set(clients) - set(CLIENTS))
    if unknown:
        ap.error(f"unknown client(s) {', '.join(unknown)}; valid: {', '.join(CLIENTS)}")
    size, part = args.size_mb * MB, args.part_mb * MB
    work = Path(tempfile.mkdtemp(prefix="bench-store-", dir=args.work_dir))
    server = start_moto(work / "moto.log")
    samples: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    errors: list[dict[str, Any]] = []
    try:
        src = work / "blob.bin"
        _write_source(src, size)
        for round_ in range(args.repeat):
            samples += [{"round": round_, **r} for r in _local_rows(src, size, work)]
            order = clients[round_ % len(clients):] + clients[:round_ % len(clients)] if clients else []
            for name in [*order, "s3 store"]:
                server.stop()  # moto keeps every object in memory or its temp files: each one starts afresh
                server.start()
                try:
                    rows = _s3_store_rows(server, src, size, part, args.concurrency, work) if name == "s3 store" \
                        else _raw_rows(name, server, src, size, part, args.concurrency, work)
                except ImportError as exc:
                    missing[name] = f"not installed: {exc}"
                    continue
                except Exception as exc:  # a client that fails against the server is a finding, kept with why
                    errors.append({"round": round_, "store": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
                    print(f"round {round_}: {name} failed: {errors[-1]['error']}", file=sys.stderr)
                    continue
                samples += [{"round": round_, **r} for r in rows]
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    rows = _summary(samples)
    report = {"benchmark": "artifact_store", "size_mb": args.size_mb, "part_mb": args.part_mb,
              "concurrency": args.concurrency, "repeat": args.repeat, "server": "moto (server mode, 127.0.0.1)",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
              "versions": _versions(clients), "rows": rows, "not_run": missing, "errors": errors,
              "samples": samples}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"{args.size_mb} MiB blob, parts {args.part_mb} MiB x{args.concurrency}, moto on 127.0.0.1, "
          f"{os.cpu_count()} CPUs, {args.repeat} round(s): median MB/s (min-max)")
    print(f"{'store':<16} {'op':<9} {'MB/s':>8} {'range':>15} {'x local':>8}  load avg (1 min) over its samples")
    for r in rows:
        print(f"{r['store']:<16} {r['op']:<9} {r['mb_s']:>8.1f} {r['min_mb_s']:>7.1f}-{r['max_mb_s']:<7.1f} "
              f"{r['ratio_to_local']:>8.2f}  {r['loadavg_1min'][0]:.2f}-{r['loadavg_1min'][1]:.2f}")
    for name, why in missing.items():
        print(f"{name:<16} {why}")
    for e in errors:
        print(f"{e['store']:<16} round {e['round']} failed: {e['error'][:200]}")
    print(f"wrote {args.output}")
    return 0


def _summary(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (store, op): the median of its rounds, their range, the ratio to the local store's median."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for s in samples:
        groups.setdefault((s["store"], s["op"]), []).append(s)
    local = {op: statistics.median(x["mb_s"] for x in g) for (store, op), g in groups.items() if store == "local store"}
    rows = []
    for (store, op), g in groups.items():
        speeds = [x["mb_s"] for x in g]
        loads = [x["loadavg_before"][0] for x in g] + [x["loadavg_after"][0] for x in g]
        median = statistics.median(speeds)
        rows.append({"store": store, "op": op, "mb_s": round(median, 1), "min_mb_s": min(speeds),
                     "max_mb_s": max(speeds), "samples_mb_s": speeds,
                     "ratio_to_local": round(median / local[op.split()[0]], 3),
                     "loadavg_1min": [round(min(loads), 2), round(max(loads), 2)]})
    return rows


def _local_rows(src: Path, size: int, work: Path) -> list[dict[str, Any]]:
    local = ArtifactStore(work / "local")
    ref = None

    def put() -> None:
        nonlocal ref
        ref = local.put(src, ArtifactKind.ENGINE)

    rows = [{"store": "local store", "op": "put", **_timed(put, size)}]
    assert ref is not None
    out = work / "local-out.bin"
    rows.append({"store": "local store", "op": "get", **_timed(lambda: local.get_file(ref.sha256, out), size)})
    out.unlink()
    shutil.rmtree(work / "local")
    return rows


def _raw_rows(name: str, server: MotoServer, src: Path, size: int, part: int, concurrency: int,
              work: Path) -> list[dict[str, Any]]:
    put, get = RAW[name](server, server.create_bucket(f"raw-{name}"), part, concurrency)
    rows = [{"store": f"{name} raw", "op": "put", **_timed(lambda: put(src, "blob"), size)}]
    out = work / f"{name}-out.bin"
    rows.append({"store": f"{name} raw", "op": "get", **_timed(lambda: get("blob", out), size)})
    out.unlink()
    return rows


def _s3_store_rows(server: MotoServer, src: Path, size: int, part: int, concurrency: int,
                   work: Path) -> list[dict[str, Any]]:
    from edgefarm.artifacts.location import S3Location
    from edgefarm.artifacts.s3 import S3ArtifactStore

    bucket = server.create_bucket("store")
    store = S3ArtifactStore(S3Location(bucket, "bench"), cache_dir=work / "cache", cache_bytes=4 * size,
                            environ=server.env(), part_size=part, concurrency=concurrency)
    rows = []
    ref = None

    def put() -> None:
        nonlocal ref
        ref = store.put(src, ArtifactKind.ENGINE)

    rows.append({"store": "s3 store", "op": "put", **_timed(put, size)})
    assert ref is not None
    shutil.rmtree(work / "cache")
    out = work / "store-out.bin"
    rows.append({"store": "s3 store", "op": "get", **_timed(lambda: store.get_file(ref.sha256, out), size)})
    out.unlink()
    rows.append({"store": "s3 store", "op": "get warm", **_timed(lambda: store.get_file(ref.sha256, out), size)})
    out.unlink()
    shutil.rmtree(work / "cache")
    return rows


def _versions(clients: list[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ["moto", *sorted({c.split("-")[0] for c in clients})]:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


if __name__ == "__main__":
    raise SystemExit(main())
