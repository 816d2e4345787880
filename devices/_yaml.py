"""Reading device config files (through edgellm.yamlio) and turning pydantic errors into one line per problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic

from edgellm import yamlio


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (edgellm.yamlio: size cap, no aliases, no duplicate keys)."""
    return yamlio.read_yaml_mapping(path)


def validation_problems(path: Path, err: pydantic.ValidationError, *, valid_keys: list[str]) -> list[str]:
    """One ``file: field: problem`` line per pydantic error, naming the bad value."""
    lines = []
    for item in err.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(file)"
        kind = item["type"]
        if kind == "extra_forbidden":
            lines.append(f"{path}: unknown key {field!r}; valid keys: {', '.join(valid_keys)}")
        elif kind == "missing":
            lines.append(f"{path}: {field}: required key is missing")
        elif kind == "value_error":
            lines.append(f"{path}: {field}: {item['ctx']['error']}")
        else:
            lines.append(f"{path}: {field}: {item['msg']} (got {item.get('input')!r})")
    return lines
