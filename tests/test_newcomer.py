"""Issue 41: what a newcomer hit in the first hour, walked again (fresh data dir: a nightly on a small matrix, a
bring-up of a scratch checkpoint, query, compare, runs, show), each item checked where it shows."""

from __future__ import annotations

from pathlib import Path

from flows.docs import publish_bringup, write_docs
from results.db import make_engine
from results.migrate import upgrade
from results.recorder import Recorder
from tests.helpers.docs_db import PIPELINE, TRT, _row


def _nightly_and_bringup(tmp_path: Path) -> tuple[str, int, int]:
    """A nightly of stories260K on x86-cpu, then a bring-up of a scratch checkpoint on x86-cpu and thor."""
    url = f"sqlite:///{tmp_path / 'edgefarm.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    nightly = rec.start_run("nightly", "schedule", "abc")
    _row(rec, nightly, "stories260K", "fp32", "x86-cpu", dict.fromkeys(PIPELINE, "pass"), device="local-cpu",
         metrics={"perplexity_ratio": (1.0001, "")})
    rec.finish_run(nightly, "passed")
    bringup = rec.start_run("bringup", "cli: bring-up bringup-my-qwen3", "abc")
    _row(rec, bringup, "bringup-my-qwen3", "fp32", "x86-cpu", dict.fromkeys(PIPELINE, "pass"), device="local-cpu")
    _row(rec, bringup, "bringup-my-qwen3", "fp16", "thor", {"export": "pass"}, toolchain=TRT)
    _row(rec, bringup, "stories260K", "fp32", "x86-cpu", {"export": "fail"}, reason="scratch copy broke")
    rec.finish_run(bringup, "failed")
    engine.dispose()
    return url, nightly, bringup


def test_item1_a_scratch_bring_up_never_becomes_support(tmp_path: Path) -> None:
    url, nightly, bringup = _nightly_and_bringup(tmp_path)
    out = tmp_path / "docs"
    result = write_docs(url, out, tmp_path / "data")
    published = [p for p in out.rglob("*") if p.is_file() and "runs" not in p.parts]
    assert {p.name for p in published} >= {"supported-models.md", "support-matrix.html", "support-matrix.md"}
    for page in published:  # the nightly's pages, the Edge-LLM layout's included
        text = page.read_text(errors="replace")
        assert "bringup-my-qwen3" not in text, page
        assert "scratch copy broke" not in text, page  # a bring-up's row never overrides a nightly's either
        assert f"run-{bringup}." not in text, page
    assert f"runs/run-{nightly}.md" in (out / "supported-models.md").read_text()
    assert result["rows"] == 1 and result["supported"] == 1
    assert not (out / "runs" / f"run-{bringup}.md").exists()  # write_docs does not write it...
    page = publish_bringup(url, out, bringup, tmp_path / "data")  # ...the bring-up writes its own, and only that
    assert page == out / "runs" / f"run-{bringup}.md" and "bringup-my-qwen3" in page.read_text()
    assert "bringup-my-qwen3" not in (out / "supported-models.md").read_text()
