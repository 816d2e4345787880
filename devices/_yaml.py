"""Reading small YAML config files and turning pydantic errors into one line per problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import yaml

from edgellm.errors import ConfigurationError


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping; anything else is a ConfigurationError naming the file."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigurationError(f"{path}: cannot read: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigurationError(f"{path}: invalid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path}: expected a mapping of keys to values, got {type(data).__name__}")
    return data


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
