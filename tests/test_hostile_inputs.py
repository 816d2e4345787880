"""Hostile values at the farm's doors (issue 24 item 11): toolchain install specs, device inventories and gc ages
are refused with one line naming the bad value and what is valid (exit 2), before anything reaches the
filesystem, a device or the store."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from edgefarm.artifacts.store import ArtifactStore
from edgefarm.cli import app
from edgefarm.devices.inventory import load_inventory
from edgefarm.toolchains.tensorrt_edgellm.env import check_version
from edgellm.errors import ConfigurationError


@pytest.mark.parametrize(("spec", "named"), [
    ("tensorrt-edgellm==0.11.0\n", r"'0.11.0\n'"),  # passed a $-anchored pattern
    ("tensorrt-edgellm==" + "9" * 300, "(300 characters)"),  # reached the filesystem as a directory name
    ("tensorrt-edgellm==0.11.0 ", "'0.11.0 '"),
    ("tensorrt-edgellm==\u0660.\u0661\u0661.\u0660", "'\u0660.\u0661\u0661.\u0660'"),  # digits, not ASCII ones
    ("tensorrt-edgellm==0.11.0/../../x", "'0.11.0/../../x'"),
    ("tensorrt-edgellm==>=0.11", "'>=0.11'"),
    (" tensorrt-edgellm==0.11.0", "unknown toolchain ' tensorrt-edgellm'"),
    ("TENSORRT-EDGELLM==0.11.0", "unknown toolchain 'TENSORRT-EDGELLM'"),
    ("tensorrt-edgellm\n==0.11.0", r"unknown toolchain 'tensorrt-edgellm\n'"),
])
def test_toolchain_install_refuses_a_bad_spec_naming_it(spec: str, named: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # should a spec get through, it downloads nothing
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    result = CliRunner().invoke(app, ["toolchains", "install", spec, "--data-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert named in line, line
    assert "0.11.0" in line and ("installable: tensorrt-edgellm" in line or "expected an exact version" in line)
    assert not (tmp_path / "toolchains").exists()  # nothing made for it


def test_install_versions_are_exact_bounded_pep440_ones() -> None:
    for good in ("0.11.0", "0.12.0", "0.11.0rc1", "0.11.0.post1", "0.11.0.dev2", "0.11.0+relabel", "1"):
        assert check_version(good) == good
    for bad in ("0.11.0\n", "1" * 300, "1234567.0", "01.2", "0.11.0+", "0.11.0+" + "a" * 60, "", "0.11.*"):
        with pytest.raises(Exception, match="bad tensorrt-edgellm version"):
            check_version(bad)


def _ssh_key() -> str:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


def _inventory(tmp_path: Path, devices: dict[str, dict[str, object]]) -> Path:
    directory = tmp_path / "inventory"
    directory.mkdir()
    (directory / "id_ed25519").write_text("a key file\n")
    key = _ssh_key()
    for name, fields in devices.items():
        base: dict[str, object] = ({"type": "x86-cpu", "transport": "local"} if fields.get("transport") == "local"
                                   else {"type": "orin", "host": "board.lab", "user": "farm", "key_file": "id_ed25519",
                                         "host_key": key, "work_dir": "edgefarm"})
        (directory / f"{name}.yaml").write_text(yaml.safe_dump({**base, **fields}))
    return directory


HOSTILE_DEVICES = {
    "root-local": ({"transport": "local", "work_dir": "/"}, "work_dir: '/' is / itself"),
    "up-local": ({"transport": "local", "work_dir": "../../.."}, "work_dir: '../../..' goes up through '..'"),
    "dot-local": ({"transport": "local", "work_dir": "."}, "work_dir: '.' is the farm's data dir itself"),
    "root-ssh": ({"work_dir": "//"}, "work_dir: '//' is / itself"),
    "up-ssh": ({"work_dir": "/srv/farm/../../.."}, "work_dir: '/srv/farm/../../..' goes up through '..'"),
    "newline-ssh": ({"work_dir": "farm\nrm"}, r"work_dir: 'farm\nrm' has control characters"),
    "option-host": ({"host": "-oProxyCommand=sh -c reboot"}, "host: '-oProxyCommand=sh -c reboot' is not a host"),
    "spaced-host": ({"host": "board.lab extra"}, "host: 'board.lab extra' is not a host"),
    "option-user": ({"user": "-lroot"}, "user: '-lroot' is not a user name"),
}


def test_inventory_refuses_hostile_work_dirs_hosts_and_users_listing_each(tmp_path: Path) -> None:
    directory = _inventory(tmp_path, {name: fields for name, (fields, _) in HOSTILE_DEVICES.items()})
    with pytest.raises(ConfigurationError) as caught:
        load_inventory(directory, data_dir=tmp_path / "data")
    lines = str(caught.value).splitlines()[1:]
    for name, (_, expected) in HOSTILE_DEVICES.items():
        mine = [ln for ln in lines if ln.startswith(f"{directory / name}.yaml: ")]
        assert len(mine) == 1 and expected in mine[0], (name, mine)
        assert "valid" in mine[0] or "use" in mine[0] or "give it" in mine[0] or "never" in mine[0]
    result = CliRunner().invoke(app, ["devices", "list", "--inventory", str(directory)],
                                env={"EDGEFARM_DATA_DIR": str(tmp_path / "data")})
    assert result.exit_code == 2 and "'-oProxyCommand=sh -c reboot' is not a host" in result.output, result.output
    assert not (tmp_path / "data").exists()  # nothing was made for any of them


def test_inventory_keeps_accepting_ordinary_devices(tmp_path: Path) -> None:
    directory = _inventory(tmp_path, {
        "cpu": {"transport": "local", "work_dir": "devices/cpu"},
        "board": {"host": "192.168.55.1", "user": "nvidia", "work_dir": "/home/nvidia/edgefarm"},
        "v6": {"host": "fe80::1%eth0", "user": "jetson_1", "work_dir": "edgefarm"},
    })
    assert sorted(load_inventory(directory, data_dir=tmp_path / "data").devices) == ["board", "cpu", "v6"]


@pytest.mark.parametrize("age", ["nan", "inf", "-inf", "-1", "1e308", "NaN"])
def test_gc_refuses_an_age_that_is_no_number_of_days(age: str, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'edgefarm.db'}"
    assert CliRunner().invoke(app, ["db", "upgrade", "--db", db]).exit_code == 0
    store = ArtifactStore(tmp_path / "data" / "artifacts")
    blob = store.put(b"unreferenced")
    store.close()
    result = CliRunner().invoke(app, ["gc", "--older-than-days", age, "--db", db, "--data-dir", str(tmp_path / "data")])
    line = " ".join(result.output.split())
    assert result.exit_code == 2, line
    assert f"bad --older-than-days {float(age)!r}" in line and "from 0 to 36500" in line
    assert store.has(blob.sha256)  # nothing collected
