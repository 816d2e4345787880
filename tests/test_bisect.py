"""``edgefarm bisect --checkpoint`` on a small synthetic repository: a fake ``edgellm`` package (export, build, eval
as tiny scripts) over eight commits, the fifth planting the regression (export raises IndexError, as 0f37df0 did
for MHA checkpoints at fp32). The probes run each revision's own fake package in a worktree, as Prefect task runs."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from edgefarm.cli import app

pytestmark = pytest.mark.usefixtures("prefect_harness")

MAIN = '''"""A fake edgellm: export, build and eval of a checkpoint, each writing one file."""
import sys
from pathlib import Path

from edgellm.behaviour import BROKEN

cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "export":
    if BROKEN:
        raise IndexError("Argument passed to at() was not in the map")
    Path(args[1]).mkdir(parents=True)
    (Path(args[1]) / "model.txt").write_text((Path(args[0]) / "config.json").read_text())
elif cmd == "build":
    Path(args[1]).mkdir(parents=True)
    (Path(args[1]) / "engine.txt").write_text((Path(args[0]) / "model.txt").read_text())
elif cmd == "eval":
    engine = Path(args[args.index("--engine-dir") + 1])
    out = Path(args[args.index("--output") + 1])
    out.write_text('{"passed": true}')
    sys.exit(0 if (engine / "engine.txt").is_file() else 1)
else:
    sys.exit(2)
'''
COMMITS = 8
PLANTED = 4  # 0-based: commits[4] sets BROKEN


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("bisect")
    repo = root / "repo"
    (repo / "edgellm").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "t")
    (repo / "edgellm" / "__init__.py").write_text("")
    (repo / "edgellm" / "__main__.py").write_text(MAIN)
    shas = []
    for i in range(COMMITS):
        (repo / "edgellm" / "behaviour.py").write_text(f"BROKEN = {i >= PLANTED}\n")
        (repo / "notes.txt").write_text(f"change {i}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"change {i}" + (" plants the regression" if i == PLANTED else ""))
        shas.append(_git(repo, "rev-parse", "HEAD"))
    ckpt = root / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "llama"}')
    return {"repo": repo, "shas": shas, "ckpt": ckpt, "root": root}


def _bisect(s: dict[str, Any], tmp_path: Path, *extra: str, good: str | None = None, bad: str | None = None,
            cache: bool = False) -> tuple[int, str, dict[str, Any] | None]:
    out = tmp_path / "bisect.json"
    args = ["bisect", "--checkpoint", str(s["ckpt"]), "--precision", "fp32", "--platform", "x86-cpu",
            "--good", good or s["shas"][0][:7], "--bad", bad or s["shas"][-1][:7], "--output", str(out),
            "--repo", str(s["repo"]), "--data-dir", str(tmp_path / "data"), *([] if cache else ["--no-cache"]),
            *extra]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output, json.loads(out.read_text()) if out.is_file() else None


def _task_runs(names: list[str]) -> dict[str, str]:
    """task run name -> state name, as the Prefect server recorded them."""
    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=names)))
    return {r.name: r.state.name for r in runs if r.state is not None}


def test_names_the_planted_commit(synthetic: dict[str, Any], tmp_path: Path) -> None:
    code, output, answer = _bisect(synthetic, tmp_path)
    shas = synthetic["shas"]
    assert code == 0, output
    assert answer is not None and answer["found"]
    assert answer["first_bad"] == shas[PLANTED] and answer["last_good"] == shas[PLANTED - 1]
    assert f"first bad: {shas[PLANTED][:7]} change {PLANTED} plants the regression" in output
    probes = answer["probes"]
    assert [p["revision"] for p in probes[:2]] == [shas[0], shas[-1]]  # the ends first
    assert len(probes) <= 2 + 3  # 7 commits between: at most 3 halvings
    for p in probes:
        bad = shas.index(p["revision"]) >= PLANTED
        assert p["status"] == ("bad" if bad else "good") and p["seconds"] > 0 and not p["cached"]
        assert p["task_run"] == f"probe {p['revision'][:7]} {p['subject']}"
        if bad:
            assert p["step"] == "export" and "IndexError" in p["detail"]
    states = _task_runs([p["task_run"] for p in probes])
    assert states == {p["task_run"]: ("Bad" if p["status"] == "bad" else "Good") for p in probes}
    assert _git(synthetic["repo"], "worktree", "list").count("\n") == 0  # every probe's worktree removed


def test_a_second_run_reuses_the_probes_by_content(synthetic: dict[str, Any], tmp_path: Path) -> None:
    first = _bisect(synthetic, tmp_path, cache=True)
    second = _bisect(synthetic, tmp_path, cache=True)
    assert first[0] == second[0] == 0
    assert first[2] is not None and second[2] is not None
    assert not any(p["cached"] for p in first[2]["probes"]) and all(p["cached"] for p in second[2]["probes"])
    assert second[2]["first_bad"] == synthetic["shas"][PLANTED]


def test_no_probe_changes_the_outcome_is_exit_1(synthetic: dict[str, Any], tmp_path: Path) -> None:
    shas = synthetic["shas"]
    code, output, answer = _bisect(synthetic, tmp_path, good=shas[PLANTED + 1], bad=shas[-1])
    assert code == 1
    assert answer is not None and not answer["found"] and answer["first_bad"] is None
    assert "no probe changes the outcome" in output and f"--good {shas[PLANTED + 1][:7]} is bad" in output


def test_a_checkpoint_bisection_with_db_records_its_digest_and_no_answer(synthetic: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    """--checkpoint with --db: the answer (here none) is recorded by the checkpoint's digest, with no row."""
    from edgefarm.results.bisections import bisections_of_checkpoint
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgellm.reference import checkpoint_digest

    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = make_engine(url)
    upgrade(engine)
    shas = synthetic["shas"]
    code, _, answer = _bisect(synthetic, tmp_path, "--db", url, good=shas[PLANTED + 1], bad=shas[-1])
    assert code == 1 and answer is not None
    [rec] = bisections_of_checkpoint(engine, checkpoint_digest(synthetic["ckpt"]))
    engine.dispose()
    assert (rec.id, rec.row, rec.found, rec.first_bad, rec.good_sha, len(rec.probes)) == (
        answer["bisection_id"], None, False, None, shas[PLANTED + 1], 2)
    assert rec.line() == f"bisected: no answer ({answer['reason']})"
    assert answer["reason"].startswith("no probe changes the outcome")


def test_max_probes_leaves_a_range_and_exit_1(synthetic: dict[str, Any], tmp_path: Path) -> None:
    code, output, answer = _bisect(synthetic, tmp_path, "--max-probes", "3")
    assert code == 1, output
    assert answer is not None and len(answer["probes"]) == 3 and not answer["found"]
    assert synthetic["shas"][PLANTED] in answer["candidates"] and "--max-probes reached" in answer["reason"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--good", "nosuchrev"], "--good 'nosuchrev': unknown revision"),
    (["--precision", "fp33"], "fp33"),
    (["--platform", "thor"], "--platform 'thor'"),
    (["--max-probes", "1"], "--max-probes 1"),
])
def test_bad_input_is_exit_2_naming_it(synthetic: dict[str, Any], tmp_path: Path, args: list[str],
                                       needle: str) -> None:
    shas = synthetic["shas"]
    options = {"--good": shas[0], "--bad": shas[-1], "--precision": "fp32", "--platform": "x86-cpu",
               **dict(zip(args[::2], args[1::2], strict=True))}
    argv = ["bisect", "--checkpoint", str(synthetic["ckpt"]), "--output", str(tmp_path / "o.json"),
            "--repo", str(synthetic["repo"]), "--data-dir", str(tmp_path / "data"),
            *[x for kv in options.items() for x in kv]]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not (tmp_path / "o.json").exists()


def test_a_checkpoint_dir_without_config_and_reversed_ends_are_exit_2(synthetic: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    shas = synthetic["shas"]
    code, output, _ = _bisect({**synthetic, "ckpt": tmp_path}, tmp_path)
    assert code == 2 and f"--checkpoint {tmp_path}: not a checkpoint directory" in output
    code, output, _ = _bisect(synthetic, tmp_path, good=shas[-1], bad=shas[0])
    assert code == 2 and "is not an ancestor of --bad" in output


def test_a_regression_from_a_merged_branch_names_the_branch_commit(synthetic: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    """main: g - a - M(merge of side) - b; side (from g): s1 - s2 (plants) - s3. The first bad is s2, not M."""
    repo = tmp_path / "merged"
    subprocess.run(["git", "clone", "-q", str(synthetic["repo"]), str(repo)], check=True)
    for key in ("user.email", "user.name"):
        _git(repo, "config", key, "t")
    g = synthetic["shas"][0]
    _git(repo, "checkout", "-q", "-b", "trunk", g)

    def commit(msg: str, broken: bool, name: str = "notes.txt") -> str:
        (repo / "edgellm" / "behaviour.py").write_text(f"BROKEN = {broken}\n")
        (repo / name).write_text(msg + "\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", msg)
        return _git(repo, "rev-parse", "HEAD")

    commit("trunk a", False)
    _git(repo, "checkout", "-q", "-b", "side", g)
    commit("side s1", False, "side.txt")
    s2 = commit("side s2 plants the regression", True, "side.txt")
    commit("side s3", True, "side.txt")
    _git(repo, "checkout", "-q", "trunk")
    subprocess.run(["git", "-C", str(repo), "merge", "-q", "--no-edit", "-X", "theirs", "side"],
                   capture_output=True, check=True)
    bad = commit("trunk b", True)
    code, output, answer = _bisect({**synthetic, "repo": repo}, tmp_path, good=g, bad=bad)
    assert code == 0, output
    assert answer is not None and answer["first_bad"] == s2
    assert answer["last_good"] == _git(repo, "rev-parse", f"{s2}^")


def _runs_db(tmp_path: Path, revisions: list[str], statuses: list[str], digest: str, model: str = "tiny") -> str:
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgefarm.results.recorder import Recorder

    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    for revision, status in zip(revisions, statuses, strict=True):
        run = rec.start_run("nightly", "schedule", revision[:12])
        rec.record_worker(run, role="orchestrator", pool=None, host="h", data_dir="/d", revision=revision,
                          source_digest=hashlib.sha256(revision.encode()).hexdigest(),
                          toolchains={"edgellm-ort": "0.1.0"})
        for stage in ("export", "build", "infer", "accuracy"):
            rec.record_result(run, model=model, precision="fp32", platform="x86-cpu", stage=stage,
                              test_id="tiny-fp32", status=status if stage == "export" else "pass",
                              toolchain="edgellm-ort", toolchain_version="0.1.0", model_revision=digest)
        rec.finish_run(run, "passed" if status == "pass" else "failed")
    engine.dispose()
    return url


def test_row_form_bisects_the_farm_revisions_of_two_runs(synthetic: dict[str, Any], tmp_path: Path) -> None:
    from edgellm.reference import checkpoint_digest

    shas = synthetic["shas"]
    url = _runs_db(tmp_path, [shas[1], shas[-1]], ["pass", "fail"], checkpoint_digest(synthetic["ckpt"]))
    out = tmp_path / "row.json"
    result = CliRunner().invoke(app, [
        "bisect", "--row", "tiny", "fp32", "x86-cpu", "--good", "1", "--bad", "2", "--checkpoint",
        str(synthetic["ckpt"]), "--db", url, "--repo", str(synthetic["repo"]), "--data-dir", str(tmp_path / "d"),
        "--output", str(out), "--no-cache"])
    assert result.exit_code == 0, result.output
    answer = json.loads(out.read_text())
    assert answer["first_bad"] == shas[PLANTED] and answer["changed"] == {"revision": [shas[1], shas[-1]]}
    assert [r["status"] for r in answer["runs"]] == ["pass", "fail"]
    _check_recorded_and_shown(url, tmp_path, shas, answer)


def _check_recorded_and_shown(url: str, tmp_path: Path, shas: list[str], answer: dict[str, Any]) -> None:
    """The answer is a typed row of ``bisections`` (bad run 2), and run 2's pages and a compare page of runs 1 and
    2 say ``first bad: <sha12> <subject>`` for the row."""
    from edgefarm.pages.compare import RunSide, build_comparison, render_html, render_markdown
    from edgefarm.pages.docs import write_run_pages
    from edgefarm.results.bisections import bisections_of_run, latest_bisections
    from edgefarm.results.db import make_engine

    engine = make_engine(url)
    try:
        rec = bisections_of_run(engine, 2)[("tiny", "fp32", "x86-cpu")]
        assert rec.id == answer["bisection_id"] and rec.found and rec.reason is None
        assert (rec.first_bad, rec.last_good) == (shas[PLANTED], shas[PLANTED - 1])
        assert rec.first_bad_subject == f"change {PLANTED} plants the regression"
        assert (rec.good_run_id, rec.bad_run_id, rec.good_ref, rec.bad_ref) == (1, 2, "1", "2")
        assert (rec.good_sha, rec.bad_sha) == (shas[1], shas[-1])
        assert rec.toolchain == "edgellm-ort" and rec.checkpoint_sha256 == answer["checkpoint_sha256"]
        assert [p["revision"] for p in rec.probes] == [p["revision"] for p in answer["probes"]]
        assert bisections_of_run(engine, 1) == {}
        line = f"first bad: {shas[PLANTED][:12]} change {PLANTED} plants the regression"
        assert rec.line() == line
        assert latest_bisections(engine, [("tiny", "fp32", "x86-cpu")])[("tiny", "fp32", "x86-cpu")].id == rec.id
        assert write_run_pages(engine, tmp_path / "docs", [1, 2], None) == [1, 2]
        runs = tmp_path / "docs" / "runs"
        assert f"Bisected: {line}." in (runs / "run-2.md").read_text()
        assert f"<p class='bisected'>Bisected: {line}.</p>" in (runs / "run-2.html").read_text()
        assert "first bad" not in (runs / "run-1.md").read_text()
        c = build_comparison(engine, RunSide(1), RunSide(2))
        assert [ch.bisected for ch in c.regressions] == [line]
        assert line in render_markdown(c, generated_at="now", db_label="test")
        assert line in render_html(c, generated_at="now", db_label="test")
    finally:
        engine.dispose()


def test_a_subject_is_escaped_on_the_pages() -> None:
    from edgefarm.pages.docs_runs import render_html, render_markdown

    run = {"id": 2, "kind": "nightly", "status": "failed", "trigger": "t", "code_version": "v", "started_at": "s",
           "bisections": {("tiny", "fp32", "x86-cpu"): "first bad: 0123456789ab <script>x</script> *bold*"}}
    results = [{"model": "tiny", "precision": "fp32", "platform": "x86-cpu", "stage": "export", "status": "fail",
                "toolchain": "edgellm-ort", "job_toolchain": "edgellm-ort", "reason": "r", "metrics": [],
                "artifacts": []}]
    page = render_html(run, results)
    assert "<script>x" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    md = render_markdown(run, results)
    assert "Bisected: first bad: 0123456789ab" in md and "\\<script>x\\</script> \\*bold\\*." in md


def test_row_form_refuses_runs_of_one_revision(synthetic: dict[str, Any], tmp_path: Path) -> None:
    from edgellm.reference import checkpoint_digest

    shas = synthetic["shas"]
    url = _runs_db(tmp_path, [shas[1], shas[1]], ["pass", "fail"], checkpoint_digest(synthetic["ckpt"]))
    result = CliRunner().invoke(app, [
        "bisect", "--row", "tiny", "fp32", "x86-cpu", "--good", "1", "--bad", "2", "--checkpoint",
        str(synthetic["ckpt"]), "--db", url, "--repo", str(synthetic["repo"]), "--output", str(tmp_path / "o.json")])
    assert result.exit_code == 2
    assert "the farm's revision is the same in runs 1 and 2" in result.output


def test_row_form_of_an_unknown_model_without_checkpoint_is_exit_2(synthetic: dict[str, Any], tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "bisect", "--row", "no-such-model", "fp32", "x86-cpu", "--good", "1", "--bad", "2", "--repo",
        str(synthetic["repo"]), "--data-dir", str(tmp_path / "d"), "--output", str(tmp_path / "o.json")])
    assert result.exit_code == 2
    assert "unknown model 'no-such-model'" in result.output


def test_bisect_regressions_after_a_nightly_bisects_each_newly_failing_row(synthetic: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    from edgellm import BUNDLED_MODEL_DIR
    from edgellm.reference import checkpoint_digest

    shas = synthetic["shas"]
    url = _runs_db(tmp_path, [shas[1], shas[-1]], ["pass", "fail"], checkpoint_digest(BUNDLED_MODEL_DIR),
                   model="stories260K")
    out = tmp_path / "regressions.json"
    result = CliRunner().invoke(app, [
        "bisect", "--bisect-regressions", "--db", url, "--repo", str(synthetic["repo"]), "--data-dir",
        str(tmp_path / "d"), "--output", str(out), "--no-cache"])
    assert result.exit_code == 0, result.output
    answer = json.loads(out.read_text())
    assert (answer["previous_run"], answer["run"]) == (1, 2)
    assert [r["row"] for r in answer["rows"]] == [["stories260K", "fp32", "x86-cpu"]]
    assert answer["rows"][0]["first_bad"] == shas[PLANTED]
    assert f"stories260K fp32 x86-cpu: first bad {shas[PLANTED][:7]}" in result.output
    from edgefarm.results.bisections import bisections_of_run
    from edgefarm.results.db import make_engine

    engine = make_engine(url)
    rec = bisections_of_run(engine, 2)[("stories260K", "fp32", "x86-cpu")]
    engine.dispose()
    assert (rec.first_bad, rec.good_run_id, rec.bad_run_id) == (shas[PLANTED], 1, 2)
    assert rec.id == answer["rows"][0]["bisection_id"]
