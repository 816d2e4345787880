"""Values printed through Rich: never markup, never a broken line. Every name, host, label, reason or version a
table or message shows (they come from files, databases and devices: anyone may have written them) goes through
:func:`cell`; only the styles the farm chooses itself are markup."""

from __future__ import annotations

import re

from rich.text import Text

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def visible(value: object) -> str:
    """``value`` as one line of plain text: newlines, tabs, escape sequences and other control characters are
    shown as ``\\n``, ``\\x1b``..., so a value can neither break a row nor drive the terminal."""
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), str(value))


def cell(value: object, style: str = "") -> Text:
    """A table cell or message part that Rich prints exactly as written (no markup, one line), in ``style``."""
    return Text(visible(value), style=style)
