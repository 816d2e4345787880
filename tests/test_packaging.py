"""What installing the project puts into site-packages: two names, ``edgellm`` (the library) and ``edgefarm`` (the
farm, every repository folder of it as ``edgefarm.<folder>``), with the data files the farm reads; and an installed
farm runs from there, away from any checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FARM_FOLDERS = sorted(p.name for p in (ROOT / "edgefarm").iterdir() if p.is_symlink())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(build), "TMPDIR": str(build)}, cwd=build)
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = out.glob("*.whl")
    return found


def test_the_wheel_installs_two_top_level_names_with_the_farms_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"edgellm", "edgefarm"}
    assert set(FARM_FOLDERS) >= {"flows", "tasks", "results", "artifacts", "devices", "stages", "toolchains"}
    for folder in FARM_FOLDERS:
        assert f"edgefarm/{folder}/__init__.py" in names, folder
    for data in ("edgefarm/devices/types/orin-nano-8gb.yaml", "edgefarm/results/migrations/script.py.mako",
                 "edgefarm/results/migrations/env.py", "edgefarm/test_lists/l0_pipeline_orin.yml",
                 "edgellm/assets/calibration/tinystories-calib.jsonl"):
        assert data in names, data
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry).decode()
    assert "edgefarm = edgefarm.cli:main" in scripts and "edgellm = edgellm.cli:main" in scripts


def test_an_installed_farm_runs_away_from_the_checkout(wheel: Path, tmp_path: Path) -> None:
    """Installed into a directory of its own and run from elsewhere: the farm's modules and files load from there
    (none from the checkout), the command answers, and the database migrations (found by package name) apply."""
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    away = tmp_path / "elsewhere"
    away.mkdir()
    code = ("import sys, edgefarm.flows.nightly, edgefarm.cli, edgellm\n"
            "from edgefarm.results.db import make_engine\n"
            "from edgefarm.results.migrate import upgrade\n"
            "from edgefarm.registries import current\n"
            "upgrade(make_engine('sqlite:///' + sys.argv[1]))\n"
            "print(len(current().device_types))\n"
            "print('\\n'.join(sorted({getattr(m, '__file__', None) or '' for m in list(sys.modules.values())})))\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(target), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "farm.db")], capture_output=True, text=True,
                         timeout=600, env=env, cwd=away)
    assert run.returncode == 0, run.stderr[-3000:]
    count, *files = run.stdout.splitlines()
    assert int(count) == len(list((ROOT / "devices" / "types").glob("*.yaml")))
    ours = [f for f in files if "/edgefarm/" in f or "/edgellm/" in f]
    assert ours and all(f.startswith(str(target)) for f in ours), [f for f in ours if not f.startswith(str(target))]
    assert not any(m in files for m in (str(ROOT / "flows" / "nightly.py"),))
    version = subprocess.run([sys.executable, "-m", "edgefarm.cli", "--version"], capture_output=True, text=True,
                             timeout=300, env=env, cwd=away)
    assert version.returncode == 0 and version.stdout.startswith("edgefarm "), version.stderr[-2000:]
