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


def test_build_id_follows_the_source(tmp_path, monkeypatch) -> None:
    import shutil

    from edgellm import build_id as mod

    copy = tmp_path / "edgellm"
    shutil.copytree(mod.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("assets", "__pycache__"))
    monkeypatch.setattr(mod, "PACKAGE_DIR", copy)
    mod.build_id.cache_clear()
    before = mod.build_id()
    assert before == mod.build_id()
    (copy / "compiler" / "export.py").write_text((copy / "compiler" / "export.py").read_text() + "\n# changed\n")
    mod.build_id.cache_clear()
    assert mod.build_id() != before  # a changed exporter never reuses the old exports
    mod.build_id.cache_clear()
