"""YAML reading that remembers line numbers and refuses duplicate keys (PyYAML would keep the last silently)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError


class LineDict(dict):
    """A mapping that knows the (1-based) line it starts on and the line of each key."""

    line: int = 0
    key_lines: dict[Any, int]


class _LineLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> LineDict:  # type: ignore[override]
        self.flatten_mapping(node)
        out = LineDict()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in out:
                raise ConstructorError(
                    "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                )
            out[key] = self.construct_object(value_node, deep=deep)
            out.key_lines[key] = key_node.start_mark.line + 1
        return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _LineLoader.construct_mapping)


class YamlSyntaxError(Exception):
    def __init__(self, path: Path, line: int | None, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


def read_yaml(path: Path) -> Any:
    """Parse ``path``; a syntax error becomes YamlSyntaxError naming the file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise YamlSyntaxError(path, None, f"cannot read: {exc.strerror or exc}") from None
    try:
        return yaml.load(text, Loader=_LineLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        context = exc.context
        if context and exc.context_mark and exc.context_mark.line + 1 != line:
            context += f" (started at line {exc.context_mark.line + 1})"
        reason = " ".join(p for p in (context, exc.problem) if p)
        raise YamlSyntaxError(path, line, f"invalid YAML: {reason}") from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(path, None, f"invalid YAML: {exc}") from None


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
