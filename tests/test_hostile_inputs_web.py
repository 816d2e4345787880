"""Hostile inputs, round two (issue 24, items 1, 2, 7, 8, 9, 10): secrets in database URLs, the served API,
hostile device answers, unbounded device output, and names that carry Rich markup, Markdown, HTML or spreadsheet
formulas. Property-based where it fits; every example is small so the file runs in seconds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote_plus

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.devices.inventory import Device
from edgefarm.devices.transport.base import CommandResult, Transport
from edgefarm.results.db import for_parameters, from_parameter, redact
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.sshd import SshHosts

SECRET = "S3cret-pw"
FEW = settings(max_examples=40, deadline=None)


def _invoke(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "250", **(env or {})})
    return result.exit_code, result.stdout + result.stderr


# --- 1. a database password in any form of URL ------------------------------------------------------------------

PASSWORD_URLS = [
    f"postgresql+psycopg://u@db.example:5432/edgefarm?password={SECRET}",
    f"postgresql+psycopg://u@db.example:5432/edgefarm?sslmode=require&sslpassword={SECRET}",
    f"postgresql+psycopg://u@db.example/edgefarm?PGPASSWORD={SECRET}&application_name=farm",
    f"postgresql+psycopg://u:{SECRET}@db.example/edgefarm?password={SECRET}&password={SECRET}",
    f"postgresql+psycopg://u@db.example/edgefarm?pass%77ord={SECRET}",  # the key percent-encoded
    f"not a url://u@h/db?password={SECRET}&x=1",
    f"host=db.example user=u password={SECRET} dbname=edgefarm",  # libpq's keyword form
]


@pytest.mark.parametrize("url", PASSWORD_URLS)
def test_every_form_of_database_password_is_redacted_and_handed_back(url: str) -> None:
    shown = redact(url)
    assert SECRET not in shown and "***" in shown, shown
    handed = for_parameters(url)  # what a flow or task parameter carries (Prefect stores it)
    assert SECRET not in handed
    assert from_parameter(handed) == url  # this process gets the real URL back


@FEW
@given(key=st.sampled_from(["password", "sslpassword", "PGPASSWORD", "Password", "api_token", "client_secret"]),
       value=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=6, max_size=20)
       .filter(lambda v: v.strip() == v and "***" not in v),
       other=st.sampled_from(["", "&sslmode=require", "&application_name=a%20b"]))
def test_a_secret_query_parameter_never_shows(key: str, value: str, other: str) -> None:
    url = f"postgresql+psycopg://farm@db.example:5432/edgefarm?{key}={quote_plus(value)}{other}"
    shown = redact(url)
    assert quote_plus(value) not in shown and value not in shown.split("?", 1)[1].split("&")[0]
    assert "sslmode=require" in shown if "sslmode" in other else True
    assert from_parameter(for_parameters(url)) == url


def test_the_settings_never_show_the_database_password(tmp_path: Path) -> None:
    from edgefarm.flows.settings import Settings

    url = f"postgresql+psycopg://u@db.example/edgefarm?password={SECRET}"
    settings = Settings.resolve(db=url, data_dir=tmp_path, create=False)
    assert settings.db_url == url  # the real one, for the engine
    assert SECRET not in repr(settings) and SECRET not in str(settings)  # a log line or a traceback


def test_query_on_an_unreachable_database_never_prints_its_password() -> None:
    code, output = _invoke("query", "--db", f"postgresql+psycopg://u@127.0.0.1:1/db?password={SECRET}")
    assert code == 3, output  # nothing listens on port 1: infrastructure
    assert SECRET not in output and "password=***" in output, output
    assert "Traceback" not in output


# --- 9. names printed through Rich ------------------------------------------------------------------------------

HOSTILE_NAMES = ["[/]", "[red]boom[/red] [link=http://evil.example]click[/link]", "x\\", "tail\\[/]",
                 "a|b\nc", "=cmd|' /C calc'!A0", "<script>alert(1)</script>", "<img src=x onerror=alert(1)>",
                 "esc\x1b[2Jcleared", "[bold]", "[/red]", "$\\frac{$", "*em* _em_ `code` ~~s~~ &lt; &#60;"]
hostile_text = st.one_of(st.sampled_from(HOSTILE_NAMES),
                         st.text(st.sampled_from("[]/\\=|\n\x1b<>&#*_`'\"!@+-abc "), min_size=1, max_size=30))


def _rendered(*renderables: object, width: int = 400) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    console.print(*renderables)
    console.file.close()
    return console.export_text()


@FEW
@given(value=hostile_text)
def test_a_printed_value_is_shown_as_written_on_one_line(value: str) -> None:
    from edgefarm.cli.text import cell, visible

    shown = visible(value)
    assert "\n" not in shown and "\x1b" not in shown
    assert _rendered(cell(value)) == shown + "\n"


@FEW
@given(job=hostile_text, status=hostile_text)
def test_progress_table_and_summary_print_hostile_job_names_as_written(job: str, status: str) -> None:
    from types import SimpleNamespace

    from edgefarm.cli.progress import Progress
    from edgefarm.cli.text import visible

    planned = SimpleNamespace(key=job, model=job, precision=SimpleNamespace(value="fp32"), platform="x86-cpu",
                              toolchain="edgellm-ort", entry=SimpleNamespace(variant="", stages=("export",)))
    progress = Progress(job, [planned], ["export"])
    progress.update(SimpleNamespace(job=job, stage="export", status=status, cached=True))
    table = _rendered(progress.table())
    assert visible(job) in table and visible(status) in table
    assert len([line for line in table.splitlines() if "fp32 @x86-cpu" in line]) == 1  # one row, one line


def test_summary_prints_failed_job_names_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    from edgefarm.cli import running as commands

    failures = [{"row": name, "stage": "build", "status": "fail", "error_kind": "test_failure", "device": name,
                 "reason": name, "logs": [f"log:{name}"]} for name in HOSTILE_NAMES]
    code = commands._print_summary({"run_id": 1, "plan": {}, "stages": {}, "failed": HOSTILE_NAMES,
                                    "failures": failures})
    assert code == 1
    printed = capsys.readouterr().out
    assert "[/]" in printed and "[red]boom[/red] [link=http://evil.example]click[/link]" in printed
    assert "a|b\\nc" in printed and "\x1b" not in printed


def _hostile_db(path: Path, names: list[str]) -> str:
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgefarm.results.recorder import Recorder

    url = f"sqlite:///{path}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abc", toolchain={"edgellm-farm": "0.1.0"})
    for name in names:
        rec.record_result(run, model=name, precision="fp32", platform="x86-cpu", stage="export", test_id=name,
                          status="fail", device="local-cpu", toolchain="edgellm-ort", toolchain_version=name,
                          reason=f"reason {name}")
    rec.finish_run(run, "failed")
    engine.dispose()
    return url


def test_query_table_prints_hostile_model_names_as_written(tmp_path: Path) -> None:
    from edgefarm.cli.text import visible

    url = _hostile_db(tmp_path / "x.db", HOSTILE_NAMES)
    code, output = _invoke("query", "--db", url)
    assert code == 0, output
    rows = [line for line in output.splitlines() if line.startswith("│")]
    assert len(rows) == len(HOSTILE_NAMES), output  # every row on one line
    for name in HOSTILE_NAMES:
        assert any(line.split("│")[1].strip() == visible(name) for line in rows), (name, output)
    assert "\x1b" not in output


def test_devices_list_prints_hostile_labels_as_written_and_refuses_hostile_hosts(tmp_path: Path) -> None:
    """Labels are free text, printed literally; a host that is no host name (``[/]``) is refused by the inventory
    (tests/test_hostile_inputs.py holds the host rules), with the value printed as written."""
    import yaml

    inventory = tmp_path / "inv"
    inventory.mkdir()
    (inventory / "a.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(tmp_path / "w"),
        "labels": ["[/]", "[red]boom[/red]", "[link=http://evil.example]x"]}))
    (inventory / "b.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "host": "[/]", "user": "u", "key_file": "/etc/hostname", "work_dir": "w",
        "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"}))
    env = {"EDGEFARM_DATA_DIR": str(tmp_path / "data"), "EDGEFARM_DB_URL": None}
    code, output = _invoke("devices", "list", "--inventory", str(inventory), env=env)
    assert code == 2 and "host: '[/]' is not a host name" in output, output
    (inventory / "b.yaml").unlink()
    code, output = _invoke("devices", "list", "--inventory", str(inventory), env=env)
    assert code == 0, output
    assert "[/], [red]boom[/red], [link=http://evil.example]x" in output, output


# --- 10. names in Markdown, HTML and CSV ------------------------------------------------------------------------

def _markdown_html(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table").enable("strikethrough").render(text)


class _Tags:
    """Every start tag of an HTML text, and its text content."""

    def __init__(self, text: str) -> None:
        from html.parser import HTMLParser

        tags: list[tuple[str, dict[str, str | None]]] = []
        data: list[str] = []

        class Parser(HTMLParser):
            def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
                tags.append((tag, dict(attrs)))

            def handle_data(self, chunk: str) -> None:
                data.append(chunk)

        Parser(convert_charrefs=True).feed(text)
        self.tags, self.text = tags, "".join(data)

    def names(self) -> list[str]:
        return [t for t, _ in self.tags]


def _one_line(value: str) -> str:
    import re

    return re.sub(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+", " ", value).strip()


def _words(value: str) -> list[str]:
    return _one_line(value).split()


@settings(max_examples=60, deadline=None)
@given(value=hostile_text)
def test_markdown_text_is_literal_text_in_a_table_cell_and_a_heading(value: str) -> None:
    from edgefarm.pages.escape import markdown_text

    cell_html = _Tags(_markdown_html(f"| a | b |\n|---|---|\n| {markdown_text(value)} | x |\n"))
    assert cell_html.names() == ["table", "thead", "tr", "th", "th", "tbody", "tr", "td", "td"], cell_html.tags
    assert _words(cell_html.text) == _words(f"a b {value} x")  # the value, word for word
    heading = _Tags(_markdown_html(f"## {markdown_text(value)} · fp32\n"))
    assert heading.names() == ["h2"], heading.tags
    assert _words(heading.text) == _words(f"{value} · fp32")


def _rows(model: str, platform: str, toolchain: str) -> list[object]:
    from edgefarm.pages.docs_render import MatrixRow

    passed = dict.fromkeys(("export", "build", "infer", "accuracy", "bench"), "pass")
    return [MatrixRow(model=model, precision=precision, platform=platform, status="pass", run_id=1,
                      run_started="2026-01-01", device=model, reason=model, stages=passed,
                      metrics={"decode_tokens_per_s": 1.0}, toolchain=toolchain, toolchain_version=model)
            for precision in ("fp32", "fp16")]


@settings(max_examples=40, deadline=None)
@given(model=hostile_text, platform=hostile_text, toolchain=hostile_text)
def test_rendered_pages_keep_their_structure_whatever_the_names(model: str, platform: str, toolchain: str) -> None:
    from edgefarm.pages.docs_html import render_html
    from edgefarm.pages.docs_render import render_markdown

    rows = _rows(model, platform, toolchain)
    markdown = render_markdown(rows, generated_at="now", db_label="SQLite")  # type: ignore[arg-type]
    tags = _Tags(_markdown_html(markdown))
    assert not {"script", "img", "em", "strong", "code", "s", "del", "br", "hr"} & set(tags.names()), tags.names()
    assert tags.names().count("table") == 1 and tags.names().count("td") == 4, tags.names()  # model, params, 2 cells
    assert " ".join(_words(model)) in " ".join(_words(tags.text))
    page = _Tags(render_html(rows, generated_at="now", db_label="SQLite"))  # type: ignore[arg-type]
    assert page.names().count("script") == 2 and page.names().count("table") == 1 and "img" not in page.names()
    assert page.names().count("td") == 3 and page.names().count("tr") == 2, page.names()  # header row + 1 model
    assert all(not k.startswith("on") for _, attrs in page.tags for k in attrs)
    assert model.replace("\r\n", "\n").replace("\r", "\n") in page.text or not model.strip()


def _supported_db(path: Path, names: list[str]) -> str:
    """A run in which every hostile name passed every stage: each is a supported cell of the matrix."""
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgefarm.results.recorder import Recorder

    url = f"sqlite:///{path}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abc", toolchain={"edgellm-farm": "0.1.0"})
    for name in names:
        for stage in ("export", "build", "infer", "accuracy", "bench"):
            rec.record_result(run, model=name, precision="fp32", platform="x86-cpu", stage=stage, test_id=name,
                              status="pass", device="local-cpu", toolchain="edgellm-ort", toolchain_version="0.1",
                              metrics={"decode_tokens_per_s": (10.0, "tok/s")} if stage == "bench" else None)
    rec.finish_run(run, "passed")
    engine.dispose()
    return url


COLLIDING = ["[ ]", "[[]]", "<b>", "a b", "a/b", "a-b"]  # slugs: nothing, nothing, b, a-b, a-b, a-b


def test_docs_pages_show_hostile_names_as_text_with_unique_anchors(tmp_path: Path) -> None:
    import re

    from edgefarm.pages.docs import write_docs

    names = [*HOSTILE_NAMES, *COLLIDING]
    write_docs(_supported_db(tmp_path / "x.db", names), tmp_path / "docs", tmp_path / "data")
    matrix = (tmp_path / "docs" / "supported-models.md").read_text()
    rendered = _Tags(_markdown_html(matrix))
    assert not {"script", "img", "em", "strong", "code", "s", "del"} & set(rendered.names()), rendered.names()
    links = [href for t, a in rendered.tags if t == "a" and (href := a.get("href") or "").startswith("runs/")]
    assert len(links) == len(names) and len(set(links)) == len(names), links  # one link per row, none shared
    rows = [line for line in matrix.splitlines() if line.startswith("| ") and "runs/run-" in line]
    assert len(rows) == len(names)  # a newline or | in a name breaks no row
    for name in names:
        assert " ".join(_words(name)) in " ".join(_words(rendered.text)), name
    page = (tmp_path / "docs" / "runs" / "run-1.md").read_text()
    ids = re.findall(r"<a id='([^']*)'></a>", page)
    assert len(ids) == len(set(ids)) == len(names), ids
    assert {link.split("#", 1)[1] for link in links} == set(ids)  # every link lands on its own section
    page_html = _Tags(_markdown_html(page))
    assert not {"script", "img", "em", "strong", "code"} & set(page_html.names()), page_html.names()
    html_page = _Tags((tmp_path / "docs" / "support-matrix.html").read_text())
    assert html_page.names().count("script") == 2  # the page's own two
    assert all(a.get("class") == "trend" and str(a.get("src")).startswith("data:image/png;base64,")
               for t, a in html_page.tags if t == "img")  # only its trend plots
    assert all(not k.startswith("on") for _, attrs in html_page.tags for k in attrs)


def test_query_csv_neutralises_spreadsheet_formulas(tmp_path: Path) -> None:
    import csv
    import io

    names = ["=cmd|' /C calc'!A0", "+1+2", "-2+3", "@SUM(A1)", "\tx", "plain"]
    code, output = _invoke("query", "--db", _hostile_db(tmp_path / "x.db", names), "--format", "csv")
    assert code == 0, output
    rows = list(csv.DictReader(io.StringIO(output)))
    assert sorted(r["model"] for r in rows) == sorted("'" + n if n != "plain" else n for n in names)
    for r in rows:
        assert not any(v.startswith(("=", "+", "-", "@", "\t", "\r")) for v in r.values()), r


@FEW
@given(value=st.one_of(hostile_text, st.sampled_from(["=1+1", "+x", "-x", "@x", "\t=x", "\uff1d1"])))
def test_a_spreadsheet_cell_never_starts_a_formula(value: str) -> None:
    from edgefarm.pages.escape import spreadsheet_cell

    shown = spreadsheet_cell(value)
    assert isinstance(shown, str) and not shown.startswith(("=", "+", "-", "@", "\t", "\r", "\n", "\uff1d"))
    assert shown in (value, "'" + value)
    assert spreadsheet_cell(-1.5) == -1.5 and spreadsheet_cell(None) is None


# --- 7. a device answering the health probe with hostile values ---------------------------------------------------

class _Answering(Transport):
    """A transport whose device answers the agent and the toolchains' probes with the given JSON (or text)."""

    device_id = "hostile"

    def __init__(self, env: object, cache: object = None, probe: object = None, check: object = None) -> None:
        self.answers = {"env": env, "cache": {} if cache is None else cache,
                        "check": {"problems": []} if check is None else check}
        self.probe = {} if probe is None else probe

    def run(self, argv: list[str], *, timeout: float, log: Path | None = None, env: dict[str, str] | None = None,
            cwd: str | None = None) -> CommandResult:
        import json

        from edgefarm.devices import agent_client

        def answer(value: object) -> CommandResult:
            return CommandResult(0, value if isinstance(value, str) else json.dumps(value), "", 0.0)

        if argv[0] == "sha256sum":
            return answer(f"{agent_client.AGENT_SHA256}  {argv[-1]}\n")
        if agent_client.AGENT_PATH in argv:
            return answer(self.answers[argv[argv.index(agent_client.AGENT_PATH) + 1]])
        return answer(self.probe)

    def put(self, local_path: Path, remote_path: str) -> None:
        pass

    def get(self, remote_path: str, local_path: Path) -> None:
        pass

    def close(self) -> None:
        pass


def _local_device(tmp_path: Path, python: str | None = None) -> Device:
    import yaml

    from edgefarm.devices.inventory import load_inventory

    inventory = tmp_path / "inv"
    inventory.mkdir(exist_ok=True)
    block = {"type": "x86-cpu", "transport": "local", "work_dir": str(tmp_path / "w")}
    (inventory / "hostile.yaml").write_text(yaml.safe_dump({**block, **({"python": python} if python else {})}))
    return load_inventory(inventory, data_dir=tmp_path / "data").get("hostile")


HOSTILE_ENVS = [
    {"python": 3, "free": "lots"},
    {"python": "3.10.1 [/]", "machine": ["x86_64"], "disk_free_bytes": "lots", "clocks_locked": "yes"},
    {"python": "3.10.1", "machine": "x86_64", "disk_free_bytes": -1, "l4t": "36.4", "jetpack": {"version": 6},
     "cuda": {"version": "[red]12[/red]"}, "power_mode": {"name": {"x": 1}}, "thermal": {"temp_c": 40}},
    {"python": "3.10.1", "machine": "x86_64", "disk_free_bytes": True, "thermal": [{"temp_c": float("nan")}, 3]},
]


@pytest.mark.parametrize("env", HOSTILE_ENVS)
def test_hostile_health_answers_make_the_device_unhealthy_with_the_reason(env: dict[str, object],
                                                                           tmp_path: Path) -> None:
    import json

    from edgefarm.cli.devices import _health_table
    from edgefarm.registries import current
    from edgefarm.toolchains.health import check_device

    device = _local_device(tmp_path)
    report = check_device(device, current().device_type(device.type),
                          transport=_Answering(env, {"total_bytes": "x", "entries": 3}))
    assert report.reachable and not report.healthy, report
    assert any("answered" in p and "valid:" in p for p in report.problems), report.problems
    json.dumps(report.to_dict())  # storable
    _rendered(_health_table([report]))  # printable


def test_a_toolchain_probe_answering_markup_or_the_wrong_shape_is_a_problem(tmp_path: Path) -> None:
    from edgefarm.registries import current
    from edgefarm.toolchains.health import check_device

    device = _local_device(tmp_path)
    env = {"python": "3.10.1", "machine": "x86_64", "disk_free_bytes": 2**40}
    probe = {"edgellm": "edgellm [/]", "packages": {"onnxruntime": "1.22.0"}, "onnxruntime_genai": "0.6.0"}
    report = check_device(device, current().device_type(device.type), transport=_Answering(env, probe=probe))
    assert not report.healthy and report.edgellm_version is None
    assert any("edgellm-ort: its probe answered version = 'edgellm [/]+onnxruntime-1.22.0'" in p
               for p in report.problems), report.problems
    shaped = check_device(device, current().device_type(device.type), transport=_Answering(env, check={"problems": 7}))
    assert shaped.reachable


@settings(max_examples=30, deadline=None)
@given(env=st.dictionaries(
    st.sampled_from(["python", "machine", "disk_free_bytes", "l4t", "jetpack", "cuda", "gpu_driver", "power_mode",
                     "clocks_locked", "thermal"]),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | hostile_text,
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                     st.sampled_from(["version", "name", "release", "temp_c"]), inner, max_size=2), max_leaves=5)),
    cache=st.dictionaries(st.sampled_from(["total_bytes", "entries"]),
                          st.none() | st.integers() | hostile_text | st.lists(st.integers(), max_size=2)))
def test_no_health_answer_crashes_the_check(env: dict[str, object], cache: dict[str, object],
                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    import json

    from edgefarm.cli.devices import _health_table
    from edgefarm.registries import current
    from edgefarm.toolchains.health import check_device

    device = _local_device(tmp_path_factory.mktemp("dev"))
    report = check_device(device, current().device_type(device.type), transport=_Answering(env, cache))
    assert report.reachable
    json.dumps(report.to_dict())
    _rendered(_health_table([report]))


def test_devices_check_survives_and_stores_a_hostile_device(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgefarm.results.models import DeviceHealth

    fake = tmp_path / "python3"  # the device's interpreter answers every question with hostile JSON
    fake.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = -m ]; then echo '{\"edgellm\": \"edgellm [/]\", \"packages\": {}}'; exit 0; fi\n"
                    "case \"$4\" in\n"
                    "  env) echo '{\"python\": 3, \"free\": \"lots\", \"machine\": \"[red]x86_64[/red]\"}' ;;\n"
                    "  cache) echo '{\"total_bytes\": \"lots\", \"entries\": \"[/]\"}' ;;\n"
                    "  *) echo '{}' ;;\n"
                    "esac\n")
    fake.chmod(0o755)
    _local_device(tmp_path, python=str(fake))
    url = f"sqlite:///{tmp_path / 'health.db'}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    code, output = _invoke("devices", "check", "--inventory", str(tmp_path / "inv"), "--db", url)
    assert code == 1, output  # unhealthy, not a crash
    assert "Traceback" not in output and "answered python = 3" in output, output
    engine = create_engine(url)
    with Session(engine) as session:
        rows = list(session.scalars(select(DeviceHealth)))
    engine.dispose()
    assert len(rows) == 1 and rows[0].python_version is None and rows[0].details["healthy"] is False
    assert any("answered machine = '[red]x86_64[/red]'" in p for p in rows[0].details["problems"])


# --- 8. unbounded device output ----------------------------------------------------------------------------------

LOUD = ("import sys\n"
        "w = sys.stdout.buffer.write\n"
        "w(b'HEAD-')\n"
        "for _ in range(64):\n"
        "    w(b'x' * (1 << 20))\n"
        "w(b'-TAIL')\n"
        "sys.stderr.write('err' * 10)\n")
LOUD_BYTES = 64 * (1 << 20) + 10


def _assert_capped(result: CommandResult, limit: int) -> None:
    assert result.ok, result.stderr
    assert result.stdout.startswith("HEAD-") and result.stdout.endswith("-TAIL")
    assert result.stdout_dropped == LOUD_BYTES - limit, result.stdout_dropped
    assert f"<<< {LOUD_BYTES - limit} bytes dropped here" in result.stdout
    assert len(result.stdout) < limit + 200
    assert result.stderr == "err" * 10 and result.stderr_dropped == 0


def test_local_transport_keeps_head_and_tail_of_a_flood_and_counts_the_rest(tmp_path: Path) -> None:
    import sys
    import tracemalloc

    from edgefarm.devices.transport.local import LocalTransport

    link = LocalTransport("loud", tmp_path / "w")
    link.max_output_bytes = 1 << 20
    log = tmp_path / "loud.log"
    tracemalloc.start()
    try:
        result = link.run([sys.executable, "-c", LOUD], timeout=60, log=log)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak / 2**20:.0f} MiB for 64 MiB of output"  # was 2 x the output
    _assert_capped(result, 1 << 20)
    assert log.stat().st_size == LOUD_BYTES + 30  # the log still gets everything


@FEW
@given(chunks=st.lists(st.binary(max_size=300), max_size=30), limit=st.integers(min_value=2, max_value=400))
@example(chunks=["é".encode()], limit=2)  # a character split between head and tail, nothing dropped
def test_an_output_buffer_keeps_exactly_its_head_and_tail(chunks: list[bytes], limit: int) -> None:
    from edgefarm.devices.transport.base import OutputBuffer

    buffer = OutputBuffer(limit)
    for chunk in chunks:
        buffer.extend(chunk)
    whole = b"".join(chunks)
    half = limit // 2
    if len(whole) <= 2 * half:
        assert buffer.dropped == 0 and buffer.text() == whole.decode(errors="replace")
    else:
        assert buffer.dropped == len(whole) - 2 * half
        assert bytes(buffer.head) == whole[:half] and buffer._tail_kept() == whole[len(whole) - half:]


def test_ssh_transport_keeps_head_and_tail_of_a_flood(live_ssh_hosts: SshHosts) -> None:
    from edgefarm.devices.transport.ssh import SSHTransport

    with SSHTransport(live_ssh_hosts[0].device()) as link:
        link.max_output_bytes = 1 << 20
        _assert_capped(link.run(["python3", "-c", LOUD], timeout=120), 1 << 20)


# --- 2. edgefarm serve's API and the priorities it runs ---------------------------------------------------------

def test_a_priority_is_a_test_list_of_the_list_directory_only(tmp_path: Path) -> None:
    from edgefarm.flows.test_list import list_name
    from edgefarm.test_lists.loader import LISTS_DIR
    from edgellm.errors import ConfigurationError

    assert list_name("l0_pipeline_x86cpu") == "l0_pipeline_x86cpu"
    assert list_name(str(LISTS_DIR / "l0_pipeline_x86cpu.yml")) == "l0_pipeline_x86cpu"
    elsewhere = tmp_path / "l0_pipeline_x86cpu.yml"
    elsewhere.write_text((LISTS_DIR / "l0_pipeline_x86cpu.yml").read_text())
    for bad in (str(elsewhere), str(LISTS_DIR / "models.yml"), str(LISTS_DIR / "waivers.yml"),
                str(LISTS_DIR / ".." / "test_lists" / ".." / "infra" / "prefect.yaml"), "../../etc/passwd.yml",
                "/etc/passwd"):
        with pytest.raises(ConfigurationError, match=r"is not a test list of .*; valid: .*l0_pipeline_x86cpu"):
            list_name(bad)
    from edgefarm.flows.test_list import run_test_list

    with pytest.raises(ConfigurationError, match="is not a test list of"):  # a deployment's run: refused first
        run_test_list.fn(priority=str(elsewhere), data_dir=str(tmp_path / "data"))


def _http(url: str, method: str = "GET", headers: dict[str, str] | None = None,
          body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, method=method, data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def test_the_served_api_refuses_other_origins_and_hosts_requests_without_csrf_token_and_without_auth(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_prefect_home: Callable[[Path], Path]) -> None:
    import base64
    import json

    from edgefarm.flows.prefect_env import free_port
    from edgefarm.flows.serve import guard_env, start_server, stop_server

    monkeypatch.setenv("PREFECT_HOME", str(migrated_prefect_home(tmp_path / "prefect")))
    port = free_port()
    proc, api = start_server("127.0.0.1", port, tmp_path / "prefect" / "server.log",
                             guard=guard_env("127.0.0.1", port, "farm:" + SECRET), timeout_s=240)
    try:
        auth = {"Authorization": "Basic " + base64.b64encode(f"farm:{SECRET}".encode()).decode()}
        preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        evil = _http(f"{api}/flow_runs/filter", "OPTIONS", {**preflight, "Origin": "http://evil.example"})
        assert evil[1].get("access-control-allow-origin") not in ("*", "http://evil.example"), evil
        own = _http(f"{api}/flow_runs/filter", "OPTIONS", {**preflight, "Origin": f"http://127.0.0.1:{port}"})
        assert own[0] == 200 and own[1].get("access-control-allow-origin") == f"http://127.0.0.1:{port}", own
        body, json_type = b"{}", {"Content-Type": "application/json"}
        assert _http(f"{api}/csrf-token?client=evil")[0] == 401  # no credentials, no token
        # a page that points its own name at 127.0.0.1 (DNS rebinding) is answered nothing, credentials or not
        rebound = _http(f"{api}/csrf-token?client=evil", headers={**auth, "Host": f"evil.example:{port}"})
        assert rebound[0] == 400 and b"Invalid host header" in rebound[2], rebound
        assert _http(f"http://localhost:{port}/api/health", headers={"Host": f"localhost:{port}"})[0] == 200
        no_token = _http(f"{api}/flow_runs/filter", "POST", {**auth, **json_type}, body)
        assert no_token[0] == 403 and b"CSRF" in no_token[2], no_token
        code, _, raw = _http(f"{api}/csrf-token?client=test", headers=auth)
        assert code == 200, raw
        token = {"Prefect-Csrf-Token": json.loads(raw)["token"], "Prefect-Csrf-Client": "test"}
        assert _http(f"{api}/flow_runs/filter", "POST", {**json_type, **token}, body)[0] == 401  # token, no auth
        assert _http(f"{api}/flow_runs/filter", "POST", {**auth, **json_type, **token}, body)[0] == 200
    finally:
        stop_server(proc)


def test_serve_refuses_an_auth_string_without_a_password() -> None:
    from edgefarm.flows.serve import guard_env
    from edgellm.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="USER:PASSWORD"):
        guard_env("127.0.0.1", 4200, "farm")
    assert "PREFECT_SERVER_API_AUTH_STRING" not in guard_env("127.0.0.1", 4200)
    assert guard_env("127.0.0.1", 4200)["PREFECT_SERVER_CSRF_PROTECTION_ENABLED"] == "true"


@pytest.mark.usefixtures("prefect_harness")
def test_a_password_given_as_a_query_parameter_never_reaches_prefect(postgres: PostgresServer,
                                                                     farm_dirs: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    """`edgefarm nightly --db 'postgresql+psycopg://u@host/db?password=...'`: the flow run's stored parameters, its
    logs, the pages and the output carry the URL with the password hidden."""
    import json

    import yaml
    from prefect import get_client

    url, password = postgres.create_database(), postgres.password
    url = url.replace(f":{password}@", "@") + f"?sslmode=disable&password={password}"
    # the cheapest run that opens a flow run (one export on the local CPU; a run with nothing to do opens none)
    matrix = tmp_path / "export.yml"
    matrix.write_text(yaml.safe_dump({
        "name": "export", "models": ["stories260K"], "precisions": ["fp32"], "platforms": ["x86-cpu"],
        "defaults": {"stages": ["export"], "max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128}}))
    code, output = _invoke("nightly", "--json", "--matrix", str(matrix), "--db", url, "--inventory",
                           str(farm_dirs["inventory"]), "--data-dir", str(tmp_path / "data"),
                           "--docs-dir", str(tmp_path / "docs"))
    assert code == 0, output
    assert password not in output
    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs() if r.parameters.get("matrix") == str(matrix)]
        assert len(runs) == 1 and runs[0].parameters["db_url"] == redact(url)
        stored = json.dumps([r.model_dump(mode="json") for r in runs])
        logs = json.dumps([log.message for log in client.read_logs()])
    assert password not in stored and password not in logs
    for page in (tmp_path / "docs").rglob("*"):
        if page.is_file():
            assert password not in page.read_text(errors="replace"), page
