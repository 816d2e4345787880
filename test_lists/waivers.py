"""Waivers: a known failure, skipped until its bug is fixed or the waiver expires.

A waiver is valid through its ``expires`` date (inclusive); from the day after, it waives nothing and is reported
so someone renews or removes it. Every waiver names its bug: a waiver without a link is how failures get forgotten,
and a placeholder link (an example domain, a made-up owner, a link to no issue) is refused as none
(:func:`bug_link_problem`).
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import Field, field_validator

from edgefarm.test_lists.schema import NonEmptyStr, _Strict

_URL_RE = re.compile(r"^https?://[^\s/]+\.[^\s/]+(?:/\S*)?\Z")
# A link that cannot be a filed bug: reserved example and test domains (RFC 2606/6761), a placeholder owner on a
# forge, or no path to an issue at all. GitHub and GitLab links must name the issue or pull request itself.
_PLACEHOLDER_HOSTS = re.compile(r"(?:^|\.)(?:example\.(?:com|org|net)|example|test|invalid|localhost)\Z")
_PLACEHOLDER_WORDS = re.compile(r"(?i)(?:placeholder|todo|tbd|xxx+|changeme|/0+(?:/|\Z))")
_FORGE_ISSUE = {
    "github.com": re.compile(r"^/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+/(?:issues|pull)/[1-9][0-9]*(?:#\S*)?\Z"),
    "gitlab.com": re.compile(r"^/[A-Za-z0-9_./-]+/-/(?:issues|merge_requests)/[1-9][0-9]*(?:#\S*)?\Z"),
}
_PLACEHOLDER_OWNERS = {"example", "examples", "org", "owner", "user", "your-org", "yourorg", "someone", "foo"}


def bug_link_problem(url: str) -> str | None:
    """Why ``url`` is not a real link to a filed bug (None when it can be one)."""
    from urllib.parse import urlsplit

    if not _URL_RE.match(url):
        return f"bug {url!r} is not an http(s) URL of the tracking issue"
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    want = "a link to the filed issue, e.g. https://github.com/OWNER/REPO/issues/123"
    if _PLACEHOLDER_HOSTS.search(host):
        return f"bug {url!r} is a placeholder link ({host} is a reserved example domain); give {want}"
    if _PLACEHOLDER_WORDS.search(url):
        return f"bug {url!r} is a placeholder link; give {want}"
    if (pattern := _FORGE_ISSUE.get(host)) is not None:
        if not pattern.match(parts.path):
            return f"bug {url!r} names no issue on {host}; give {want}"
        owner = parts.path.split("/")[1].lower()
        if owner in _PLACEHOLDER_OWNERS:
            return f"bug {url!r} is a placeholder link (owner {owner!r}); give {want}"
    elif parts.path in ("", "/"):
        return f"bug {url!r} names no issue (no path); give {want}"
    return None


class Waiver(_Strict):
    pattern: NonEmptyStr = Field(description="fnmatch pattern over compact test ids")
    platforms: list[NonEmptyStr] = Field(default=[], description="platform names/globs; empty: every platform")
    bug: str = Field(description="URL of the bug this waiver tracks")
    expires: dt.date
    reason: str | None = None

    @field_validator("bug")
    @classmethod
    def _bug_is_url(cls, value: str) -> str:
        if (problem := bug_link_problem(value)) is not None:
            raise ValueError(problem)
        return value

    def is_expired(self, today: dt.date) -> bool:
        return today > self.expires

    def covers_platform(self, platform: str) -> bool:
        return not self.platforms or any(fnmatch.fnmatchcase(platform, g) for g in self.platforms)

    def matches(self, test_id: str, platform: str) -> bool:
        return fnmatch.fnmatchcase(test_id, self.pattern) and self.covers_platform(platform)

    def describe(self) -> str:
        scope = f" on {', '.join(self.platforms)}" if self.platforms else ""
        return f"waiver {self.pattern!r}{scope} ({self.bug})"


class SourcedWaiver(_Strict):
    """A waiver and where it is written (for reports)."""

    waiver: Waiver
    file: Path
    line: int | None = None


def active_waiver(waivers: Iterable[Waiver], test_id: str, platform: str, today: dt.date) -> Waiver | None:
    """The first unexpired waiver covering this test on this platform."""
    return next((w for w in waivers if not w.is_expired(today) and w.matches(test_id, platform)), None)


def expired_waivers(waivers: Iterable[Waiver], today: dt.date) -> list[Waiver]:
    return [w for w in waivers if w.is_expired(today)]


def utc_today() -> dt.date:
    return dt.datetime.now(dt.UTC).date()
