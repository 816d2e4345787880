"""Hostile values at the farm's doors (issue 24 item 11): toolchain install specs, device inventories and gc ages
are refused with one line naming the bad value and what is valid (exit 2), before anything reaches the
filesystem, a device or the store."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from toolchains.tensorrt_edgellm.env import check_version


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
