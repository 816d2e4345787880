"""The safetensors header reader: targeted rules, then random and mutated headers (hypothesis)."""

from __future__ import annotations

import io
import json
import math
import struct
from typing import Any

import pytest
import safetensors
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgellm import BUNDLED_MODEL_DIR
from edgellm.checkpoint.header import DTYPE_BITS, MAX_HEADER_BYTES, read_header, scan_header_stream
from edgellm.errors import CheckpointError
from tests.st_helpers import pack


def scan(blob: bytes) -> Any:
    return scan_header_stream(io.BytesIO(blob), len(blob), file="x.safetensors")


def problems(blob: bytes) -> list[str]:
    return [str(p) for p in scan(blob).problems]


def u8(name: str, begin: int, end: int, shape: list[int] | None = None) -> dict[str, Any]:
    return {name: {"dtype": "U8", "shape": [end - begin] if shape is None else shape, "data_offsets": [begin, end]}}


def test_reads_bundled_header_without_data() -> None:
    h = read_header(BUNDLED_MODEL_DIR / "model.safetensors")
    assert len(h.tensors) == 47 and h.metadata == {"format": "pt"}
    emb = h.tensors["model.embed_tokens.weight"]
    assert (emb.dtype, emb.shape, emb.numel, emb.nbytes) == ("F32", (512, 64), 32768, 131072)
    assert emb.file_offsets == (8 + h.header_bytes, 8 + h.header_bytes + 131072)
    assert sum(t.nbytes for t in h.tensors.values()) == h.data_bytes


@pytest.mark.parametrize(("blob", "needle"), [
    (b"\x01\x02", "file is 2 bytes, shorter than the 8-byte header-length prefix"),
    (struct.pack("<Q", 2**62) + b"{}", f"header length {2**62} exceeds the {MAX_HEADER_BYTES}-byte cap"),
    (struct.pack("<Q", 100) + b"{}", "header length 100 exceeds the 2 bytes after the prefix (truncated file)"),
    (pack(b"not json", b""), "header is not valid UTF-8 JSON"),
    (pack(b'{"a": "\xff"}', b""), "header is not valid UTF-8 JSON"),
    (pack(b"[1, 2]", b""), "header must be a JSON object, got list"),
    (pack(b'{"a": {"dtype": "U8", "shape": [NaN], "data_offsets": [0, 1]}}', b"x"), "non-standard JSON constant"),
    (pack(b'{"a": 1, "a": 2}', b""), "duplicate key 'a'"),
    (pack({"__metadata__": {"k": 1}}, b""), "__metadata__ must be a map of strings to strings"),
    (pack({"__metadata__": [], **u8("a", 0, 1)}, b"x"), "__metadata__ must be a map"),
    (pack({"a": [1]}, b""), "tensor 'a': entry must be an object"),
    (pack({"a": {"dtype": "U8", "shape": [1]}}, b"x"), "tensor 'a': entry lacks data_offsets"),
    (pack({"a": {"dtype": "F12", "shape": [1], "data_offsets": [0, 1]}}, b"x"), "tensor 'a': unknown dtype 'F12'"),
    (pack(u8("a", 0, 1, [-1]), b"x"), "tensor 'a': shape [-1] must be a list of non-negative integers"),
    (pack(u8("a", 0, 1, [True]), b"x"), "shape [true] must be a list of non-negative integers"),
    (pack(u8("a", 0, 1, [1.0]), b"x"), "shape [1.0] must be"),
    (pack({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, b"x"), "must be a list of two integers"),
    (pack(u8("a", 0, 2, [2]), b"x"), "tensor 'a': data_offsets [0, 2] lie outside the 1-byte data section"),
    (pack(u8("a", 1, 0, [0]), b"x"), "data_offsets [1, 0] lie outside"),
    (pack(u8("a", 0, 2, [3]), b"xx"), "tensor 'a': data_offsets span 2 bytes but shape [3] x U8 needs 3"),
    (pack({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"xx"), "12 bits, not a whole number"),
    (pack({**u8("a", 0, 4), **u8("b", 2, 6)}, b"x" * 6), "tensor 'b': data_offsets [2, 6] overlap tensor 'a'"),
    (pack({**u8("a", 0, 2), **u8("b", 4, 6)}, b"x" * 6), "tensor 'b': hole: bytes [2, 4) of the data section"),
    (pack(u8("a", 0, 2), b"x" * 5), "hole: bytes [2, 5) at the end of the data section"),
    (pack(u8("a", 2, 4), b"x" * 4), "tensor 'a': hole: bytes [0, 2)"),
    (pack(u8("", 0, 1), b"x"), "empty tensor name"),
])
def test_each_rule(blob: bytes, needle: str) -> None:
    found = problems(blob)
    assert found, f"expected a problem containing {needle!r}"
    assert any(needle in p for p in found), found
    assert all(p.startswith("x.safetensors: ") for p in found)
    with pytest.raises(CheckpointError):
        scan(blob).raise_first()


def test_collects_every_entry_problem() -> None:
    header = {**u8("a", 0, 1), "b": {"dtype": "Q9", "shape": [1], "data_offsets": [1, 2]},
              **u8("c", 2, 3, [-2]), **u8("d", 3, 4)}
    found = problems(pack(header, b"xxxx"))
    assert len(found) == 2 and "'b'" in found[0] + found[1] and "'c'" in found[0] + found[1]


def test_valid_edge_cases_parse() -> None:
    header = {"__metadata__": {"format": "pt"},
              "e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [0, 0]},
              "s": {"dtype": "F64", "shape": [], "data_offsets": [0, 8]},
              "f4": {"dtype": "F4", "shape": [2, 3], "data_offsets": [8, 11]}}
    sc = scan(pack(header, b"\0" * 11))
    assert sc.problems == []
    assert {n: (t.shape, t.nbytes) for n, t in sc.header.tensors.items()} == {
        "e": ((0, 5), 0), "s": ((), 8), "f4": ((2, 3), 3)}
    assert scan(pack(b"{}  ", b"")).problems == []  # safetensors pads headers with spaces


# --- property-based -------------------------------------------------------------------------------------------

SMALL_DTYPES = sorted(d for d, b in DTYPE_BITS.items() if b % 8 == 0)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def valid_files(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    names = draw(st.lists(st.text(min_size=1, max_size=8).filter(lambda s: s != "__metadata__"),
                          max_size=5, unique=True))
    header: dict[str, Any] = {}
    pos = 0
    for name in names:
        dtype = draw(st.sampled_from(SMALL_DTYPES))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        n = math.prod(shape) * DTYPE_BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2))
    return header, draw(st.binary(min_size=pos, max_size=pos))


def check_only_library_errors(blob: bytes) -> Any:
    """The reader may only report CheckpointErrors; whatever it accepts, the reference library accepts too."""
    sc = scan(blob)  # anything else escaping fails the test
    assert all(isinstance(p, CheckpointError) for p in sc.problems)
    if not sc.problems:
        ref = dict(safetensors.deserialize(blob))
        assert {n: (t.dtype, list(t.shape)) for n, t in sc.header.tensors.items()} == {
            n: (v["dtype"], v["shape"]) for n, v in ref.items()}
    return sc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_random_bytes(blob: bytes) -> None:
    check_only_library_errors(blob)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=128), st.binary(max_size=64))
def test_random_header_text(header: bytes, data: bytes) -> None:
    check_only_library_errors(pack(b"{" + header, data))


@settings(max_examples=200, deadline=None)
@given(valid_files())
def test_valid_headers_parse(file: tuple[dict[str, Any], bytes]) -> None:
    header, data = file
    sc = check_only_library_errors(pack(header, data))
    assert sc.problems == []
    assert set(sc.header.tensors) == set(header) - {"__metadata__"}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_files(), st.data())
def test_mutated_headers(file: tuple[dict[str, Any], bytes], data: st.DataObject) -> None:
    header, body = file
    names = [k for k in header if k != "__metadata__"]
    kind = data.draw(st.sampled_from(["field", "offset", "length", "body", "byte", "dup", "meta"]))
    length = None
    if kind == "field" and names:
        name = data.draw(st.sampled_from(names))
        key = data.draw(st.sampled_from(["dtype", "shape", "data_offsets", "extra"]))
        header[name][key] = data.draw(json_values)
    elif kind == "offset" and names:
        name = data.draw(st.sampled_from(names))
        i = data.draw(st.integers(0, 1))
        header[name]["data_offsets"][i] += data.draw(st.integers(-20, 20))
    elif kind == "meta":
        header["__metadata__"] = data.draw(json_values)
    raw = json.dumps(header).encode()
    if kind == "length":
        length = data.draw(st.one_of(st.integers(0, len(raw) + 40), st.integers(0, 2**64 - 1)))
    elif kind == "body":
        body = body[: data.draw(st.integers(0, len(body)))] + data.draw(st.binary(max_size=8))
    elif kind == "byte" and raw:
        at = data.draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1 :]
    elif kind == "dup" and names:
        name = json.dumps(data.draw(st.sampled_from(names)))
        raw = raw[:-1] + (b", " if len(header) else b"") + name.encode() + b': {"dtype": "U8"}}'
        sc = check_only_library_errors(pack(raw, body))
        assert any("duplicate key" in str(p) for p in sc.problems)
        return
    check_only_library_errors(pack(raw, body, length=length))
