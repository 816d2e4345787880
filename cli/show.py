"""``edgefarm show ID``: open the evidence a run page cites. ``ID`` is how the pages cite an artifact
(``log:2ff83abb115e``: its kind and the first 12 hex digits of its sha256), or a sha256 or a prefix of at least 8 hex
digits, optionally ``sha256:``-prefixed. A log prints to stdout (control characters shown, never sent to the
terminal; ``--tail N``); any artifact is copied out with ``--output PATH`` (a directory artifact unpacked there); any
other artifact is described (kind, size, sha256, the results that refer to it) with how to extract it.

Every byte is read through the artifact store, which re-hashes it: a corrupt blob is never shown as evidence (exit 3).
Exit codes: 0 shown, 2 a bad, unknown or ambiguous id (the message names the candidates), 3 the store failed."""

from __future__ import annotations

import re
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO

import typer

from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.cli.common import DataDirOption, DbOption, check_name, err, farm_errors, out
from edgefarm.cli.text import visible

if TYPE_CHECKING:
    from edgefarm.results.references import ArtifactReference

MIN_PREFIX = 8
_CHUNK = 1 << 20
TAIL_MAX_BYTES = 8 << 20  # --tail reads at most this much from a log's end (a longer last line is shown cut)
_ID = re.compile(r"(?:(?P<kind>[a-z0-9_]+):)?(?P<hex>[0-9a-f]+)")
TEXT_KINDS = (ArtifactKind.LOG, ArtifactKind.REPORT)  # printed as text (when stored as one file)
VALID_IDS = ("log:<12 hex digits> as the run pages cite it (or KIND:<hex> for another kind), a sha256, or a prefix "
             f"of at least {MIN_PREFIX} hex digits, optionally sha256:-prefixed")


def place_of(ref: ArtifactReference) -> str:
    """Where an artifact was recorded: its run and, for a stage's artifact, the row, stage and test."""
    if ref.model is None:
        place = f"run {ref.run_id} (the run's own {ref.kind})"
    else:
        place = f"run {ref.run_id}: {ref.model} {ref.precision} @{ref.platform}, stage {ref.stage} (test {ref.test_id})"
    return place + (f", file {ref.path_hint}" if ref.path_hint else "")


def parse_id(text: str) -> tuple[str | None, str]:
    """``(kind or None, lowercase hex prefix)`` of an id; a ConfigurationError naming it and the valid forms."""
    from edgellm.errors import ConfigurationError

    found = _ID.fullmatch(text.strip().lower())
    if not found or not MIN_PREFIX <= len(found.group("hex")) <= 64:
        raise ConfigurationError(f"bad artifact id {text!r}; valid: {VALID_IDS}")
    kind = found.group("kind")
    if kind == "sha256":
        kind = None
    elif kind is not None:
        check_name("artifact kind", kind, [k.value for k in ArtifactKind])
    return kind, found.group("hex")


def references(s: Any, prefix: str) -> dict[str, list[ArtifactReference]]:
    """Every recorded artifact whose sha256 starts with ``prefix``, by sha256, with the results that refer to it."""
    from edgefarm.results.references import artifact_references

    return artifact_references(s, prefix)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    units = ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    return f"{value:.1f} {units[0]} ({n} bytes)"


def _store_where(store: Any) -> str:
    location = getattr(store, "location", None)
    return str(getattr(location, "url", None) or getattr(store, "root", "the artifact store"))


def resolve(ident: str, found: dict[str, list[ArtifactReference]],
            store: Any) -> tuple[str, list[ArtifactReference]]:
    """The one artifact ``ident`` names: recorded ones first (of its kind, when it names one), else a blob only the
    store holds (a full sha256 or a prefix of one). Unknown or ambiguous: a ConfigurationError naming candidates."""
    from edgellm.errors import ConfigurationError

    kind, prefix = parse_id(ident)
    of_kind = {sha: refs for sha, refs in found.items() if kind is None or any(r.kind == kind for r in refs)}
    if len(of_kind) == 1:
        sha = next(iter(of_kind))
        return sha, found[sha]
    if len(of_kind) > 1:
        lines = [f"artifact id {ident!r} is ambiguous: {len(of_kind)} artifacts start with {prefix}; give more hex "
                 "digits. Candidates:"]
        for sha, refs in sorted(of_kind.items()):
            lines.append(f"{refs[0].kind}:{sha[:12]}  sha256:{sha}  ({place_of(refs[0])})")
        raise ConfigurationError("\n".join(lines))
    if found:  # recorded, but as another kind than the id names
        others = ", ".join(f"{refs[0].kind}:{sha[:12]}" for sha, refs in sorted(found.items()))
        raise ConfigurationError(f"no {kind} artifact matches {ident!r}; artifacts of other kinds do: {others}")
    in_store = [sha for sha in store.list() if sha.startswith(prefix)]
    if len(in_store) == 1:
        return in_store[0], []
    if len(in_store) > 1:
        raise ConfigurationError(f"artifact id {ident!r} is ambiguous: {len(in_store)} blobs in the store "
                                 f"{_store_where(store)} start with {prefix}, none recorded in the results "
                                 f"database; give more hex digits. Candidates:\n" + "\n".join(sorted(in_store)))
    raise ConfigurationError(f"no artifact matches {ident!r}: none recorded in the results database and none in the "
                             f"artifact store {_store_where(store)} (another $EDGEFARM_ARTIFACTS or --data-dir? "
                             f"removed by `edgefarm gc`?); valid ids: {VALID_IDS}")


def _count_lines(f: BinaryIO) -> int:
    """Lines in the file, read in chunks: a final newline ends the last line, it starts none."""
    count, last = 0, b"\n"
    while chunk := f.read(_CHUNK):
        count += chunk.count(b"\n")
        last = chunk[-1:]
    return count + (last != b"\n")


def _tail(f: BinaryIO, size: int, tail: int) -> list[str]:
    """The last ``tail`` lines, read backwards from the end, at most ``TAIL_MAX_BYTES`` of them (a longer line is
    shown cut, marked)."""
    end, buf = size, b""
    while end > 0 and buf.count(b"\n") <= tail and len(buf) < TAIL_MAX_BYTES:
        start = max(0, end - _CHUNK)
        f.seek(start)
        buf = f.read(end - start) + buf
        end = start
    lines = buf.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    shown = [line.decode("utf-8", errors="replace") for line in lines[-tail:]]
    if end > 0 and shown and len(lines) <= tail:  # the first line started before what was read
        shown[0] = "[cut] " + shown[0]
    return shown


def _print_text(path: Path, tail: int | None, label: str) -> None:
    """The log at ``path`` (a verified copy), escaped; ``tail``: its last lines only, read from the end (a log of
    hundreds of MiB is never held in memory)."""
    with path.open("rb") as f:
        count = _count_lines(f)
        if tail:
            shown: Iterable[str] = _tail(f, f.tell(), tail)
        else:
            f.seek(0)
            shown = (raw.rstrip(b"\n").decode("utf-8", errors="replace") for raw in f)
        counted = f"{count} line" + ("" if count == 1 else "s")
        err.print(f"# {visible(label)}: {counted}" + (f", the last {min(tail, count)}" if tail else ""), markup=False)
        for line in shown:  # escaped: a log's escape sequences are shown, never sent to the terminal
            sys.stdout.write(visible(line.removesuffix("\r").expandtabs(8)) + "\n")
    sys.stdout.flush()


def _describe(sha: str, refs: list[ArtifactReference], store: Any) -> None:
    from edgefarm.artifacts.store import MissingArtifactError

    kind = refs[0].kind if refs else "unrecorded"
    packing = refs[0].packing if refs else Packing.FILE.value
    try:
        size = store.ref(sha, ArtifactKind.OTHER, Packing.FILE).size
        stored = f"yes, in {_store_where(store)}"
    except MissingArtifactError:
        size = refs[0].size if refs else 0
        stored = f"NO: not in {_store_where(store)} (removed by `edgefarm gc`, or another store?)"
    as_dir = "a directory (a tar, unpacked by --output)" if packing == Packing.TAR.value else "a file"
    out.print(f"artifact sha256:{sha}", markup=False)
    out.print(f"  kind: {visible(kind)}, {as_dir}, {_size(size)}", markup=False)
    out.print(f"  stored: {stored}", markup=False)
    out.print("  referenced by:" + ("" if refs else " nothing in the results database"), markup=False)
    for r in refs:
        out.print(f"    {visible(place_of(r))}", markup=False)
    short = f"{kind}:{sha[:12]}" if refs else sha[:16]
    out.print(f"  extract it: edgefarm show {short} --output PATH", markup=False)


def show(
    ident: Annotated[str, typer.Argument(metavar="ID", help="log:<sha12> as a run page cites it, a sha256 or a "
                                                             "prefix of >= 8 hex digits (sha256: optional)")],
    output: Annotated[Path | None, typer.Option("--output", "-o", help="copy the artifact to this new path (a "
                                                                        "directory artifact is unpacked there)")
                      ] = None,
    tail: Annotated[int | None, typer.Option("--tail", min=1, help="print only the last N lines of a log")] = None,
    info: Annotated[bool, typer.Option("--info", help="describe the artifact (kind, size, where it is referenced) "
                                                      "instead of printing it")] = False,
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Print a log, or extract or describe any artifact, by the id the run pages cite (e.g. log:2ff83abb115e)."""
    with farm_errors("show"):
        from edgefarm.flows.settings import Settings
        from edgefarm.results.db import read_only_engine, reading, redact
        from edgefarm.results.migrate import require_current

        _, prefix = parse_id(ident)  # refused before anything is opened
        settings = Settings.resolve(db=db, data_dir=data_dir, create=False)
        db_url = settings.existing_db_url()
        engine = read_only_engine(db_url)
        try:
            require_current(engine, redact(db_url))
            with reading(engine) as s:
                found = references(s, prefix)
        finally:
            engine.dispose()
        store = settings.artifact_store()
        try:
            sha, refs = resolve(ident, found, store)
            _open(store, sha, refs, output=output, tail=tail, info=info)
        finally:
            store.close()


def _open(store: Any, sha: str, refs: list[ArtifactReference], *, output: Path | None, tail: int | None,
          info: bool) -> None:
    from edgefarm.artifacts.store import MissingArtifactError
    from edgellm.errors import ConfigurationError

    try:
        packing = refs[0].packing if refs else Packing.FILE.value
        kind = refs[0].kind if refs else None
        if output is not None:
            if output.exists() or output.is_symlink():
                raise ConfigurationError(f"--output {str(output)!r} already exists; name a new path")
            if packing == Packing.TAR.value:
                store.extract(sha, output)
            else:
                store.get_file(sha, output)
            out.print(f"wrote {visible(output)} ({visible(kind or 'unrecorded')}, sha256:{sha}, verified)",
                      markup=False)
        elif not info and kind in TEXT_KINDS and packing == Packing.FILE.value:
            with tempfile.TemporaryDirectory(prefix="edgefarm-show-") as tmp:
                copy = store.get_file(sha, Path(tmp) / "text")  # verified while copied, in chunks
                _print_text(copy, tail, f"{kind}:{sha[:12]} ({place_of(refs[0])})")
        else:
            _describe(sha, refs, store)
    except MissingArtifactError:
        where = "; ".join(place_of(r) for r in refs[:3]) or "nothing recorded"
        raise ConfigurationError(f"artifact sha256:{sha} ({where}) is not in the artifact store "
                                 f"{_store_where(store)}: removed by `edgefarm gc`, or kept by another store "
                                 f"(--data-dir, $EDGEFARM_ARTIFACTS)?") from None
