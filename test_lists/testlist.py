"""Loaded, validated test lists: what the orchestration asks "what runs on this platform?"."""

from __future__ import annotations

import dataclasses
import datetime as dt
import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from edgefarm.stages import Stage
from edgefarm.test_lists.ids import TestId, short_model_name
from edgefarm.test_lists.schema import ListStage, Selector
from edgefarm.test_lists.waivers import SourcedWaiver, Waiver, active_waiver, expired_waivers, utc_today
from edgefarm.toolchains.base import pinned_versions
from edgefarm.vocabulary.variant import PLAIN, Features, variant_json, variant_key
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision


@dataclass(frozen=True)
class TestEntry:
    """One test of a list: a model at a precision and engine limits, the stages to run and their timeouts."""

    __test__ = False  # not a pytest class

    list_name: str
    model: str
    precision: Precision
    max_seq_len: int
    max_batch_size: int
    max_input_len: int
    stages: tuple[str, ...]  # stage table names (recorded ones as Stage)
    timeouts: dict[Stage, int] = field(hash=False)
    lm_head_precision: LMHeadPrecision | None = None
    kv_cache_precision: KVCachePrecision | None = None
    case: str | None = None
    source: str = ""  # "file:line" where the entry is written
    waived: bool = False
    waiver: Waiver | None = field(default=None, hash=False)
    # the versions a matrix chose for the toolchains this test uses (empty: each one's pinned version); the id
    # names those other than the pinned, so the pinned version's test keeps the id every other run gives it
    toolchain_versions: tuple[tuple[str, str], ...] = ()
    # the toolchain a matrix block asked for (None: the platform's, in its order of preference); the id names it
    toolchain: str | None = None
    features: Features = PLAIN  # the variant beyond KV cache and LM head (vocabulary.variant); the id names it
    # the test id of the row this one runs after (an EAGLE3 draft's base): planned only when that one runs, each
    # stage only once that one's passed
    after: str | None = None

    @property
    def variant(self) -> str:
        """The row's variant key (``vocabulary.variant.variant_key``): part of the row's key in the database."""
        return variant_key(self.lm_head_precision, self.kv_cache_precision, self.features)

    def variant_json(self) -> dict[str, object]:
        return variant_json(self.lm_head_precision, self.kv_cache_precision, self.features)

    @property
    def short_name(self) -> str:
        return short_model_name(self.model)

    @property
    def id(self) -> TestId:
        return TestId(
            model=self.short_name,
            precision=self.precision,
            max_seq_len=self.max_seq_len,
            max_batch_size=self.max_batch_size,
            max_input_len=self.max_input_len,
            lm_head_precision=self.lm_head_precision,
            kv_cache_precision=self.kv_cache_precision,
            features=self.features.id_tokens(self.model),
            case=self.case,
            toolchain_versions=self.versions_in_id,
            toolchain=self.toolchain,
        )

    @property
    def versions_in_id(self) -> tuple[str, ...]:
        if not self.toolchain_versions:
            return ()
        pinned = pinned_versions()
        return tuple(f"{t}=={v}" for t, v in self.toolchain_versions if pinned.get(t) != v)

    @property
    def test_id(self) -> str:
        return self.id.format()

    def timeout(self, stage: Stage) -> int:
        return self.timeouts[stage]


@dataclass(frozen=True)
class TestList:
    """A validated list. ``waivers`` holds the list's own waivers, then those of the directory's waivers.yml."""

    __test__ = False  # not a pytest class

    name: str
    stage: ListStage
    description: str
    path: Path
    selector: Selector
    platforms: tuple[str, ...]  # the known platforms the selector picks
    entries: tuple[TestEntry, ...]
    waivers: tuple[SourcedWaiver, ...] = ()

    def selects(self, platform: str) -> bool:
        return platform in self.selector.terms or any(fnmatch.fnmatchcase(platform, g) for g in self.selector.wildcards)

    def accepts_device(self, platform: str, labels: Iterable[str] = ()) -> tuple[bool, list[str]]:
        """Whether a device of ``platform`` carrying ``labels`` may run this list, with every reason it may not."""
        reasons = []
        if not self.selects(platform):
            selected = ", ".join(self.platforms)
            reasons.append(f"platform {platform!r} is not selected by {self.name} (selects {selected})")
        missing = sorted(set(self.selector.labels) - set(labels))
        if missing:
            reasons.append(f"device lacks label(s) {', '.join(missing)} required by {self.name}")
        return not reasons, reasons

    def entries_for(self, platform: str, today: dt.date | None = None) -> list[TestEntry]:
        """Entries to run on ``platform`` (none if the list does not select it), each marked waived or not."""
        if not self.selects(platform):
            return []
        today = today or utc_today()
        waivers = [sw.waiver for sw in self.waivers]
        out = []
        for entry in self.entries:
            waiver = active_waiver(waivers, entry.test_id, platform, today)
            out.append(dataclasses.replace(entry, waived=waiver is not None, waiver=waiver))
        return out

    def expired_waivers(self, today: dt.date | None = None) -> list[Waiver]:
        return expired_waivers((sw.waiver for sw in self.waivers), today or utc_today())

    @property
    def test_ids(self) -> list[str]:
        return [e.test_id for e in self.entries]
