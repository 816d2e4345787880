"""The one YAML reader for config files (matrices, inventories, device types, test lists, catalog, thresholds).

Hardened the way a config reader facing careless or hostile input must be:
- a size cap (``MAX_YAML_BYTES``) checked before parsing, so an 11 MB list is refused at once;
- anchors and aliases (``&a`` / ``*a``, and so ``<<`` merges) refused: a 600-byte "billion laughs" file would
  otherwise expand into billions of nodes when validated. A caller that needs them (Prefect's own
  prefect.yaml) passes ``aliases=True`` and gets a bound on the expanded node count instead;
- duplicate keys refused with file:line (PyYAML keeps the last one silently);
- every mapping is a ``LineDict`` remembering its lines, so validation errors can name file:line.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent, CollectionStartEvent, ScalarEvent

from edgellm.errors import ConfigurationError

MAX_YAML_BYTES = 1 << 20  # 1 MiB: the largest config file in the repository is a few KiB
MAX_EXPANDED_NODES = 100_000  # with aliases=True: nodes after expanding every alias


class LineDict(dict):
    """A mapping that knows the (1-based) line it starts on and the line of each key."""

    line: int = 0
    key_lines: dict[Any, int]


class YamlSyntaxError(ConfigurationError):
    """A config file that cannot be read as safe YAML; names the file and, where known, the line."""

    def __init__(self, path: Path | str, line: int | None, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")
        self.path = Path(path)
        self.line = line
        self.reason = reason


class _Loader(yaml.SafeLoader):
    allow_aliases = False

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._sizes: dict[int, int] = {}  # id(node) -> expanded node count
        self._expanded = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:  # type: ignore[override]
        event = self.peek_event()
        if not self.allow_aliases and (
            isinstance(event, AliasEvent)
            or (isinstance(event, ScalarEvent | CollectionStartEvent) and event.anchor is not None)
        ):
            raise ComposerError(
                None, None, "anchors and aliases (&name, *name, <<: *name) are not allowed in config files; "
                "write the values out", event.start_mark,
            )
        node = super().compose_node(parent, index)
        if isinstance(event, AliasEvent):
            self._expanded += self._size(node)
            if self._expanded > MAX_EXPANDED_NODES:
                raise ComposerError(
                    None, None, f"aliases expand to over {MAX_EXPANDED_NODES} nodes", event.start_mark
                )
        return node

    def _size(self, node: yaml.Node) -> int:
        """Nodes under ``node`` with aliases expanded (memoized: shared subtrees are counted once per use)."""
        key = id(node)
        if key not in self._sizes:
            if isinstance(node, yaml.MappingNode):
                self._sizes[key] = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                self._sizes[key] = 1 + sum(self._size(v) for v in node.value)
            else:
                self._sizes[key] = 1
        return self._sizes[key]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LineDict:  # type: ignore[override]
        self.flatten_mapping(node)
        out = LineDict()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in out
            except TypeError:  # an unhashable key (a list or mapping used as a key)
                raise ConstructorError(
                    "while constructing a mapping", node.start_mark, "a key must be a scalar", key_node.start_mark
                ) from None
            if duplicate:
                raise ConstructorError(
                    "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                )
            out[key] = self.construct_object(value_node, deep=deep)
            out.key_lines[key] = key_node.start_mark.line + 1
        return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _Loader.construct_mapping)


class _AliasLoader(_Loader):
    allow_aliases = True


def _file_kind(mode: int) -> str:
    kinds = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
             stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket"}
    return kinds.get(stat.S_IFMT(mode), "not a regular file")


def _read_text(path: Path, max_bytes: int) -> str:
    try:
        # O_NONBLOCK: opening a FIFO with no writer would wait forever; anything but a regular file is refused
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise YamlSyntaxError(path, None, f"is {_file_kind(st.st_mode)}, not a regular file: give the path "
                                                  f"of a YAML file")
            os.set_blocking(fd, True)
            size = st.st_size
            if size > max_bytes:
                raise YamlSyntaxError(path, None, f"is {size} bytes, over the {max_bytes}-byte limit for a config file")
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise YamlSyntaxError(path, None, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:  # grew, or not a regular file
        raise YamlSyntaxError(path, None, f"is over the {max_bytes}-byte limit for a config file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlSyntaxError(path, None, f"is not UTF-8 text (byte {exc.start})") from None


def loads_yaml(text: str, source: Path | str, *, aliases: bool = False, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """Parse ``text`` (from ``source``, named in errors) with the rules above."""
    if len(text) > max_bytes:
        raise YamlSyntaxError(source, None, f"is over the {max_bytes}-byte limit for a config file")
    try:
        return yaml.load(text, Loader=_AliasLoader if aliases else _Loader)  # SafeLoader subclasses
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        context = exc.context
        if context and exc.context_mark and exc.context_mark.line + 1 != line:
            context += f" (started at line {exc.context_mark.line + 1})"
        reason = " ".join(p for p in (context, exc.problem) if p)
        raise YamlSyntaxError(source, line, f"invalid YAML: {reason}") from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(source, None, f"invalid YAML: {exc}".replace("\n", " ")) from None
    except RecursionError:
        raise YamlSyntaxError(source, None, "invalid YAML: nested too deeply") from None


def read_yaml(path: Path, *, aliases: bool = False, max_bytes: int = MAX_YAML_BYTES) -> Any:
    """Parse the config file ``path``; every problem is a YamlSyntaxError (a ConfigurationError) naming it."""
    path = Path(path)
    return loads_yaml(_read_text(path, max_bytes), path, aliases=aliases, max_bytes=max_bytes)


def read_yaml_mapping(path: Path, *, what: str = "a mapping of keys to values") -> LineDict:
    """A config file whose top level is a mapping; anything else is a ConfigurationError naming the file."""
    data = read_yaml(path)
    if not isinstance(data, LineDict):
        raise YamlSyntaxError(path, None, f"expected {what}, got {type(data).__name__}")
    return data


def line_of(data: Any, loc: Sequence[Any]) -> int | None:
    """Best line for a pydantic error location: the deepest mapping key on the path that exists."""
    line = data.line if isinstance(data, LineDict) else None
    node = data
    for part in loc:
        if isinstance(node, LineDict) and part in node:
            line = node.key_lines.get(part, line)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            if isinstance(node, LineDict):
                line = node.line
        else:
            break
    return line
