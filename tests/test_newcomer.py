"""Issue 41: what a newcomer hit in the first hour, walked again (fresh data dir: a nightly on a small matrix, a
bring-up of a scratch checkpoint, query, compare, runs, show), each item checked where it shows."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from edgefarm.pages.docs import publish_bringup, write_docs
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.recorder import Recorder
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
    edge = next(out.glob("*/support-matrix.md")).read_text()  # item 5: the layout page says whose rows it counts
    assert "counting only the rows TensorRT Edge-LLM ran (`tensorrt-edgellm`)" in edge
    assert result["rows"] == 1 and result["supported"] == 1
    assert not (out / "runs" / f"run-{bringup}.md").exists()  # write_docs does not write it...
    page = publish_bringup(url, out, bringup, tmp_path / "data")  # ...the bring-up writes its own, and only that
    assert page == out / "runs" / f"run-{bringup}.md" and "bringup-my-qwen3" in page.read_text()
    assert "bringup-my-qwen3" not in (out / "supported-models.md").read_text()


def test_item3_runs_lists_the_runs_newest_first_in_every_format(tmp_path: Path) -> None:
    import csv
    import io
    import json

    from typer.testing import CliRunner

    from edgefarm.cli import app

    url, nightly, bringup = _nightly_and_bringup(tmp_path)
    args = ["runs", "--db", url, "--data-dir", str(tmp_path / "data")]
    listed = CliRunner().invoke(app, [*args, "--format", "json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [(r["id"], r["kind"], r["status"]) for r in rows] == [(bringup, "bringup", "failed"),
                                                                 (nightly, "nightly", "passed")]
    assert rows[0]["rows"] == {"fail": 1, "pass": 2} and rows[1]["rows"] == {"pass": 1}
    assert isinstance(rows[1]["duration_s"], float) and rows[1]["started_at"]
    last = CliRunner().invoke(app, [*args, "--last", "1", "--format", "csv", "--output", str(tmp_path / "r.csv")])
    assert last.exit_code == 0 and last.stdout == "", last.output
    got = list(csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert [(r["id"], r["rows"]) for r in got] == [(str(bringup), "fail=1;pass=2")]
    table = CliRunner().invoke(app, [*args, "--format", "table"])
    assert table.exit_code == 0 and "2 run(s), newest first" in table.stdout, table.stdout
    assert f"{nightly}" in table.stdout and "1 pass" in table.stdout and "1 fail, 2 pass" in table.stdout
    for bad, named in ((["--last", "0"], "--last 0"), (["--format", "yaml"], "'yaml'")):
        refused = CliRunner().invoke(app, [*args, *bad])
        assert refused.exit_code == 2 and named in refused.output, refused.output


def test_item3_flow_runs_are_named_and_tagged_after_the_farm_run() -> None:
    from edgefarm.flows.flow_run_names import flow_run_name, flow_run_tags
    from edgefarm.flows.run_state import flow_state

    assert flow_run_name("nightly", "small", 7) == "nightly-7"
    assert flow_run_name("l0", "l0_pipeline_x86cpu", 8) == "l0_pipeline_x86cpu-8"
    assert flow_run_name("bringup", "bringup-my-qwen3", 9) == "bring-up-bringup-my-qwen3-9"
    assert flow_run_tags("nightly", ["x86-cpu", "thor"], {"onnxruntime": "1.22.0"}) == [
        "kind:nightly", "onnxruntime:1.22.0", "platform:thor", "platform:x86-cpu"]
    done = flow_state({"run_id": 7, "stages": {"pass": 4}, "failures": []})
    assert done.message == "run 7: 4 pass"
    failed = flow_state({"run_id": 7, "failures": [{"row": "m fp32 @x86-cpu", "stage": "infer", "status": "fail",
                                                   "reason": "boom"}]})
    assert failed.message == "run 7: 1 row(s) failed: m fp32 @x86-cpu: infer fail: boom"


def test_item3_a_run_page_links_its_prefect_flow_run_when_a_server_is_known(tmp_path: Path,
                                                                          monkeypatch) -> None:
    from edgefarm.pages.docs import write_run_pages
    from edgefarm.results.db import make_engine as engine_of

    url, nightly, _ = _nightly_and_bringup(tmp_path)
    engine = engine_of(url)
    Recorder(engine).record_worker(nightly, role="orchestrator", pool=None, host="h", data_dir="d", revision="r",
                                   source_digest="0" * 64, toolchains={}, flow_run_id="1234-abcd")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    write_run_pages(engine, tmp_path / "a", [nightly], None)
    assert "Prefect flow run" not in (tmp_path / "a" / "runs" / f"run-{nightly}.md").read_text()  # no server kept
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    monkeypatch.delenv("PREFECT_UI_URL", raising=False)
    write_run_pages(engine, tmp_path / "b", [nightly], None)
    engine.dispose()
    md = (tmp_path / "b" / "runs" / f"run-{nightly}.md").read_text()
    assert "- Prefect flow run: [1234-abcd](http://127.0.0.1:4200/runs/flow-run/1234-abcd)" in md
    assert "href='http://127.0.0.1:4200/runs/flow-run/1234-abcd'" in \
        (tmp_path / "b" / "runs" / f"run-{nightly}.html").read_text()


def test_item6_names_version_completion_aliases_and_bad_input(tmp_path: Path, farm_dirs: dict[str, Path]) -> None:
    from typer.testing import CliRunner

    from edgefarm.cli import app
    from edgefarm.cli.query import parse_status
    from edgefarm.results.support import SupportStatus

    version = CliRunner().invoke(app, ["--version"])
    assert version.exit_code == 0 and version.stdout.startswith("edgefarm 0."), version.output
    shown = CliRunner().invoke(app, ["--help"])
    assert "--install-completion" in shown.stdout and "--show-completion" in shown.stdout
    assert "runs " in shown.stdout  # the runs listing is a command of its own
    assert parse_status("pass") is SupportStatus.L0_COVERED and parse_status("untested") is SupportStatus.NEVER_TESTED
    assert parse_status("fail") is SupportStatus.FAILING and parse_status("l0-covered") is SupportStatus.L0_COVERED
    url, _, _ = _nightly_and_bringup(tmp_path)
    alias = CliRunner().invoke(app, ["query", "--db", url, "--status", "pass", "--format", "json"])
    canonical = CliRunner().invoke(app, ["query", "--db", url, "--status", "l0_covered", "--format", "json"])
    assert alias.exit_code == 0 and alias.stdout == canonical.stdout and '"status": "l0_covered"' in alias.stdout
    typo = CliRunner().invoke(app, ["query", "--db", url, "--status", "l0_coverd"])
    assert typo.exit_code == 2 and "error (bad input)" in typo.output and "'l0_covered'" in typo.output, typo.output
    assert "error (configuration)" not in typo.output
    args = ["--data-dir", str(farm_dirs["data"]), "--inventory", str(farm_dirs["inventory"]), "--db", url]
    bad = CliRunner().invoke(app, ["bring-up", "stories260k", *args])
    assert bad.exit_code == 2 and "(did you mean 'stories260K'?)" in bad.output, bad.output
    platform = CliRunner().invoke(app, ["bring-up", "stories260K", "--platforms", "x86cpu", *args])
    assert platform.exit_code == 2 and "(did you mean 'x86-cpu'?)" in platform.output, platform.output
    assert "error (bad input)" in platform.output
    junit_dir = CliRunner().invoke(app, ["run", "--priority", "l0_pipeline_x86cpu", "--junit",
                                         str(tmp_path / "absent" / "j.xml"), *args])
    assert junit_dir.exit_code == 2 and "--junit" in junit_dir.output and "does not exist" in junit_dir.output


def test_item9_junit_xml_has_a_case_per_row_and_stage_with_the_root_cause() -> None:
    from xml.etree import ElementTree as ET

    from edgefarm.cli.junit import junit_xml

    row = "stories260K fp32 @x86-cpu"
    result = {"run_id": 3, "results": [
        {"row": row, "stage": "export", "status": "pass", "duration_s": 1.5, "reason": "", "device": None},
        {"row": row, "stage": "accuracy", "status": "fail", "duration_s": 2.0, "reason": "ppl 9 > 1.2\x1b[2J",
         "device": "local-cpu"},
        {"row": "tiny fp16 @orin", "stage": "build", "status": "skipped", "duration_s": 0.0,
         "reason": "no orin device", "device": None}],
        "failures": [{"row": row, "stage": "accuracy", "status": "fail", "error_kind": "test_failure",
                      "reason": "ppl 9 > 1.2\x1b[2J", "logs": ["log:0123456789ab"]}]}
    root = ET.fromstring(junit_xml(result, "nightly"))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("name") == "nightly run 3"
    assert [suite.get(k) for k in ("tests", "failures", "skipped", "errors")] == ["3", "1", "1", "0"]
    cases = {(c.get("classname"), c.get("name")): c for c in suite.iter("testcase")}
    failure = cases[(row, "accuracy")].find("failure")
    assert failure is not None and failure.get("message", "").startswith(
        "root cause: accuracy fail (test_failure) on local-cpu: ppl 9 > 1.2\\x1b[2J")
    assert "log: edgefarm show log:0123456789ab" in (failure.text or "")
    skipped = cases[("tiny fp16 @orin", "build")].find("skipped")
    assert skipped is not None and skipped.get("message") == "skipped: no orin device"
    assert list(cases[(row, "export")]) == []


def test_item9_k_selects_a_subset_of_the_plan_like_pytest() -> None:
    from types import SimpleNamespace

    import pytest

    from edgefarm.flows.select import matches
    from edgellm.errors import ConfigurationError

    def job(model: str, precision: str, platform: str) -> object:
        return SimpleNamespace(model=model, precision=SimpleNamespace(value=precision), platform=platform,
                               key=f"{model}-{precision}@{platform}", toolchain="edgellm-ort",
                               entry=SimpleNamespace(variant=""))

    a, b = job("stories260K", "fp32", "x86-cpu"), job("tiny-qwen3", "fp16", "thor")
    assert [matches("stories", j) for j in (a, b)] == [True, False]  # type: ignore[arg-type]
    assert [matches("not fp32 and (thor or orin)", j) for j in (a, b)] == [False, True]  # type: ignore[arg-type]
    assert [matches("QWEN or @x86-cpu", j) for j in (a, b)] == [True, True]  # type: ignore[arg-type]
    for bad in ("stories and", "(fp32", "or", ""):
        with pytest.raises(ConfigurationError, match="-k"):
            matches(bad, a)  # type: ignore[arg-type]


_LINK = re.compile(r"\]\(([^)\s]+)\)|href='([^']+)'|href=\"([^\"]+)\"|src='([^']+)'")


def broken_links(out: Path) -> list[str]:
    """Every relative link of every page under ``out`` whose file does not exist (anchors and URLs aside)."""
    bad = []
    for page in sorted(out.rglob("*")):
        if not (page.is_file() and page.suffix in (".md", ".html")):
            continue
        for m in _LINK.finditer(page.read_text(errors="replace")):
            target = next(g for g in m.groups() if g)
            if target.startswith(("#", "http://", "https://", "data:", "mailto:")):
                continue
            path = unquote(target.split("#", 1)[0])
            if path and not (page.parent / path).exists():
                bad.append(f"{page.relative_to(out)} -> {target}")
    return bad


def test_item4_compare_answers_first_prints_only_and_the_pages_links_resolve(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from edgefarm.cli import app

    url, nightly, _ = _nightly_and_bringup(tmp_path)
    engine = make_engine(url)
    rec = Recorder(engine)
    again = rec.start_run("nightly", "schedule", "abd")
    _row(rec, again, "stories260K", "fp32", "x86-cpu", dict.fromkeys(PIPELINE, "pass"), device="local-cpu",
         metrics={"perplexity_ratio": (1.0001, ""), "lease_wait_s": (3.0, "s"), "host_load1": (1.5, "")})
    rec.finish_run(again, "passed")
    engine.dispose()
    out = tmp_path / "docs"
    write_docs(url, out, tmp_path / "data")
    assert broken_links(out) == []  # before any compare: the matrix's and supported-models' compare links resolve
    same = CliRunner().invoke(app, ["compare", "--runs", str(nightly), str(again), "--db", url, "--docs-dir",
                                    str(out)])
    assert same.exit_code == 0, same.output
    lines = same.stdout.splitlines()
    assert lines[0].startswith("0 gained, 0 lost, 0 changed (0 regressions), 1 unchanged; 2 metric deltas"), lines
    assert "lease_wait_s" not in same.stdout and "host_load1" not in same.stdout  # only judged metrics
    assert "perplexity_ratio" in same.stdout and "rows (" not in same.stdout  # no empty bordered rows table
    assert len(lines) < 15, same.stdout
    assert not list((out / "compare").glob("runs-*"))  # printed only: pages are opt-in
    published = CliRunner().invoke(app, ["compare", "--runs", str(nightly), str(again), "--db", url,
                                         "--docs-dir", str(out), "--publish"])
    assert published.exit_code == 0 and (out / "compare" / f"runs-{nightly}-vs-{again}.md").is_file()
    write_docs(url, out, tmp_path / "data")
    assert broken_links(out) == []


# -- the hour itself, on the real local device ----------------------------------------------------------------
SMALL = {"name": "small", "models": ["stories260K"], "precisions": ["fp32"], "platforms": ["x86-cpu"],
         "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                      "stages": ["export", "build", "infer", "accuracy"],
                      "timeout": {"export": 600, "build": 600, "infer": 600, "accuracy": 900}}}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[=>78]")


def run_in_pty(argv: list[str], env: dict[str, str], cols: int = 80, rows: int = 40,
               timeout: float = 600) -> tuple[int, str]:
    """``argv`` on a real pseudo-terminal of ``cols`` x ``rows`` (what a person's terminal is); its exit code and
    everything it wrote there."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import subprocess
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the other end closed: the command ended
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
    finally:
        code = proc.wait(timeout=30)
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


def last_frame(screen: str, title: str, end: str) -> list[str]:
    """The lines of the live table's last drawing: from its last title to the line holding ``end``."""
    # a redraw moves the cursor up and starts over after a carriage return: every line starts after a \r or \n
    lines = [line for line in re.split(r"[\r\n]+", _ANSI.sub("", screen)) if line.strip()]
    start = max(i for i, line in enumerate(lines) if title in line)
    stop = next(i for i in range(start, len(lines)) if end in lines[i])
    return lines[start:stop + 1]


def test_a_newcomers_hour(farm_dirs: dict[str, Path], tmp_path: Path, prefect_harness: Path) -> None:
    """A nightly on a small matrix at 80 columns, the same subset again with -k and --junit, a bring-up of a scratch
    copy of a checkpoint, then runs, query, compare and show: what issue 41 found, checked where a newcomer met it.
    The data dir is the session's (its toolchain installs take minutes); the database and the pages are new."""
    import json
    import os
    import shutil
    import sys
    from xml.etree import ElementTree as ET

    import yaml
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL
    from rich.cells import cell_len
    from typer.testing import CliRunner

    from edgefarm.cli import app
    from edgefarm.test_lists.catalog import Catalog

    db, docs = f"sqlite:///{tmp_path / 'edgefarm.db'}", tmp_path / "docs"
    matrix = tmp_path / "small.yml"
    matrix.write_text(yaml.safe_dump(SMALL))
    common = ["--db", db, "--data-dir", str(farm_dirs["data"]), "--inventory", str(farm_dirs["inventory"])]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "EDGEFARM_DB_URL")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parent.parent), TERM="xterm-256color",
               PREFECT_API_URL=str(PREFECT_API_URL.value()))  # the session's Prefect server: runs are kept there

    # 1. the nightly, on an 80-column terminal: the live table fits, names rows whole, says elapsed time and counts
    code, screen = run_in_pty([sys.executable, "-m", "edgefarm.cli", "nightly", "--matrix", str(matrix), *common,
                               "--docs-dir", str(docs)], env)
    assert code == 0, screen[-4000:]
    frame = last_frame(screen, "small progress", "pending")
    assert all(cell_len(line) <= 80 for line in frame), frame
    assert any("stories260K fp32 @x86-cpu" in line for line in frame), frame  # a row named whole, never cut
    assert not any("…" in line for line in frame), frame
    assert any(re.search(r"\d+:\d\d elapsed, 4/4 stages ended \(4 pass\), 0 running", line) for line in frame), frame
    assert any("· pending" in line and "▶ running" in line for line in frame), frame  # distinct markers
    row = next(line for line in frame if "stories260K fp32 @x86-cpu" in line)
    assert row.count("✓") + row.count("↺") == 4, row
    matrix_page = (docs / "support-matrix.html").read_text()  # the perplexity with the limit it was judged by
    assert re.search(r"ppl ratio \d\.\d{4} \(limit 1±0\.001\)", matrix_page), matrix_page[-3000:]

    # 2. the same subset again, piped (plain lines), with -k and a JUnit XML report
    junit = tmp_path / "nightly.xml"
    again = CliRunner().invoke(app, ["nightly", "--matrix", str(matrix), *common, "--docs-dir", str(docs), "-k",
                                     "stories260K and x86-cpu and not fp16", "--junit", str(junit)])
    assert again.exit_code == 0, again.output
    starts = re.findall(r"^\S+ \+\d+:\d\d \[\d+/4\] start +(.+)$", again.stdout, re.M)
    ends = re.findall(r"^\S+ \+\d+:\d\d \[\d+/4\] (?:pass|FAIL|ERROR|skip) +(.+?) \d+\.\d s", again.stdout, re.M)
    assert starts and sorted(starts) == sorted(ends), again.stdout  # every stage that starts says its end
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "4" and suite.get("failures") == "0"
    assert {c.get("name") for c in suite.iter("testcase")} == {"export", "build", "infer", "accuracy"}
    nothing = CliRunner().invoke(app, ["nightly", "--matrix", str(matrix), *common, "-k", "qwen"])
    assert nothing.exit_code == 2 and "-k 'qwen' selects no job" in nothing.output, nothing.output

    # 3. a bring-up of a scratch copy: its report and run page, never the nightly's pages
    scratch = shutil.copytree(Catalog.load().get("stories260K").locate(farm_dirs["data"]), tmp_path / "my-qwen3")
    brought = CliRunner().invoke(app, ["bring-up", str(scratch), "--platforms", "x86-cpu", "--json", *common],
                                 env={"EDGEFARM_DOCS_DIR": str(docs)})
    assert brought.exit_code == 0, brought.output
    report = json.loads(brought.stdout[brought.stdout.find("{\n"):])
    assert Path(report["run_page"]).is_file() and "bringup-my-qwen3" in Path(report["run_page"]).read_text()
    pages = [p for p in docs.rglob("*") if p.is_file() and "runs" not in p.parts]
    assert pages and not any("bringup-my-qwen3" in p.read_text(errors="replace") for p in pages)

    # 4. runs: the three, newest first, matched to their Prefect flow runs by name, tags and state message
    listed = CliRunner().invoke(app, ["runs", "--format", "json", "--db", db])
    runs = json.loads(listed.stdout)
    assert [(r["kind"], r["status"]) for r in runs] == [("bringup", "passed"), ("nightly", "passed"),
                                                         ("nightly", "passed")], runs
    first = runs[2]["id"]
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(runs[2]["flow_run_id"])
    assert flow_run.name == f"nightly-{first}" and {"kind:nightly", "platform:x86-cpu"} <= set(flow_run.tags)
    assert flow_run.state is not None and flow_run.state.message == f"run {first}: 4 pass"
    run_page = (docs / "runs" / f"run-{first}.md").read_text()  # written by the nightly that reported to Prefect
    assert f"/runs/flow-run/{runs[2]['flow_run_id']})" in run_page  # the run page links its flow run

    # 5. query, compare, show
    rows = json.loads(CliRunner().invoke(app, ["query", "--format", "json", "--status", "pass", "--db", db]).stdout)
    assert {r["model"] for r in rows} >= {"stories260K"}
    compared = CliRunner().invoke(app, ["compare", "--runs", str(first), str(runs[1]["id"]), "--db", db,
                                        "--docs-dir", str(docs)])
    assert compared.exit_code == 0 and compared.stdout.startswith("0 gained, 0 lost, 0 changed"), compared.output
    assert "lease_wait_s" not in compared.stdout and "host_load1" not in compared.stdout
    assert not list((docs / "compare").glob("runs-*"))  # printed, not published
    log = next(g["id"] for r in rows if r["model"] == "stories260K" for g in r["logs"])
    shown = CliRunner().invoke(app, ["show", log, "--db", db, "--data-dir", str(farm_dirs["data"])])
    assert shown.exit_code == 0 and shown.stdout.strip(), shown.output
    assert broken_links(docs) == []


def test_item8_the_l0_and_l1_deployments_carry_their_schedules_in_prefect_yaml() -> None:
    from edgefarm.flows.serve import _to_deployment, load_deployment_specs
    from edgefarm.test_lists.loader import list_names

    specs = {d["name"]: d for d in load_deployment_specs()}
    lists = {n for n in specs if n.startswith(("l0-", "l1-"))}
    assert "l1-x86-cpu" in lists and {"l0-x86-cpu", "l0-orin", "l0-thor", "l0-h200"} <= lists
    for name in sorted(lists):
        assert specs[name]["parameters"]["priority"] in list_names(), name
        deployment = _to_deployment(specs[name])  # what `edgefarm serve` registers
        crons = [s.schedule.cron for s in deployment.schedules or []]
        assert crons and all(c.count(" ") == 4 for c in crons), (name, crons)
    assert _to_deployment(specs["l1-x86-cpu"]).schedules[0].schedule.cron == "0 14 * * *"


def test_item7_a_dry_run_from_a_subdirectory_touches_nothing_and_says_its_data_dir(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    from typer.testing import CliRunner

    from edgefarm.cli import app

    sub = tmp_path / "flows"
    sub.mkdir()
    monkeypatch.chdir(sub)
    dry = CliRunner().invoke(app, ["nightly", "--dry-run"], env={"EDGEFARM_DATA_DIR": None, "EDGEFARM_DB_URL": None,
                                                                 "PREFECT_HOME": None})
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.splitlines()[0] == (f"data dir: {sub / '.data'} (the default: ./.data relative to the current "
                                          f"directory)")
    assert list(sub.iterdir()) == []  # no .data, no .data/prefect
    assert "Failed to create the Prefect home" not in dry.output


def test_item11_a_truncated_checkpoint_names_the_bound_it_broke(tmp_path: Path) -> None:
    import json
    import struct

    import pytest

    from edgellm.checkpoint.header import read_header
    from edgellm.errors import EdgeLLMError

    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)  # 8 of its 16 bytes: truncated
    with pytest.raises(EdgeLLMError) as caught:
        read_header(path)
    assert "need 0 <= begin <= end <= 8; broken: end <= 8, the data section's size: the file is truncated" \
        in str(caught.value)


def test_item7_ctrl_c_is_said_in_the_farms_words(capsys) -> None:
    import pytest
    import typer

    from edgefarm.cli.common import farm_errors

    with pytest.raises(typer.Exit) as ended, farm_errors("nightly"):
        raise KeyboardInterrupt
    assert ended.value.exit_code == 130
    said = capsys.readouterr().err
    assert said.startswith("edgefarm nightly: interrupted (Ctrl-C).") and "ends unpublished" in said


def test_item6_every_listing_command_takes_format_and_output(tmp_path: Path, farm_dirs: dict[str, Path]) -> None:
    import csv
    import io
    import json

    from typer.testing import CliRunner

    from edgefarm.cli import app

    url, _, _ = _nightly_and_bringup(tmp_path)
    listings = {"query": ["query", "--db", url], "runs": ["runs", "--db", url],
                "devices list": ["devices", "list", "--inventory", str(farm_dirs["inventory"]), "--db", url],
                "toolchains list": ["toolchains", "list", "--data-dir", str(tmp_path / "empty")]}
    for name, args in listings.items():
        shown = CliRunner().invoke(app, [*args, "--format", "json"])
        assert shown.exit_code == 0 and isinstance(json.loads(shown.stdout), list), (name, shown.output)
        saved = tmp_path / f"{name.replace(' ', '-')}.csv"
        written = CliRunner().invoke(app, [*args, "--format", "csv", "--output", str(saved)])
        assert written.exit_code == 0 and written.stdout == "", (name, written.output)
        header = next(csv.reader(io.StringIO(saved.read_text())))
        assert header and header[0] in ("model", "id", "toolchain"), (name, header)
        refused = CliRunner().invoke(app, [*args, "--format", "yaml"])
        assert refused.exit_code == 2 and "'yaml'" in refused.output and "table, json, csv" in refused.output, name
    legacy = CliRunner().invoke(app, ["toolchains", "list", "--data-dir", str(tmp_path / "empty"), "--json"])
    assert legacy.exit_code == 0 and json.loads(legacy.stdout) == []  # --json: a deprecated alias of --format json


def test_item7_bring_up_prints_its_rungs_not_prefects_info(farm_dirs: dict[str, Path], tmp_path: Path,
                                                           migrated_prefect_home) -> None:
    import os
    import subprocess
    import sys

    from tests.helpers.foreign import make_granite

    ckpt = make_granite(tmp_path / "granite")  # a new structure: stops at rung 2, a short flow
    migrated_prefect_home(tmp_path / "data" / "prefect")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "EDGEFARM_DB_URL"}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    done = subprocess.run([sys.executable, "-m", "edgefarm.cli", "bring-up", str(ckpt), "--data-dir",
                           str(tmp_path / "data"), "--inventory", str(farm_dirs["inventory"]), "--platforms",
                           "x86-cpu"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "Closest family" in done.stdout and "| INFO" not in said and "Beginning flow run" not in said, said


def test_item7_a_long_install_says_it_is_still_working(caplog) -> None:
    import logging
    import time

    from edgefarm.flows.plan import still_working

    with caplog.at_level(logging.WARNING, logger="edgefarm.flows.plan"), still_working("installing toolchain x", 0.05):
        time.sleep(0.3)
    beats = [r.getMessage() for r in caplog.records if "still working" in r.getMessage()]
    assert beats and all(re.fullmatch(r"installing toolchain x: still working, \d+ s", b) for b in beats), beats
    caplog.clear()
    time.sleep(0.15)
    assert not caplog.records  # it stops with its block


def test_item11_a_cut_reason_says_it_was_cut() -> None:
    from edgefarm.cli.progress import cut
    from edgefarm.stages.outcome import REASON_CHARS, StageOutcome
    from edgellm.errors import InfrastructureError

    long = "word " * 1000
    recorded = StageOutcome.from_error("build", InfrastructureError(long + "\nsecond line"))
    assert recorded.reason is not None and len(recorded.reason) == REASON_CHARS and recorded.reason.endswith("…")
    assert cut("short") == "short" and cut(long, 20) == long[:19] + "…"


def test_item2_the_live_table_fits_80_columns_with_every_stage_and_two_toolchains() -> None:
    from types import SimpleNamespace

    from rich.cells import cell_len
    from rich.console import Console

    from edgefarm.cli.progress import Progress, ProgressLines

    stages = ["reference", "quantize", "export", "build", "infer", "accuracy", "bench"]

    def job(model: str, toolchain: str, listed: tuple[str, ...]) -> object:
        return SimpleNamespace(key=f"{model}-fp16@x86-cpu/{toolchain}", model=model, toolchain=toolchain,
                               precision=SimpleNamespace(value="fp16"), platform="x86-cpu",
                               entry=SimpleNamespace(variant="", stages=listed))

    jobs = [job("stories260K", "edgellm-ort", tuple(stages[1:])), job("stories260K", "onnxruntime-genai",
                                                                          ("export", "build", "infer")),
            job("tiny-llama-4l-eagle3-with-a-long-name", "edgellm-ort", tuple(stages[1:]))]
    progress = Progress("l0_pipeline_x86cpu", jobs, stages)
    progress.update(SimpleNamespace(cached=False, job=jobs[0].key, stage="quantize", status="pass"))
    progress.update(SimpleNamespace(cached=False, job=jobs[0].key, stage="export", status="start"))
    progress.update(SimpleNamespace(cached=True, job=jobs[1].key, stage="export", status="pass"))
    console = Console(width=80, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    console.print(progress.table())
    text = console.export_text()
    lines = text.splitlines()
    assert all(cell_len(line) <= 80 for line in lines), text
    assert "l0_pipeline_x86cpu progress" in text and "…" not in text
    names = [line.split("  ")[0].strip() for line in lines[3:-2]]  # the row column, line by line (wrapped, not cut)
    assert "stories260K fp16 @x86-cpu (edgellm-ort)" in " ".join(names), text
    assert "stories260K fp16 @x86-cpu (onnxruntime-genai)" in " ".join(names), text  # two toolchains differ
    assert "tiny-llama-4l-eagle3-with-a-long-name fp16 @x86-cpu" in "".join(names), text  # folded, never cut
    first, second = [line for line in lines if line.startswith("stories260K fp16 @x86-cpu")]
    assert "✓" in first and "▶" in first and "·" in first  # done, running, pending: three markers
    assert "↺" in second and "✓" not in second  # reused, not "pass (cached)" wrapping
    assert "0:00 elapsed, 2/15 stages ended (2 pass), 1 running" in text.replace("\n", " "), text
    plain = Console(width=80, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    lines_out = ProgressLines(plain, jobs)
    lines_out.update(SimpleNamespace(cached=False, job=jobs[1].key, stage="build", status="start",
                                     name="build stories260K fp16 @x86-cpu", device=None, duration_s=0.0, reason=None))
    assert "build stories260K fp16 @x86-cpu (onnxruntime-genai)" in plain.export_text()  # two toolchains differ


def test_item5_a_table_says_each_toolchains_version_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'two.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abc")
    made = {"edgellm-ort": "0.1.0+onnxruntime-1.22.0", "onnxruntime-genai": "0.7.0"}
    for precision in ("fp32", "fp16"):
        for toolchain, version in made.items():
            for stage in PIPELINE:
                rec.record_result(run, model="stories260K", precision=precision, platform="x86-cpu", stage=stage,
                                  test_id=f"stories260K-{precision}-{toolchain}", status="pass", device="local-cpu",
                                  toolchain=toolchain, toolchain_version=version)
    rec.finish_run(run, "passed")
    engine.dispose()
    write_docs(url, tmp_path / "docs", None)
    md = (tmp_path / "docs" / "supported-models.md").read_text()
    assert "Toolchains: edgellm-ort 0.1.0+onnxruntime-1.22.0, onnxruntime-genai 0.7.0" in md  # once, in the heading
    cells = [line for line in md.splitlines() if line.startswith("| stories260K")]
    assert len(cells) == 2 and all("0.7.0" not in c and "1.22.0" not in c for c in cells), cells
    assert "[✓ edgellm-ort](runs/" in md and "[✓ onnxruntime-genai](runs/" in md


def test_item11_a_failure_cites_the_checks_evidence_before_the_tools_log() -> None:
    from edgefarm.artifacts.kinds import ArtifactKind
    from edgefarm.artifacts.store import ArtifactRef
    from edgefarm.results.models import ResultStatus
    from edgefarm.stages.outcome import StageOutcome
    from edgefarm.tasks.states import log_ids

    arts = [ArtifactRef("a" * 64, 1, ArtifactKind.LOG), ArtifactRef("b" * 64, 1, ArtifactKind.REPORT)]
    failed = StageOutcome(stage="export", status=ResultStatus.FAIL, reason="export check failed", artifacts=arts)
    assert log_ids(failed) == ["report:bbbbbbbbbbbb", "log:aaaaaaaaaaaa"]  # what the farm judged, then the tool's log
    passed = StageOutcome(stage="export", status=ResultStatus.PASS, artifacts=arts)
    assert log_ids(passed) == ["log:aaaaaaaaaaaa"]


def test_item5_a_cells_perplexity_ratio_says_the_limit_it_was_judged_by() -> None:
    from edgefarm.pages.docs_render import metrics_text
    from edgefarm.stages.job import PPL_LIMIT_METRIC

    shown = metrics_text({"perplexity_ratio": 1.00042, PPL_LIMIT_METRIC: 0.01}, "; ")
    assert shown == "ppl ratio 1.0004 (limit 1±0.01)"
    assert metrics_text({"perplexity_ratio": 1.00042}, "; ") == "ppl ratio 1.0004"  # a row recorded before the limit


def test_item10_installing_the_project_adds_two_names_to_site_packages() -> None:
    """Item 10: the farm installs under one name. The wheel itself is built, installed and run away from the
    checkout by tests/test_packaging.py; here, what the newcomer's environment holds: the project declares two
    top-level packages, and the farm's modules a command loads are all edgefarm.* (none under a generic name)."""
    import subprocess
    import sys
    import tomllib

    repo = Path(__file__).resolve().parent.parent
    found = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert found["include"] == ["edgellm*", "edgefarm*"]
    code = ("import sys, edgefarm.cli\n"
            "print('\\n'.join(sorted({m.split('.')[0] for m in sys.modules})))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=repo)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    generic = {"flows", "tasks", "results", "artifacts", "devices", "stages", "toolchains", "pages", "cli",
               "registries", "test_lists", "vocabulary"}
    assert "edgefarm" in loaded.stdout.split() and not generic & set(loaded.stdout.split())
