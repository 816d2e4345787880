"""Waivers: a known failure, skipped until its bug is fixed or the waiver expires.

A waiver is valid through its ``expires`` date (inclusive); from the day after, it waives nothing and is reported
so someone renews or removes it. Every waiver names its bug: a waiver without a link is how failures get forgotten.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path

from pydantic import Field, field_validator

from test_lists.schema import NonEmptyStr, _Strict

_URL_RE = re.compile(r"^https?://[^\s/]+\.[^\s/]+(?:/\S*)?\Z")


class Waiver(_Strict):
    pattern: NonEmptyStr = Field(description="fnmatch pattern over compact test ids")
    platforms: list[NonEmptyStr] = Field(default=[], description="platform names/globs; empty: every platform")
    bug: str = Field(description="URL of the bug this waiver tracks")
    expires: dt.date
    reason: str | None = None

    @field_validator("bug")
    @classmethod
    def _bug_is_url(cls, value: str) -> str:
        if not _URL_RE.match(value):
            raise ValueError(f"bug {value!r} is not an http(s) URL of the tracking issue")
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
