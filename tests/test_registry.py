from __future__ import annotations

import pytest

from edgellm.errors import BugError, UnsupportedError
from edgellm.registry import Registry


def test_duplicate_name_is_an_error() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("a", 1)
    with pytest.raises(BugError, match="'a' registered twice"):
        reg.add("a", 2)


def test_unknown_name_suggests_and_lists_every_choice() -> None:
    reg: Registry[int] = Registry("model_type")
    for name in ("llama", "mistral", "qwen2", "qwen3"):
        reg.add(name, 0)
    with pytest.raises(UnsupportedError) as info:
        reg.get("lama")
    msg = str(info.value)
    assert "did you mean 'llama'" in msg
    assert "registered: llama, mistral, qwen2, qwen3" in msg
