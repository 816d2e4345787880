"""Build and rewrite raw safetensors files byte by byte, to corrupt them in precise ways."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

Header = dict[str, Any]


def pack(header: Header | bytes, data: bytes, *, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def split(blob: bytes) -> tuple[Header, bytes]:
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8 : 8 + n]), blob[8 + n :]


def rewrite(path: Path, mutate: Callable[[Header, bytes], tuple[Header | bytes, bytes]]) -> None:
    header, data = split(path.read_bytes())
    new_header, new_data = mutate(header, data)
    path.write_bytes(pack(new_header, new_data))


def set_field(path: Path, tensor: str, key: str, value: Any) -> None:
    def mutate(h: Header, d: bytes) -> tuple[Header, bytes]:
        h[tensor][key] = value
        return h, d

    rewrite(path, mutate)


def by_offset(header: Header) -> list[str]:
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
