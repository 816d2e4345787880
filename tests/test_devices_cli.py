"""The inventory loader and ``edgefarm devices list/check`` against real sshd hosts and this machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.devices.inventory import load_inventory
from edgefarm.registries import current
from edgefarm.results.models import DeviceHealth
from edgefarm.toolchains.health import check_device
from edgellm.errors import ConfigurationError, ErrorKind
from tests.fixtures.sshd import SshHosts, free_port

WIDE = {"COLUMNS": "250"}


def _invoke(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={**WIDE, **(env or {})})
    return result.exit_code, result.stdout, result.stderr


def _write(directory: Path, name: str, data: dict[str, object] | str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else yaml.safe_dump(data)
    (directory / name).write_text(text)


def _broken_inventory(root: Path, hosts: SshHosts) -> Path:
    directory = root / "broken"
    good = {
        "type": "x86-cpu",
        "host": "127.0.0.1",
        "port": hosts[0].port,
        "user": hosts[0].user,
        "key_file": str(hosts.client_key),
        "host_key": hosts[0].host_key,
        "work_dir": "/tmp/w",
    }
    _write(directory, "fine.yaml", good)
    _write(directory, "jetson-1.yaml", {**good, "type": "jetson-orin"})
    _write(directory, "nokey.yaml", {**good, "key_file": "keys/absent"})
    _write(directory, "dup.yaml", good)
    _write(directory, "dup.yml", good)
    _write(directory, "badport.yaml", {**good, "port": 70000})
    _write(directory, "unpinned.yaml", {k: v for k, v in good.items() if k != "host_key"})
    _write(directory, "extra.yaml", {**good, "colour": "green"})
    _write(directory, "local-with-host.yaml", {"type": "x86-cpu", "transport": "local", "host": "x", "work_dir": "w"})
    return directory


def _expected_problems(directory: Path) -> list[str]:
    return [
        f"{directory / 'jetson-1.yaml'}: type: unknown device type 'jetson-orin'; valid: agx-orin-32gb, orin, "
        "orin-nano-8gb, "
        "orin-nx-16gb, thor",
        f"{directory / 'nokey.yaml'}: key_file: {directory / 'keys' / 'absent'} does not exist",
        f"{directory / 'dup.yml'}: duplicate device id 'dup' (also {directory / 'dup.yaml'})",
        f"{directory / 'badport.yaml'}: port: Input should be less than or equal to 65535 (got 70000)",
        f"{directory / 'unpinned.yaml'}: host_key: pin the host key",
        f"{directory / 'extra.yaml'}: unknown key 'colour'; valid keys: id, type, transport, host, port",
        f"{directory / 'local-with-host.yaml'}: host: only for transport ssh",
    ]


def test_broken_inventory_lists_every_problem_exit_2(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    directory = _broken_inventory(tmp_path, ssh_hosts)
    with pytest.raises(ConfigurationError) as caught:
        load_inventory(directory, data_dir=tmp_path / "data")
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 + len(_expected_problems(directory))
    for problem in _expected_problems(directory):
        assert any(line.startswith(problem) for line in lines), (problem, lines)
    for command in ("list", "check"):
        code, out, err = _invoke("devices", command, "--inventory", str(directory))
        assert code == 2 and out == ""
        for problem in _expected_problems(directory):
            assert problem in " ".join(err.split()), (problem, err)
        assert "Traceback" not in err


def test_missing_inventory_dir_exit_2(tmp_path: Path) -> None:
    code, _, err = _invoke("devices", "list", "--inventory", str(tmp_path / "nope"))
    assert code == 2 and "does not exist" in err
    (tmp_path / "empty").mkdir()
    code, _, err = _invoke("devices", "list", env={"EDGEFARM_INVENTORY": str(tmp_path / "empty")})
    assert code == 2 and "no devices" in err


def test_list_shows_every_device(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    directory = live_ssh_hosts.write_inventory(tmp_path / "inv", extra={"max_jobs": 2})
    _write(directory, "local-cpu.yaml", {"type": "x86-cpu", "transport": "local", "work_dir": str(tmp_path / "w")})
    code, out, err = _invoke("devices", "list", env={"EDGEFARM_INVENTORY": str(directory),
                                                     "EDGEFARM_DATA_DIR": str(tmp_path / "data"),
                                                     "EDGEFARM_DB_URL": None})
    assert code == 0, err
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert sorted(rows) == ["dev-a", "dev-b", "dev-c", "local-cpu"]
    for host in live_ssh_hosts:
        cells = [c.strip() for c in rows[host.id].split("│")[1:-1]]
        assert cells == [host.id, "x86-cpu", "ssh", f"127.0.0.1:{host.port}", f"test, {host.id}", "2",
                         "unknown (no results database)"]


def test_check_reports_healthy_and_unreachable(live_ssh_hosts: SshHosts, device_python, tmp_path: Path) -> None:
    # The device hosts' users cannot read this interpreter: they run /usr/bin/python3 with this venv's packages.
    extra = {"python": device_python.python, "env": device_python.env}
    directory = live_ssh_hosts.write_inventory(tmp_path / "inv", extra=extra)
    _write(directory, "local-cpu.yaml", {"type": "x86-cpu", "transport": "local", "work_dir": str(tmp_path / "w")})
    code, out, err = _invoke("devices", "check", "--inventory", str(directory), "--json")
    assert code == 0, out + err
    reports = {r["device_id"]: r for r in json.loads(out)}
    assert sorted(reports) == ["dev-a", "dev-b", "dev-c", "local-cpu"]
    for report in reports.values():
        assert report["healthy"] and report["reachable"] and report["problems"] == []
        assert report["edgellm_version"] == "0.1.0" and report["python_version"].startswith("3.")
        assert report["arch"] == "x86_64" and report["disk_free_gb"] > 0
    assert reports["local-cpu"]["python_version"] == ".".join(map(str, sys.version_info[:3]))

    live_ssh_hosts[1].kill()
    code, out, err = _invoke("devices", "check", "--inventory", str(directory))
    assert code == 1
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert "unreachable" in rows["dev-b"]
    assert all("healthy" in rows[d] and "unhealthy" not in rows[d] for d in ("dev-a", "dev-c", "local-cpu"))


def test_health_problems_are_named(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    host = live_ssh_hosts[0]
    directory = live_ssh_hosts.write_inventory(tmp_path / "inv", device_type="orin")
    device = load_inventory(directory, data_dir=tmp_path / "data").get(host.id)
    # no TensorRT Edge-LLM block, wrong arch, disk "full"
    report = check_device(device, current().device_type(device.type), min_free_gb=1e9)
    assert report.reachable and not report.healthy and report.error_kind is None
    assert any("no toolchain of type orin (tensorrt-edgellm) can run on it" in p for p in report.problems)
    assert any("architecture x86_64 but type orin is aarch64" in p for p in report.problems)
    assert any("GiB free in" in p for p in report.problems)
    live_ssh_hosts[0].kill()
    down = check_device(device, current().device_type(device.type))
    assert not down.reachable and down.error_kind is ErrorKind.INFRASTRUCTURE
    assert "unreachable" in down.problems[0]


def test_check_records_health_in_the_results_db(live_ssh_hosts: SshHosts, migrated_db_url: str, tmp_path: Path) -> None:
    directory = tmp_path / "inv"
    _write(directory, "local-cpu.yaml", {"type": "x86-cpu", "transport": "local", "work_dir": str(tmp_path / "w")})
    _write(
        directory,
        "dev-c.yaml",
        {
            "type": "x86-cpu",
            "host": "127.0.0.1",
            "port": free_port(),  # nobody listens: unreachable
            "user": live_ssh_hosts[2].user,
            "key_file": str(live_ssh_hosts.client_key),
            "host_key": live_ssh_hosts[2].host_key,
            "work_dir": "work",
        },
    )
    code, out, err = _invoke("devices", "check", "--inventory", str(directory), "--db", migrated_db_url)
    assert code == 1, out + err  # dev-c unreachable, and the reports are stored anyway
    engine = create_engine(migrated_db_url)
    with Session(engine) as session:
        rows = {row.device_id: row for row in session.scalars(select(DeviceHealth))}
    engine.dispose()
    assert sorted(rows) == ["dev-c", "local-cpu"]
    local, down = rows["local-cpu"], rows["dev-c"]
    assert local.reachable and local.edgellm_version == "0.1.0" and local.disk_free_bytes > 0
    assert local.python_version == ".".join(map(str, sys.version_info[:3]))
    assert local.details["healthy"] is True and local.details["platform"] == "x86-cpu"
    assert not down.reachable and down.details["error_kind"] == "infrastructure"
    assert "unreachable" in down.details["problems"][0]


def test_check_db_errors(tmp_path: Path, db_url: str) -> None:
    directory = tmp_path / "inv"
    _write(directory, "local-cpu.yaml", {"type": "x86-cpu", "transport": "local", "work_dir": str(tmp_path / "w")})
    code, out, err = _invoke("devices", "check", "--inventory", str(directory), "--db", "mysql://u:secret@h/db")
    assert code == 2 and out == "" and "secret" not in err  # refused before probing, password hidden
    code, out, err = _invoke("devices", "check", "--inventory", str(directory), "--db", db_url)  # no schema
    assert code == 2 and "edgefarm db upgrade" in " ".join(err.split()), err
    nobody = f"postgresql+psycopg://u:pw@127.0.0.1:{free_port()}/db"
    code, out, err = _invoke("devices", "check", "--inventory", str(directory), "--db", nobody)
    assert code == 3 and "cannot write to database" in err and "pw@" not in err


def test_a_bug_behind_devices_list_exits_4_like_every_command(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit codes follow the error kind (edgellm.errors): a bug is 4 here too, never 2 (bad input)."""
    import edgefarm.cli.devices as devices_cli
    from edgellm.errors import BugError

    def broken(*args: object, **kwargs: object) -> object:
        raise BugError("an invariant broke while reading quarantines")

    monkeypatch.setattr(devices_cli, "quarantined", broken)
    code, _, err = _invoke("devices", "list", env={"EDGEFARM_DATA_DIR": str(tmp_path)})
    assert code == ErrorKind.BUG.exit_code == 4, err
    assert "an invariant broke" in err


def test_exit_codes_and_error_kinds_map_both_ways() -> None:
    assert {k: k.exit_code for k in ErrorKind} == {ErrorKind.TEST_FAILURE: 1, ErrorKind.CONFIGURATION: 2,
                                                   ErrorKind.INFRASTRUCTURE: 3, ErrorKind.BUG: 4,
                                                   ErrorKind.RESOURCE: 5}
    assert [ErrorKind.from_exit_code(c) for c in range(7)] == [None, ErrorKind.TEST_FAILURE, ErrorKind.CONFIGURATION,
                                                                ErrorKind.INFRASTRUCTURE, ErrorKind.BUG,
                                                                ErrorKind.RESOURCE, ErrorKind.BUG]
    # by edgellm's own convention a command not found breaks the stage's contract; a toolchain whose tools are not
    # ours says otherwise in its driver (classify_exit: a missing tool is the device's configuration)
    assert ErrorKind.from_exit_code(127) is ErrorKind.BUG
