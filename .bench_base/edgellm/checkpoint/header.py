"""A safetensors header reader that treats the file as hostile and never reads tensor data.

Layout: ``u64 little-endian N`` | ``N bytes of JSON header`` | data section. The header maps tensor names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the data section) plus an optional
``"__metadata__"`` str->str map. Rules enforced here, each violation a ``CheckpointError`` naming file,
tensor and rule: the header length fits the file and the cap; the header is UTF-8 JSON, an object, without
duplicate keys; every entry has a known dtype, a shape of non-negative integers and offsets inside the data
section spanning exactly numel x itemsize; tensors cover the data section with no overlap and no hole.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from edgellm.errors import CheckpointError

MAX_HEADER_BYTES = 100 * 1024 * 1024
PREFIX_BYTES = 8
METADATA_KEY = "__metadata__"

# Bits per element of every dtype the safetensors format defines.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives. ``data_offsets`` are relative to the data section; ``file_offsets`` absolute."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    data_offsets: tuple[int, int]
    data_start: int  # absolute offset of the data section in the file (8 + header length)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.data_offsets[1] - self.data_offsets[0]

    @property
    def file_offsets(self) -> tuple[int, int]:
        return self.data_start + self.data_offsets[0], self.data_start + self.data_offsets[1]


@dataclass(frozen=True)
class SafetensorsHeader:
    file: Path
    file_size: int
    header_bytes: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_bytes(self) -> int:
        return self.file_size - PREFIX_BYTES - self.header_bytes


@dataclass
class HeaderScan:
    """Result of reading one header: the parsed header (None when the file is unusable) and every problem."""

    header: SafetensorsHeader | None
    problems: list[CheckpointError]

    def raise_first(self) -> SafetensorsHeader:
        if self.problems:
            raise self.problems[0]
        assert self.header is not None
        return self.header


def read_header(path: Path, *, name: str | None = None) -> SafetensorsHeader:
    """Parse and validate ``path``'s header; raise the first problem as ``CheckpointError``."""
    return scan_header(path, name=name).raise_first()


def scan_header(path: Path, *, name: str | None = None) -> HeaderScan:
    """Parse ``path``'s header collecting every problem. ``name`` is how messages name the file."""
    path = Path(path)
    label = name or str(path)
    try:
        with path.open("rb") as fp:
            size = os.fstat(fp.fileno()).st_size
            return scan_header_stream(fp, size, file=label, path=path)
    except FileNotFoundError:
        return HeaderScan(None, [CheckpointError("file not found", file=label)])
    except IsADirectoryError:
        return HeaderScan(None, [CheckpointError("is a directory, not a safetensors file", file=label)])
    except PermissionError:
        return HeaderScan(None, [CheckpointError("permission denied", file=label)])


def scan_header_stream(fp: BinaryIO, size: int, *, file: str, path: Path | None = None) -> HeaderScan:
    """Parse a header from an open binary stream of ``size`` bytes. Reads only the prefix and the header."""

    def fatal(msg: str) -> HeaderScan:
        return HeaderScan(None, [CheckpointError(msg, file=file)])

    if size < PREFIX_BYTES:
        return fatal(f"file is {size} bytes, shorter than the {PREFIX_BYTES}-byte header-length prefix (truncated)")
    fp.seek(0)
    (n,) = struct.unpack("<Q", fp.read(PREFIX_BYTES))
    if n > MAX_HEADER_BYTES:
        return fatal(f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte cap")
    if n > size - PREFIX_BYTES:
        return fatal(f"header length {n} exceeds the {size - PREFIX_BYTES} bytes after the prefix (truncated file)")
    raw = fp.read(n)
    if len(raw) != n:
        return fatal(f"could read only {len(raw)} of {n} header bytes (truncated file)")
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except _DuplicateKey as exc:
        return fatal(f"header is not valid: duplicate key {exc.key!r}")
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return fatal(f"header is not valid UTF-8 JSON ({_one_line(exc)})")
    if not isinstance(data, dict):
        return fatal(f"header must be a JSON object, got {type(data).__name__}")
    data_len = size - PREFIX_BYTES - n
    data_start = PREFIX_BYTES + n
    problems: list[CheckpointError] = []
    metadata = _metadata(data.get(METADATA_KEY, {}), file, problems)
    tensors: dict[str, TensorInfo] = {}
    for tname, entry in data.items():
        if tname == METADATA_KEY:
            continue
        info = _entry(tname, entry, data_len, data_start, file, path, problems)
        if info is not None:
            tensors[tname] = info
    entries_ok = not problems
    problems.extend(_layout_problems(tensors, data_len, file, report_holes=entries_ok))
    header = SafetensorsHeader(file=path or Path(file), file_size=size, header_bytes=n, tensors=tensors,
                               metadata=metadata)
    return HeaderScan(header, problems)


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _metadata(value: Any, file: str, problems: list[CheckpointError]) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        problems.append(CheckpointError(f"{METADATA_KEY} must be a map of strings to strings", file=file))
        return {}
    return dict(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _entry(name: str, entry: Any, data_len: int, data_start: int, file: str, path: Path | None,
           problems: list[CheckpointError]) -> TensorInfo | None:
    def bad(msg: str) -> None:
        problems.append(CheckpointError(msg, file=file, tensor=name))

    if not name:
        bad("empty tensor name")
        return None
    if not isinstance(entry, dict):
        bad(f"entry must be an object with dtype, shape and data_offsets, got {type(entry).__name__}")
        return None
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
    if missing:
        bad(f"entry lacks {', '.join(missing)}")
        return None
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        bad(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BITS))}")
        return None
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        bad(f"shape {_short(shape)} must be a list of non-negative integers")
        return None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        bad(f"data_offsets {_short(offsets)} must be a list of two integers [begin, end]")
        return None
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        broken = ("begin >= 0" if begin < 0 else "begin <= end" if begin > end
                  else f"end <= {data_len}, the data section's size: the file is truncated or the offsets are wrong")
        bad(f"data_offsets [{begin}, {end}] lie outside the {data_len}-byte data section (need 0 <= begin <= end <= "
            f"{data_len}; broken: {broken})")
        return None
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        bad(f"shape {shape} of {dtype} is {bits} bits, not a whole number of bytes")
        return None
    if end - begin != bits // 8:
        bad(f"data_offsets span {end - begin} bytes but shape {shape} x {dtype} needs {bits // 8}")
        return None
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), file=path or Path(file),
                      data_offsets=(begin, end), data_start=data_start)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _layout_problems(tensors: dict[str, TensorInfo], data_len: int, file: str, *,
                     report_holes: bool) -> list[CheckpointError]:
    """Tensors must tile the data section: sorted by offset, each begins where the previous ended.
    Holes are reported only when every entry parsed (a rejected entry would leave a spurious hole)."""
    problems: list[CheckpointError] = []
    pos, prev = 0, None
    for info in sorted(tensors.values(), key=lambda t: (t.data_offsets, t.name)):
        begin, end = info.data_offsets
        if begin < pos:
            problems.append(CheckpointError(
                f"data_offsets [{begin}, {end}] overlap tensor {prev!r} (which ends at {pos})",
                file=file, tensor=info.name))
        elif begin > pos and report_holes:
            problems.append(CheckpointError(
                f"hole: bytes [{pos}, {begin}) of the data section before it belong to no tensor",
                file=file, tensor=info.name))
        if end >= pos:
            pos, prev = end, info.name
    if report_holes and not problems and pos != data_len:
        problems.append(CheckpointError(
            f"hole: bytes [{pos}, {data_len}) at the end of the data section belong to no tensor", file=file))
    return problems
