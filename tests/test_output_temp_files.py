"""Outputs the farm writes beside a user's path or in its cache (a JUnit report, a bisection probe's cached answer)
go through a temporary file of an unpredictable name: a link planted at the name the writers used to take
(".<name>.tmp", ".<key>.<pid>.tmp") is never written through."""

from __future__ import annotations

import os
from pathlib import Path

from edgefarm.cli.junit import write_junit
from edgefarm.tasks.bisect import ProbeResult, write_cached


def _plant(link: Path, victim: Path) -> None:
    victim.write_text("precious\n")
    link.symlink_to(victim)


def test_a_junit_report_never_writes_through_a_planted_temp_link(tmp_path: Path) -> None:
    out, victim = tmp_path / "nightly.xml", tmp_path / "victim.txt"
    _plant(tmp_path / ".nightly.xml.tmp", victim)
    write_junit({"rows": [], "failed": []}, out, "nightly")
    assert victim.read_text() == "precious\n" and out.read_text().startswith("<?xml")


def test_a_cached_probe_never_writes_through_a_planted_temp_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    _plant(tmp_path / f".k1.{os.getpid()}.tmp", victim)
    write_cached(tmp_path, "k1", ProbeResult("abc", "subject", "good", 1.0))
    assert victim.read_text() == "precious\n" and (tmp_path / "k1.json").is_file()
