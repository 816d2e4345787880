from __future__ import annotations

import json

import onnxruntime

from edgellm import __version__
from edgellm.cli import main


def test_env_reports_versions_and_backends(capsys, tmp_path) -> None:
    out = tmp_path / "env.json"
    assert main(["env", "--output", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["edgellm"] == __version__
    assert printed["packages"]["onnxruntime"] == onnxruntime.__version__
    assert "ort" in printed["backends"]
