"""``edgefarm compare`` (pages/compare.py, cli/compare.py) on a fixed SQLite database recorded through the real
Recorder: three nightly runs of tensorrt-edgellm 0.11.0 (the history), a nightly running 0.11.0 and 0.12.0 side by
side, a later nightly of another farm commit and a run still running (never compared).

    run 1-3  commit aaa1111  orin: llama, qwen (trt 0.11.0, pinned); x86-cpu: stories (edgellm-ort),
                             tinyq int4_awq (an edgellm-ort job quantized by trt 0.11.0)               all pass
    run 4    commit bbb2222  orin, toolchain_versions 0.11.0: llama, qwen, gemma (only here: lost in 0.12.0)
                                               0.12.0: llama (decode 110: outside noise), qwen (accuracy
                                               fails: a regression; decode within noise), phi and a hostile
                                               name (gained); x86-cpu: stories, tinyq quantized by
                                               each version (decode 31 -> 40: outside noise)
    run 5    commit ccc3333  x86-cpu: stories (infer fails)
    run 6    running (unpublished)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.pages.compare import (
    Band,
    CommitSide,
    RowId,
    RowSide,
    RunSide,
    ToolchainVersionSide,
    compare_rows,
    comparison_slug,
    noise_band,
    noise_verdict,
    published_comparisons,
)
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.queries import RowKey
from edgefarm.results.recorder import Recorder
from edgellm.types import Precision

TRT, ORT = "tensorrt-edgellm", "edgellm-ort"
ORT_V = "0.1.0+onnxruntime-1.22.0"
PIPELINE = ("export", "build", "infer", "accuracy", "bench")
HOSTILE = "evil\x1b[2J<script>alert(1)</script>|[x](http://e.x)*"


def _row(rec: Recorder, run: int, model: str, platform: str, toolchain: str, version: str,
         chosen: str | None = None, fail: str | None = None, metrics: dict[str, float] | None = None) -> None:
    failed = False
    for stage in PIPELINE:
        status = "skipped" if failed else "fail" if stage == fail else "pass"
        failed = failed or (stage == fail and stage != "accuracy")
        rec.record_result(run, model=model, precision="fp16", platform=platform, stage=stage,
                          test_id=f"{model}@{chosen or 'pinned'}", status=status, toolchain=toolchain,
                          toolchain_version=None if status == "skipped" else version, chosen_versions=chosen,
                          reason=f"broke: log /home/ci/secret/{stage}.log from edge@10.1.2.3" if status == "fail"
                          else None,
                          metrics={k: (v, "tok/s") for k, v in (metrics or {}).items()} if stage == "bench" else None)


def _quantized(rec: Recorder, run: int, trt: str, chosen: str | None, decode: float) -> None:
    """tinyq int4_awq on x86-cpu: an edgellm-ort job whose quantize stage tensorrt-edgellm made (at ``trt``)."""
    for stage in ("quantize", *PIPELINE):
        rec.record_result(run, model="tinyq", precision="int4_awq", platform="x86-cpu", stage=stage,
                          test_id=f"tinyq@{chosen or 'pinned'}", status="pass", chosen_versions=chosen,
                          toolchain=TRT if stage == "quantize" else ORT, job_toolchain=ORT,
                          toolchain_version=trt if stage == "quantize" else ORT_V,
                          metrics={"decode_tokens_per_s": (decode, "tok/s")} if stage == "bench" else None)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('compare') / 'edgefarm.db'}"
    _record(url)
    return url


def _record(url: str) -> None:
    """The runs of the module doc, into a fresh database at ``url``."""
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    for i, (llama, qwen, stories) in enumerate(((100.0, 50.0, 400.0), (101.0, 50.5, 402.0), (99.0, 49.5, 398.0))):
        run = rec.start_run("nightly", "schedule", "aaa1111")
        prefill = {"prefill_tokens_per_s": 900.0} if i == 2 else {}  # one history point: no band
        _row(rec, run, "llama", "orin", TRT, "0.11.0", metrics={"decode_tokens_per_s": llama, **prefill})
        _row(rec, run, "qwen", "orin", TRT, "0.11.0", metrics={"decode_tokens_per_s": qwen})
        _row(rec, run, "stories", "x86-cpu", ORT, ORT_V, metrics={"decode_tokens_per_s": stories})
        _quantized(rec, run, "0.11.0", None, 30.0 + i)
        rec.finish_run(run, "passed")
    run = rec.start_run("nightly", "schedule", "bbb2222")
    old, new = f"{TRT}==0.11.0", f"{TRT}==0.12.0"
    _row(rec, run, "llama", "orin", TRT, "0.11.0", old, metrics={"decode_tokens_per_s": 100.5,
                                                                 "prefill_tokens_per_s": 905.0})
    _row(rec, run, "qwen", "orin", TRT, "0.11.0", old, metrics={"decode_tokens_per_s": 50.0})
    _row(rec, run, "gemma", "orin", TRT, "0.11.0", old)
    _row(rec, run, "llama", "orin", TRT, "0.12.0", new, metrics={"decode_tokens_per_s": 110.0,
                                                                 "prefill_tokens_per_s": 950.0})
    _row(rec, run, "qwen", "orin", TRT, "0.12.0", new, fail="accuracy", metrics={"decode_tokens_per_s": 50.2})
    _row(rec, run, "phi", "orin", TRT, "0.12.0", new)
    _row(rec, run, HOSTILE, "orin", TRT, "0.12.0", new)
    _row(rec, run, "stories", "x86-cpu", ORT, ORT_V, metrics={"decode_tokens_per_s": 401.0})
    _quantized(rec, run, "0.11.0", old, 31.0)
    _quantized(rec, run, "0.12.0", new, 40.0)
    rec.finish_run(run, "failed")
    run = rec.start_run("nightly", "schedule", "ccc3333")
    _row(rec, run, "stories", "x86-cpu", ORT, ORT_V, fail="infer")
    rec.finish_run(run, "failed")
    run = rec.start_run("nightly", "schedule", "ddd4444")
    _row(rec, run, "stories", "x86-cpu", ORT, ORT_V)
    engine.dispose()


def _run(db: str, docs: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["compare", "--db", db, "--docs-dir", str(docs), *args])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.stdout, result.stderr


def _json(db: str, docs: Path, *args: str) -> dict[str, Any]:
    code, stdout, stderr = _run(db, docs, *args, "--format", "json")
    assert code == 0, stderr
    data = json.loads(stdout)
    assert isinstance(data, dict)
    return data


def _models(rows: Any) -> list[str]:
    assert isinstance(rows, list)
    return [r["row"]["model"] for r in rows]


# -- the toolchain versions -------------------------------------------------------------------------------------------
def test_toolchain_versions_report_gains_losses_changes_and_deltas(db: str, tmp_path: Path) -> None:
    data = _json(db, tmp_path, "--toolchain", f"{TRT}==0.11.0", "--against", "==0.12.0")
    assert data["slug"] == "tensorrt-edgellm-0.11.0-vs-0.12.0"
    assert sorted(_models(data["gained"])) == sorted([HOSTILE, "phi"])
    assert _models(data["lost"]) == ["gemma"]
    [change] = data["status_changes"]
    assert change["row"]["model"] == "qwen" and change["verdict"] == ["l0_covered", "failing"] and change["regression"]
    assert change["stages"] == {"accuracy": ["pass", "fail"]}
    assert change["b"]["reasons"] == {"accuracy": "broke: log …/accuracy.log from <host>"}  # scrubbed
    assert change["row"]["versions"] == ""  # the compared toolchain's own entry is not part of the row
    deltas = {(d["row"]["model"], d["metric"]): d for d in data["metric_deltas"]}
    llama = deltas[("llama", "decode_tokens_per_s")]
    assert llama["a"] == 100.5 and llama["b"] == 110.0 and llama["delta"] == pytest.approx(9.5)
    assert llama["relative"] == pytest.approx(9.5 / 100.5)
    assert llama["history"] == [99.0, 101.0, 100.0]  # runs 3, 2, 1 on 0.11.0's line, newest first
    assert llama["band"]["median"] == 100.0 and llama["band"]["half_width"] == pytest.approx(3 * 1.4826)
    assert llama["noise"] == "outside noise"
    qwen = deltas[("qwen", "decode_tokens_per_s")]
    assert qwen["delta"] == pytest.approx(0.2) and qwen["noise"] == "within noise"
    assert deltas[("llama", "prefill_tokens_per_s")]["noise"] == "no band (1 history points)"
    assert ("stories", "decode_tokens_per_s") not in deltas  # another toolchain's row: on neither side
    tinyq = deltas[("tinyq", "decode_tokens_per_s")]  # an edgellm-ort row quantized by tensorrt-edgellm
    assert tinyq["row"]["job_toolchain"] == ORT and tinyq["history"] == [32.0, 31.0, 30.0]
    assert tinyq["delta"] == 9.0 and tinyq["noise"] == "outside noise"
    assert data["regressions"] == 1


def test_table_output_is_escaped_and_fail_on_regression_exits_1(db: str, tmp_path: Path) -> None:
    args = ("--toolchain", f"{TRT}==0.11.0", "--against", f"{TRT}==0.12.0", "--no-publish")
    code, stdout, _ = _run(db, tmp_path, *args)
    assert code == 0
    assert "\x1b" not in stdout and "\\x1b[2J<script>" in stdout  # shown, never run by the terminal
    for word in ("REGRESSION", "gained", "lost", "outside noise", "within noise", "no band"):
        assert word in stdout, word
    assert not (tmp_path / "compare").exists()
    code, _, stderr = _run(db, tmp_path, *args, "--fail-on-regression")
    assert code == 1 and "1 row(s) went from supported" in stderr


def test_pages_are_written_escaped_and_indexed(db: str, tmp_path: Path) -> None:
    assert _json(db, tmp_path, "--runs", "1", "3")["pages"] == []  # printed only, unless --publish (issue 41)
    assert not (tmp_path / "compare").exists()
    _json(db, tmp_path, "--toolchain", f"{TRT}==0.11.0", "--against", "==0.12.0", "--publish")
    _json(db, tmp_path, "--runs", "1", "3", "--publish")
    folder = tmp_path / "compare"
    md = (folder / "tensorrt-edgellm-0.11.0-vs-0.12.0.md").read_text()
    page = (folder / "tensorrt-edgellm-0.11.0-vs-0.12.0.html").read_text()
    assert not re.search(r"(?<!\\)<", md) and "\\<script>alert(1)\\</script>" in md and "\\|\\[x\\]" in md
    assert "\x1b" not in md and "[x](http" not in md and "http://" not in md
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "\x1b" not in page
    assert "outside noise" in md and "(regression)" in md and "broke: log …/accuracy.log from \\<host>" in md
    assert "10.1.2.3" not in md + page and "/home/ci" not in md + page
    index = (folder / "index.md").read_text()
    assert "(tensorrt-edgellm-0.11.0-vs-0.12.0.md)" in index and "(runs-1-vs-3.md)" in index
    assert "href='runs-1-vs-3.html'" in (folder / "index.html").read_text()
    listed = published_comparisons(tmp_path)
    assert {p.slug for p in listed} == {"tensorrt-edgellm-0.11.0-vs-0.12.0", "runs-1-vs-3"}
    assert all((tmp_path / p.html).is_file() for p in listed)
    _json(db, tmp_path, "--runs", "1", "3", "--publish")  # published again: one entry still
    assert len(published_comparisons(tmp_path)) == 2


def test_both_backends(db_url: str, tmp_path: Path) -> None:
    """The same answers from PostgreSQL (its LIKE, DISTINCT and outer joins)."""
    _record(db_url)
    data = _json(db_url, tmp_path, "--toolchain", f"{TRT}==0.11.0", "--against", "==0.12.0")
    assert sorted(_models(data["gained"])) == sorted([HOSTILE, "phi"]) and _models(data["lost"]) == ["gemma"]
    noise = {(d["row"]["model"], d["metric"]): d["noise"] for d in data["metric_deltas"]}
    assert noise[("llama", "decode_tokens_per_s")] == noise[("tinyq", "decode_tokens_per_s")] == "outside noise"
    assert _json(db_url, tmp_path, "--commits", "aaa1", "ccc3")["regressions"] == 1
    code, _, stderr = _run(db_url, tmp_path, "--toolchain", f"{TRT}==0.1", "--against", "==0.12.0")
    assert code == 2 and "recorded versions: 0.11.0, 0.12.0" in stderr


# -- runs and commits -------------------------------------------------------------------------------------------------
def test_runs(db: str, tmp_path: Path) -> None:
    data = _json(db, tmp_path, "--runs", "1", "3")
    assert data["slug"] == "runs-1-vs-3" and not data["gained"] and not data["lost"] and not data["status_changes"]
    deltas = {d["row"]["model"]: d for d in data["metric_deltas"]}
    assert deltas["llama"]["delta"] == -1.0 and deltas["llama"]["noise"] == "no band (2 history points)"
    data = _json(db, tmp_path, "--runs", "3", "4")  # chosen versions tell rows apart: a pinned row is another
    assert "gemma" in _models(data["gained"]) and sorted(_models(data["lost"])) == ["llama", "qwen", "tinyq"]


def test_commits(db: str, tmp_path: Path) -> None:
    data = _json(db, tmp_path, "--commits", "aaa1", "ccc3333")
    assert data["slug"] == "commits-aaa1-vs-ccc3333"
    assert "run 3" in str(data["a"]) and "run 5" in str(data["b"])
    [change] = data["status_changes"]
    assert change["row"]["model"] == "stories" and change["verdict"] == ["l0_covered", "failing"]
    assert change["stages"]["infer"] == ["pass", "fail"] and change["stages"]["bench"] == ["pass", "skipped"]
    assert sorted(_models(data["lost"])) == ["llama", "qwen", "tinyq"]
    code, _, _ = _run(db, tmp_path, "--commits", "aaa1", "ccc3333", "--fail-on-regression", "--no-publish")
    assert code == 1


# -- bad input ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "needles"), [
    (("--toolchain", f"{TRT}==0.10.0", "--against", "==0.12.0"),
     ("no published results of tensorrt-edgellm at version '0.10.0'", "recorded versions: 0.11.0, 0.12.0")),
    (("--toolchain", "nosuch==1", "--against", "==2"), ("unknown toolchain 'nosuch'", TRT)),
    (("--toolchain", TRT, "--against", "==0.12.0"), ("bad --toolchain", "NAME==VERSION")),
    (("--toolchain", f"{TRT}==0.11.0", "--against", f"{ORT}==0.12.0"), ("bad --against", "==VERSION")),
    (("--toolchain", f"{TRT}==0.11.0", "--against", "==0.11.0"), ("the same version",)),
    (("--toolchain", f"{TRT}==0.11.0"), ("--against is missing",)),
    (("--runs", "1", "6"), ("bad run 6: run 6 is not published (status running)", "published runs: 1, 2, 3, 4, 5")),
    (("--runs", "1", "99"), ("bad run 99: no such run", "published runs: 1, 2, 3, 4, 5")),
    (("--runs", "3", "3"), ("valid: two different sides",)),
    (("--commits", "zzz", "aaa1111"), ("no published nightly run of commit 'zzz'", "aaa1111 (run 3)")),
    (("--commits", "a/b", "aaa1111"), ("bad commit 'a/b'",)),
    (("--commits", "aaa", "aaa1111"), ("one run (3)",)),
    (("--runs", "1", "3", "--commits", "a", "b"), ("give exactly one of", "--runs, --commits")),
    ((), ("give exactly one of", "none")),
    (("--runs", "1", "3", "--format", "xml"), ("unknown --format 'xml'; valid: table, json",)),
])
def test_bad_input_exits_2_naming_the_value(db: str, tmp_path: Path, args: tuple[str, ...],
                                            needles: tuple[str, ...]) -> None:
    code, stdout, stderr = _run(db, tmp_path, *args)
    assert code == 2, (stdout, stderr)
    for needle in needles:
        assert needle in stderr, (needle, stderr)
    assert not (tmp_path / "compare").exists()


# -- pure parts ------------------------------------------------------------------------------------------------------
def test_noise_band_rule() -> None:
    assert noise_band([1.0, 2.0]) == Band(2)
    assert noise_verdict(5.0, Band(2)) == "no band (2 history points)"
    band = noise_band([10.0, 10.0, 10.0, 12.0])
    assert band.median == 10.0 and band.half_width == 0.0  # identical values: any change is outside
    assert noise_verdict(0.0, band) == "within noise" and noise_verdict(0.1, band) == "outside noise"
    band = noise_band([9.0, 10.0, 11.0])
    assert noise_verdict(-4.4, band) == "within noise" and noise_verdict(4.5, band) == "outside noise"


def test_slugs_are_safe_file_names() -> None:
    assert comparison_slug(ToolchainVersionSide(TRT, "0.1.0+ort-1.22"), ToolchainVersionSide(TRT, "..")) == \
        "tensorrt-edgellm-0.1.0-ort-1.22-vs-x"
    assert comparison_slug(RunSide(3), RunSide(5)) == "runs-3-vs-5"
    assert comparison_slug(CommitSide("ABC1234"), CommitSide("def5678")) == "commits-abc1234-vs-def5678"


def test_compare_rows_without_a_database() -> None:
    def row(model: str) -> RowId:
        return RowId(RowKey(model, Precision.parse("fp16"), "orin", TRT))

    m = ("bench", "ttft_ms")
    unjudged = {("bench", "lease_wait_s"): (1.0, "s"), ("bench", "host_load1"): (0.5, ""),
                ("export", "cache_hit"): (1.0, "")}  # measured, never judged: no delta (issue 41)
    a = {row("x"): RowSide(1, "l0_covered", {"infer": "pass"}, metrics={m: (2.0, "ms"), **unjudged}),
         row("y"): RowSide(1, "failing", {"infer": "fail"})}
    b = {row("x"): RowSide(2, "l0_covered", {"infer": "pass"}, metrics={m: (3.0, "ms"), **unjudged}),
         row("z"): RowSide(2, "l0_covered", {"infer": "pass"})}
    c = compare_rows("A", "B", "s", a, b, {(row("x"), m): [2.0, 2.1, 1.9]})
    assert [r.key.model for r, _ in c.gained] == ["z"] and [r.key.model for r, _ in c.lost] == ["y"]
    assert c.same == 1 and not c.changed
    [d] = c.deltas
    assert d.delta == 1.0 and d.relative == 0.5 and d.noise == "outside noise"


# -- variants ----------------------------------------------------------------------------------------------------------
def test_a_variant_is_its_own_row(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'variants.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    for fail in (None, "infer"):
        run = rec.start_run("nightly", "schedule", "eee5555")
        for variant, status in (("", None), ("kv=fp8", fail)):
            for stage in PIPELINE:
                rec.record_result(run, model="llama", precision="fp16", platform="orin", stage=stage,
                                  test_id=f"llama-{variant or 'default'}", toolchain=TRT, toolchain_version="0.11.0",
                                  status="fail" if stage == status else "pass", variant=variant)
        rec.finish_run(run, "passed")
    engine.dispose()
    data = _json(url, tmp_path, "--runs", "1", "2")
    assert data["slug"] == "runs-1-vs-2" and not data["gained"] and not data["lost"] and data["unchanged"] == 1
    [change] = data["status_changes"]
    assert change["row"]["variant"] == "kv=fp8" and change["verdict"] == ["l0_covered", "failing"]


def test_metric_globs_narrow_what_is_printed_not_what_is_published(db: str, tmp_path: Path) -> None:
    sides = ("--toolchain", f"{TRT}==0.11.0", "--against", "==0.12.0")
    data = _json(db, tmp_path, *sides, "--metric", "*/prefill_*", "--publish")
    assert {d["metric"] for d in data["metric_deltas"]} == {"prefill_tokens_per_s"}
    page = next(Path(p) for p in data["pages"] if p.endswith(".md") and "index" not in p)
    assert "decode_tokens_per_s" in page.read_text()  # the published page keeps every delta
    code, _, stderr = _run(db, tmp_path, *sides, "--metric", "bench/nope*", "--no-publish")
    assert code == 2 and "--metric 'bench/nope*' matches no metric delta; there are: " in " ".join(stderr.split())
