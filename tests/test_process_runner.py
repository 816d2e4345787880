"""``toolchains.process``: the one host process runner of every toolchain. Output captured (to a log, or as text
for a probe), a nonzero exit returned with its telling line, a run past its limit killed as an infrastructure error
that names the command, and no credential of ours in the child's environment, the tensorrt-edgellm model probe's
included."""

from __future__ import annotations

import ast
import json
import sys
import time
from pathlib import Path

import pytest

from edgefarm.toolchains.process import run_captured, run_tool
from edgellm.errors import ErrorKind, InfrastructureError

REPO = Path(__file__).resolve().parents[1]
SECRETS = {"AWS_SECRET_ACCESS_KEY": "s3cr3t-aws", "HF_TOKEN": "hf_s3cr3t", "EDGEFARM_DB_URL":
           "postgresql://farm:pw0rd@db/farm", "HTTPS_PROXY": "http://user:pr0xypw@proxy.example:3128"}


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FARM_PLAIN_SETTING", "kept")


def _assert_no_secret(text: str) -> None:
    for name, value in SECRETS.items():
        assert value not in text and f"{name}=" not in text, name


def test_run_tool_captures_the_output_and_returns_a_nonzero_exit(tmp_path: Path) -> None:
    code = "import sys; print('to stdout'); print('ValueError: the model broke', file=sys.stderr); sys.exit(3)"
    run = run_tool([sys.executable, "-c", code], env={}, log=tmp_path / "logs" / "tool.log", timeout=60)
    assert run.returncode == 3 and run.wall_s > 0 and run.peak_rss_bytes > 0
    assert "to stdout" in run.tail() and "the model broke" in run.tail()  # stdout and stderr, one log
    assert run.error_line() == "ValueError: the model broke"


def test_run_captured_gives_stdin_and_returns_stdout_stderr_and_exit(tmp_path: Path) -> None:
    code = "import sys; d = sys.stdin.read(); print(d.upper()); print('warn', file=sys.stderr); sys.exit(2)"
    done = run_captured([sys.executable, "-c", code], env={}, timeout=60, stdin="hello")
    assert (done.returncode, done.stdout, done.stderr) == (2, "HELLO\n", "warn\n")


@pytest.mark.parametrize("shape", ["run_tool", "run_captured"])
def test_a_run_past_its_limit_is_killed_with_its_group_as_an_infrastructure_error(shape: str,
                                                                                   tmp_path: Path) -> None:
    marker = tmp_path / "child-survived"
    argv = ["/bin/sh", "-c", f"(sleep 3; touch {marker}) & wait"]
    start = time.monotonic()
    with pytest.raises(InfrastructureError, match="the slow tool ran past its 1 s limit and was killed") as info:
        if shape == "run_tool":
            run_tool(argv, env={}, log=tmp_path / "tool.log", timeout=1, what="the slow tool")
        else:
            run_captured(argv, env={}, timeout=1, what="the slow tool")
    assert info.value.kind is ErrorKind.INFRASTRUCTURE and time.monotonic() - start < 3
    time.sleep(3)
    assert not marker.exists()  # the grandchild went with the group


def test_no_credential_reaches_a_command_and_the_callers_env_is_added(tmp_path: Path, secrets: None) -> None:
    run_tool(["env"], env={"HF_HUB_OFFLINE": "1"}, log=tmp_path / "env.log", timeout=60)
    done = run_captured(["env"], env={"HF_HUB_OFFLINE": "1"}, timeout=60)
    for text in ((tmp_path / "env.log").read_text(), done.stdout):
        _assert_no_secret(text)
        assert "HF_HUB_OFFLINE=1" in text and "FARM_PLAIN_SETTING=kept" in text and "PATH=" in text


def test_the_tensorrt_edgellm_model_probe_gets_no_credentials(tmp_path: Path, secrets: None) -> None:
    """The probe runs with the toolchain environment's interpreter: here a stand-in that records its environment
    and answers as the probe does."""
    from edgefarm.toolchains.tensorrt_edgellm.bringup import _probe

    seen = tmp_path / "seen-env"
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\ncat > /dev/null\nenv > {seen}\necho '{json.dumps({'stage': 'ok'})}'\n")
    python.chmod(0o755)
    facts = _probe(python.parents[1], tmp_path / "ckpt", "config", {})
    assert facts == {"stage": "ok"}
    text = seen.read_text()
    _assert_no_secret(text)
    assert "HF_HUB_OFFLINE=1" in text and "FARM_PLAIN_SETTING=kept" in text


def test_toolchains_start_host_processes_only_through_the_runner() -> None:
    """Where a toolchain module starts a process on this host: ``toolchains/process.py`` (the runner) only; the
    package installers' pip steps keep ``devices.lifetime.run`` (pip reaches a registry, through a proxy that may
    need its credentials)."""
    starters = {"Popen", "spawn", "run", "call", "check_call", "check_output", "wait4"}
    allowed = {"toolchains/process.py"}
    found = {}
    for path in sorted((REPO / "toolchains").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in starters
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in {"subprocess", "os"}):
                found.setdefault(rel, []).append(node.lineno)
            if (isinstance(node, ast.ImportFrom) and node.module == "edgefarm.devices.lifetime"
                    and any(a.name in {"spawn", "kill_group"} for a in node.names)):
                found.setdefault(rel, []).append(node.lineno)
    assert {rel: lines for rel, lines in found.items() if rel not in allowed} == {}


def test_an_environments_version_probe_gets_no_credentials(tmp_path: Path, secrets: None) -> None:
    """The installers ask an environment's interpreter its versions through the runner too."""
    from edgefarm.toolchains.venvs import distribution_version

    seen = tmp_path / "seen-env"
    python = tmp_path / "env" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\nenv > {seen}\necho '\"1.2.3\"'\n")
    python.chmod(0o755)
    assert distribution_version(python.parents[1], "some-dist") == "1.2.3"
    _assert_no_secret(seen.read_text())
