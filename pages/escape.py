"""Values written into published text: Markdown pages and artifacts, and CSV that people open in a spreadsheet.
Model names, reasons, hosts and versions come from files, databases and devices (anyone may have written them):
none may add HTML, links or emphasis to a page, break a table row, or become a formula in a spreadsheet. The HTML
page escapes with ``html.escape`` (pages/docs_html.py) and the terminal with ``cli.text.cell``."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
# what Markdown (CommonMark, GitHub's tables) would read as syntax: every such character gets a backslash, which
# CommonMark allows before any ASCII punctuation; `_` between letters or digits opens nothing (int4_awq stays)
_MARKDOWN = re.compile(r"[\\`*\[\]<|~&#!$]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
# a cell a spreadsheet would run as a formula (OWASP's CSV injection list); a quote in front makes it text
# a link a page may show as a link: http(s), a host name, a path of plain URL characters (no quotes, spaces, markup)
_LINK = re.compile(r"https?://[A-Za-z0-9.-]+(?::\d+)?(?:/[A-Za-z0-9._~/%?#=&+:-]*)?\Z")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d", "\uff0b", "\uff0d", "\uff20")


def markdown_text(value: object) -> str:
    """``value`` as literal Markdown text on one line: control characters (newlines too) become one space, and
    every character Markdown or inline HTML would interpret is backslash-escaped."""
    one_line = _CONTROL.sub(" ", str(value))
    # "://" split so that GitHub's extended autolinks do not make a link of a scheme in a name
    return _MARKDOWN.sub(lambda m: "\\" + m.group(), one_line).replace("://", ":\\/\\/")


def spreadsheet_cell(value: object) -> object:
    """A CSV cell that no spreadsheet runs: text starting like a formula gets a leading ``'`` (OWASP); numbers,
    booleans and None are written as they are."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def safe_link(value: object) -> str | None:
    """``value`` when it is an http(s) URL of plain characters (a waiver's bug link), safe as a Markdown link
    target and, escaped, as an HTML href; else None (show it as text)."""
    text = str(value) if value is not None else ""
    return text if _LINK.match(text) else None
