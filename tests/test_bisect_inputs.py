"""``edgefarm bisect`` of the inputs besides the farm's commits: a toolchain's versions and a checkpoint's revisions.

Toolchain versions: a tiny fake toolchain (``fake-chain``, a driver registered for the test) published as five
versions in a local wheelhouse written here (0.1.0, 0.2.0, 0.3.0, 0.4.0, 0.10.0: PEP 440 order, not the strings'),
the regression planted in 0.3.0 (its export raises, and the versions after it keep the fault). Pip reads only that
wheelhouse (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``): each probed version is installed for real into its own venv under
``<data dir>/toolchains/`` by the farm's shared mechanism (toolchains/venvs.py), nothing is downloaded.

Checkpoint revisions: a checkpoint as a git repository whose planted commit sets a weight to NaN; each probe checks
its commit out as a worktree and runs the farm's code on it. Fast: a stand-in ``edgellm`` (a git repository of its
own, given as ``--repo``) whose eval refuses non-finite weights. Slow (marked): the bundled 8-layer Llama
(stories260K) as the repository, the farm's real ``edgellm export -> build -> eval`` on each revision.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.toolchains import base as toolchains
from edgefarm.toolchains import venvs
from edgellm.errors import TestFailure
from edgellm.types import Precision
from tests.helpers.registries import registries_with
from tests.helpers.toy_toolchain import ToyEcho, ToyEnvironment

pytestmark = pytest.mark.usefixtures("prefect_harness")

FAKE = "fake-chain"
VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.10.0")
PLANTED = "0.3.0"
BROKEN = {"0.3.0", "0.4.0", "0.10.0"}
MAIN = '''"""fake-chain {version}: ``python -m fake_chain export CKPT OUT`` copies the checkpoint's config."""
import sys
from pathlib import Path

cmd, ckpt, out = sys.argv[1:4]
if {broken}:
    raise RuntimeError("fake-chain {version}: export lost the config")
Path(out).mkdir(parents=True)
(Path(out) / "model.json").write_text((Path(ckpt) / "config.json").read_text())
'''


def _wheel(house: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A pure-Python wheel (PEP 427) written by hand: the files, METADATA, WHEEL and a RECORD of their hashes."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    files = {**files, f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    path = house / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(text.encode())}")
        z.writestr(f"{dist}/RECORD", "\n".join([*record, f"{dist}/RECORD,,"]) + "\n")
    return path


class FakeEnvironment(ToyEnvironment):
    """An environment per version: its package is ``fake-chain`` from pip's index; a version's probe is its export
    run from its environment."""

    def installable_versions(self) -> list[str]:
        return venvs.installable_versions(FAKE)

    def install_version(self, version: str, wheels: Any = None) -> toolchains.Environment:
        assert self.toolchain.data_dir is not None
        built = venvs.install_distribution(self.toolchain.data_dir / "toolchains", FAKE, version,
                                           [f"{FAKE}=={version}"], wheels=wheels)
        return toolchains.Environment(FAKE, built.version, built.healthy, str(built.path))

    def probe_version(self, env: toolchains.Environment, checkpoint: Path, work: Path, precision: Precision) -> None:
        done = subprocess.run([str(Path(env.path) / "bin" / "python"), "-m", "fake_chain", "export",
                               str(checkpoint), str(work / "out")], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise TestFailure(f"{FAKE} export failed (exit {done.returncode}): {last}")


class FakeChain(ToyEcho):
    """A toolchain with an environment per version (:class:`FakeEnvironment`)."""

    name = FAKE
    pinned = VERSIONS[0]
    ENVIRONMENT = FakeEnvironment

    def precisions(self) -> tuple[Precision, ...]:
        return (Precision.FP32,)

    def quantizes(self) -> tuple[Precision, ...]:
        return ()


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    house = tmp_path_factory.mktemp("wheelhouse")
    for v in VERSIONS:
        _wheel(house, FAKE, v, {"fake_chain/__init__.py": f"VERSION = {v!r}\n",
                                "fake_chain/__main__.py": MAIN.format(version=v, broken=v in BROKEN)})
    return house


@pytest.fixture
def fake_chain(wheelhouse: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``fake-chain`` registered; pip reads the wheelhouse only."""
    import os

    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheelhouse))
    with registries_with(toolchains=[FakeChain]):
        yield FAKE


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir for the module: its version environments are installed once and reused."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ckpt = tmp_path_factory.mktemp("small")
    (ckpt / "config.json").write_text('{"model_type": "llama"}')
    return ckpt


def _run(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["bisect", *args])
    return result.exit_code, result.output


def _versions(ckpt: Path, data: Path, out: Path, good: str, bad: str, *extra: str) -> list[str]:
    return ["--checkpoint", str(ckpt), "--precision", "fp32", "--toolchain", FAKE, "--good-version", good,
            "--bad-version", bad, "--data-dir", str(data), "--output", str(out), *extra]


def test_the_versions_pip_can_install_are_listed_in_pep440_order(fake_chain: str) -> None:
    assert venvs.installable_versions(FAKE) == list(VERSIONS)
    assert venvs.between(list(VERSIONS), "0.10.0", "0.2.0", toolchain=FAKE) == ["0.10.0", "0.4.0", "0.3.0", "0.2.0"]


def test_a_toolchain_version_bisection_names_the_planted_version(fake_chain: str, small_ckpt: Path, data_dir: Path,
                                                                 tmp_path: Path) -> None:
    from edgefarm.results.bisections import bisections_of_checkpoint
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = make_engine(url)
    upgrade(engine)
    out = tmp_path / "versions.json"
    code, output = _run(_versions(small_ckpt, data_dir, out, VERSIONS[0], VERSIONS[-1], "--no-cache", "--db", url))
    assert code == 0, output
    answer = json.loads(out.read_text())
    assert (answer["input"], answer["toolchain"], answer["found"]) == ("toolchain", FAKE, True)
    assert (answer["first_bad"], answer["last_good"]) == (PLANTED, "0.2.0")
    assert answer["versions"] == list(VERSIONS)
    assert f"first bad: {FAKE} {PLANTED} (last good 0.2.0)" in output
    probes = answer["probes"]
    assert [p["revision"] for p in probes[:2]] == [VERSIONS[0], VERSIONS[-1]]  # the ends first
    assert len(probes) <= 2 + 2  # 3 versions between: at most 2 halvings
    for p in probes:
        assert p["status"] == ("bad" if p["revision"] in BROKEN else "good"), p
        assert p["task_run"] == f"probe {FAKE} {p['revision']}" and p["seconds"] > 0
        if p["status"] == "bad":
            assert p["step"] == "stages" and "export lost the config" in p["detail"]
    envs = sorted(p.name for p in (data_dir / "toolchains").iterdir())
    assert envs == sorted(f"{FAKE}-{p['revision']}" for p in probes)  # one environment per probed version
    [rec] = bisections_of_checkpoint(engine, answer["checkpoint_sha256"])
    engine.dispose()
    assert (rec.bisected, rec.toolchain, rec.first_bad, rec.last_good, rec.good_ref) == (
        "toolchain", FAKE, PLANTED, "0.2.0", VERSIONS[0])
    assert rec.line() == f"first bad: {FAKE} {PLANTED} (last good 0.2.0)"


def test_a_second_version_bisection_reuses_the_outcomes(fake_chain: str, small_ckpt: Path, data_dir: Path,
                                                       tmp_path: Path) -> None:
    first_out, second_out = tmp_path / "1.json", tmp_path / "2.json"
    assert _run(_versions(small_ckpt, data_dir, first_out, "0.2.0", "0.4.0"))[0] == 0
    assert _run(_versions(small_ckpt, data_dir, second_out, "0.2.0", "0.4.0"))[0] == 0
    second = json.loads(second_out.read_text())
    assert second["first_bad"] == PLANTED and all(p["cached"] for p in second["probes"])


def test_a_version_that_does_not_change_the_outcome_is_exit_1(fake_chain: str, small_ckpt: Path, data_dir: Path,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    code, output = _run(_versions(small_ckpt, data_dir, out, "0.4.0", "0.10.0", "--no-cache"))
    assert code == 1, output
    assert f"no probe changes the outcome: {FAKE} 0.4.0 is bad, 0.10.0 is bad" in output


@pytest.mark.parametrize(("good", "bad", "needle"), [
    ("0.1.0", "9.9.9", f"--bad-version '9.9.9': not an installable version of {FAKE}; valid: 0.1.0, 0.2.0"),
    ("0.0.1", "0.3.0", "--good-version '0.0.1': not an installable version"),
    ("0.2.0", "0.2.0", "--good-version and --bad-version are both '0.2.0'"),
])
def test_an_unknown_version_is_exit_2_naming_it(fake_chain: str, small_ckpt: Path, tmp_path: Path, good: str,
                                                bad: str, needle: str) -> None:
    code, output = _run(_versions(small_ckpt, tmp_path / "d", tmp_path / "o.json", good, bad))
    assert code == 2, output
    assert needle in " ".join(output.split())
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "d" / "toolchains").exists()


def test_a_toolchain_without_environments_or_unknown_is_exit_2(small_ckpt: Path, tmp_path: Path) -> None:
    args = ["--checkpoint", str(small_ckpt), "--precision", "fp32", "--good-version", "1", "--bad-version", "2",
            "--data-dir", str(tmp_path / "d"), "--output", str(tmp_path / "o.json")]
    code, output = _run([*args, "--toolchain", "edgellm-ort"])
    assert code == 2 and "--toolchain edgellm-ort: its versions cannot be bisected" in " ".join(output.split())
    assert "tensorrt-edgellm" in output  # the toolchains whose versions can
    code, output = _run([*args, "--toolchain", "tensorrt-edgelm"])
    assert code == 2 and "unknown --toolchain 'tensorrt-edgelm'" in output
    code, output = _run([*args[:4], "--toolchain", "tensorrt-edgellm", "--good-version", "1",
                         "--output", str(tmp_path / "o.json")])
    assert code == 2 and "--bad-version missing" in output


def test_tensorrt_edgellm_probes_its_quantize_then_its_export_from_the_version_s_environment(
        monkeypatch: pytest.MonkeyPatch, small_ckpt: Path, tmp_path: Path) -> None:
    """Its probe of a version is its host stages, from that version's environment: quantize for a precision its
    quantizer makes (the export then reads the quantized checkpoint), the export alone for fp16."""
    from edgefarm.toolchains.tensorrt_edgellm import export, quantize

    calls: list[tuple[str, Path, Path]] = []

    def fake_quantize(env: Path, checkpoint: Path, out_dir: Path, method: str, **kw: Any) -> Any:
        calls.append((f"quantize {method}", env, checkpoint))
        return type("Q", (), {"checkpoint": out_dir / "checkpoint"})()

    def fake_export(env: Path, checkpoint: Path, out_dir: Path, **kw: Any) -> None:
        calls.append(("export", env, checkpoint))

    monkeypatch.setattr(quantize, "quantize", fake_quantize)
    monkeypatch.setattr(export, "export", fake_export)
    trt = toolchains.driver("tensorrt-edgellm", tmp_path)
    env = toolchains.Environment("tensorrt-edgellm", "0.10.0", True, str(tmp_path / "env"))
    trt.environment.probe_version(env, small_ckpt, tmp_path / "w1", Precision.INT4_AWQ)
    trt.environment.probe_version(env, small_ckpt, tmp_path / "w2", Precision.FP16)
    assert calls == [("quantize int4_awq", tmp_path / "env", small_ckpt),
                     ("export", tmp_path / "env", tmp_path / "w1" / "quantize" / "checkpoint"),
                     ("export", tmp_path / "env", small_ckpt)]
    assert "tensorrt-edgellm" in toolchains.version_probing()


def test_row_form_bisects_a_changed_toolchain_version(fake_chain: str, small_ckpt: Path, data_dir: Path,
                                                      tmp_path: Path) -> None:
    """Two runs of one farm revision whose row ran fake-chain 0.1.0, then 0.10.0: only the versions are bisected,
    the answer recorded for the row and said on the bad run's page."""
    from edgefarm.pages.docs import write_run_pages
    from edgefarm.results.bisections import bisections_of_run
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgefarm.results.recorder import Recorder
    from edgellm.reference import checkpoint_digest

    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    for version, status in ((VERSIONS[0], "pass"), (VERSIONS[-1], "fail")):
        run = rec.start_run("nightly", "schedule", "a" * 12)
        rec.record_worker(run, role="orchestrator", pool=None, host="h", data_dir="/d", revision="a" * 40,
                          source_digest="b" * 64, toolchains={FAKE: version})
        for stage in ("export", "build"):
            rec.record_result(run, model="tiny", precision="fp32", platform="x86-cpu", stage=stage,
                              test_id="tiny-fp32", status=status if stage == "export" else "pass", toolchain=FAKE,
                              toolchain_version=version, model_revision=checkpoint_digest(small_ckpt))
        rec.finish_run(run, "passed" if status == "pass" else "failed")
    out = tmp_path / "row.json"
    code, output = _run(["--row", "tiny", "fp32", "x86-cpu", "--good", "1", "--bad", "2", "--checkpoint",
                         str(small_ckpt), "--db", url, "--data-dir", str(data_dir), "--output", str(out)])
    assert code == 0, output
    answer = json.loads(out.read_text())
    assert answer["changed"] == {f"toolchain:{FAKE}": [VERSIONS[0], VERSIONS[-1]]}
    assert answer["not_bisected"] == {"revision": "the farm's revision is the same in runs 1 and 2"}
    assert (answer["input"], answer["first_bad"]) == ("toolchain", PLANTED)
    got = bisections_of_run(engine, 2)[("tiny", "fp32", "x86-cpu")]
    assert (got.bisected, got.toolchain, got.good_ref, got.bad_ref) == ("toolchain", FAKE, "1", "2")
    assert write_run_pages(engine, tmp_path / "docs", [2], None) == [2]
    engine.dispose()
    assert f"Bisected: first bad: {FAKE} {PLANTED} (last good 0.2.0)." in (
        tmp_path / "docs" / "runs" / "run-2.md").read_text()


GENAI_VERSIONS = ("0.16.0", "0.17.0", "0.17.1", "0.18.0")
GENAI_PLANTED = "0.17.1"
GENAI_BUILDER = '''"""STAND-IN for onnxruntime-genai {version}'s builder (test only): the files an export checks."""
import argparse
import json
from pathlib import Path

import numpy  # the farm's, from underneath this environment

config = argparse.Namespace(architectures=["LlamaForCausalLM"])
if config.architectures[0] == "LlamaForCausalLM":  # the dispatch the farm reads the supported architectures from
    pass
parser = argparse.ArgumentParser()
for flag in ("-i", "-o", "-p", "-e", "-c"):
    parser.add_argument(flag)
args, _ = parser.parse_known_args()
if {broken}:
    raise SystemExit("onnxruntime-genai {version}: the builder dropped the rotary embedding")
Path(args.o).mkdir(parents=True)
(Path(args.o) / "genai_config.json").write_text(json.dumps({{"model": {{"type": "llama"}}}}))
(Path(args.o) / "model.onnx").write_bytes(numpy.zeros(4, numpy.uint8).tobytes())
'''


@pytest.fixture
def genai_wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """STAND-IN releases of onnxruntime-genai (its builder only), the regression planted in 0.17.1; pip reads only
    their wheelhouse."""
    import os

    house = tmp_path / "genai-wheels"
    house.mkdir()
    for v in GENAI_VERSIONS:
        broken = v >= GENAI_PLANTED  # string order is PEP 440 order for these four
        _wheel(house, "onnxruntime-genai", v, {"onnxruntime_genai/__init__.py": "",
                                               "onnxruntime_genai/models/__init__.py": "",
                                               "onnxruntime_genai/models/builder.py":
                                                   GENAI_BUILDER.format(version=v, broken=broken)})
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(house))
    return house


def test_onnxruntime_genai_versions_are_bisected_in_environments_over_the_farm_s(genai_wheels: Path,
                                                                                   tmp_path: Path) -> None:
    ckpt = tmp_path / "llama"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                  "hidden_size": 64, "num_attention_heads": 4}))
    out = tmp_path / "genai.json"
    code, output = _run(["--checkpoint", str(ckpt), "--precision", "fp32", "--toolchain", "onnxruntime-genai",
                         "--good-version", GENAI_VERSIONS[0], "--bad-version", GENAI_VERSIONS[-1], "--data-dir",
                         str(tmp_path / "d"), "--output", str(out), "--no-cache"])
    assert code == 0, output
    answer = json.loads(out.read_text())
    assert (answer["first_bad"], answer["last_good"]) == (GENAI_PLANTED, "0.17.0")
    assert "first bad: onnxruntime-genai 0.17.1 (last good 0.17.0)" in output
    bad = [p for p in answer["probes"] if p["status"] == "bad"]
    assert bad and all("dropped the rotary embedding" in p["detail"] for p in bad)
    from edgefarm.toolchains.base import driver

    envs = driver("onnxruntime-genai", tmp_path / "d").environment.environments()
    assert {e.version for e in envs} == {p["revision"] for p in answer["probes"]} and all(e.healthy for e in envs)


# --- checkpoint revisions -------------------------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _init(repo: Path) -> None:
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "t")


STAND_IN = '''"""A stand-in edgellm: export and build copy the config; eval refuses non-finite weights."""
import sys
from pathlib import Path

cmd, args = sys.argv[1], sys.argv[2:]
if cmd in ("export", "build"):
    Path(args[1]).mkdir(parents=True)
    (Path(args[1]) / "config.json").write_text((Path(args[0]) / "config.json").read_text())
elif cmd == "eval":
    import numpy as np
    from safetensors.numpy import load_file

    ckpt = Path(args[args.index("--checkpoint") + 1])
    bad = sorted(k for k, v in load_file(str(ckpt / "model.safetensors")).items() if not np.isfinite(v).all())
    if bad:
        sys.exit(f"non-finite weights: {', '.join(bad)}")
'''


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The stand-in edgellm (one commit) and a checkpoint repository of six commits, the fourth planting NaN in
    layer 1's down projection (the ones after keep it)."""
    import numpy as np
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("stand-in")
    code = root / "farm"
    (code / "edgellm").mkdir(parents=True)
    _init(code)
    (code / "edgellm" / "__init__.py").write_text("")
    (code / "edgellm" / "__main__.py").write_text(STAND_IN)
    _commit(code, "stand-in edgellm")
    repo = root / "tiny-llama"
    repo.mkdir()
    _init(repo)
    (repo / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 2}')
    weights = {f"model.layers.{i}.mlp.down_proj.weight": np.full((4, 4), 0.5, np.float32) for i in range(2)}
    shas = []
    for i in range(6):
        if i == 3:
            weights["model.layers.1.mlp.down_proj.weight"][0, 0] = np.nan
        save_file(weights, str(repo / "model.safetensors"))
        (repo / "README.md").write_text(f"revision {i}\n")
        shas.append(_commit(repo, "re-export the weights" if i == 3 else f"model card {i}"))
    return {"code": code, "repo": repo, "shas": shas, "planted": 3}


def test_a_checkpoint_revision_bisection_names_the_commit_that_corrupts_a_weight(stand_in: dict[str, Any],
                                                                                 tmp_path: Path) -> None:
    from edgefarm.results.bisections import bisections_of_checkpoint
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade

    shas, planted = stand_in["shas"], stand_in["planted"]
    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = make_engine(url)
    upgrade(engine)
    out = tmp_path / "ckpt.json"
    code, output = _run(["--checkpoint", str(stand_in["repo"]), "--precision", "fp32", "--checkpoint-good-rev",
                         shas[0][:7], "--checkpoint-bad-rev", "HEAD", "--repo", str(stand_in["code"]), "--data-dir",
                         str(tmp_path / "d"), "--output", str(out), "--no-cache", "--db", url])
    assert code == 0, output
    answer = json.loads(out.read_text())
    assert (answer["input"], answer["first_bad"], answer["last_good"]) == ("checkpoint", shas[planted],
                                                                           shas[planted - 1])
    assert f"first bad: checkpoint revision {shas[planted][:7]} re-export the weights" in output
    assert answer["code"] == str(stand_in["code"]) and answer["repo"] == str(stand_in["repo"])
    probes = answer["probes"]
    assert [p["revision"] for p in probes[:2]] == [shas[0], shas[-1]] and len(probes) <= 2 + 3
    for p in probes:
        bad = shas.index(p["revision"]) >= planted
        assert p["status"] == ("bad" if bad else "good"), p
        assert p["task_run"] == f"probe checkpoint {p['revision'][:7]} {p['subject']}"
        if bad:
            assert p["step"] == "eval" and "model.layers.1.mlp.down_proj.weight" in p["detail"]
    assert _git(stand_in["repo"], "worktree", "list").count("\n") == 0  # every probe's worktree removed
    [rec] = bisections_of_checkpoint(engine, answer["checkpoint_sha256"])
    engine.dispose()
    assert (rec.bisected, rec.first_bad, rec.good_ref, rec.bad_ref) == ("checkpoint", shas[planted], shas[0][:7],
                                                                       "HEAD")
    assert rec.line() == f"first bad: checkpoint revision {shas[planted][:12]} re-export the weights"


def test_row_form_bisects_each_input_that_changed(fake_chain: str, stand_in: dict[str, Any], data_dir: Path,
                                                  tmp_path: Path) -> None:
    """Between two runs of a row the farm's revision and fake-chain's version both changed: each is bisected (the
    farm's commits with the stand-in edgellm, whose third commit breaks its export; the versions as above), both
    answers recorded for the row and said together on the bad run's page."""
    import numpy as np
    from safetensors.numpy import save_file

    from edgefarm.pages.docs import write_run_pages
    from edgefarm.results.bisections import bisection_lines_of_run
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgefarm.results.recorder import Recorder
    from edgellm.reference import checkpoint_digest

    farm = tmp_path / "farm"
    shutil.copytree(stand_in["code"], farm)
    shas = [_git(farm, "rev-parse", "HEAD")]
    main = farm / "edgellm" / "__main__.py"
    for i in range(1, 4):
        if i == 2:
            main.write_text(main.read_text().replace('if cmd in ("export", "build"):',
                                                     'if cmd == "export":\n    sys.exit("export lost the config")\n'
                                                     'if cmd in ("export", "build"):'))
        (farm / "notes.txt").write_text(f"change {i}\n")
        shas.append(_commit(farm, "export: one path for every family" if i == 2 else f"change {i}"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text('{"model_type": "llama"}')
    save_file({"w": np.ones((2, 2), np.float32)}, str(ckpt / "model.safetensors"))
    url = f"sqlite:///{tmp_path / 'results.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    for revision, version, status in ((shas[0], VERSIONS[0], "pass"), (shas[-1], VERSIONS[-1], "fail")):
        run = rec.start_run("nightly", "schedule", revision[:12])
        rec.record_worker(run, role="orchestrator", pool=None, host="h", data_dir="/d", revision=revision,
                          source_digest=revision + "0" * 24, toolchains={FAKE: version})
        rec.record_result(run, model="tiny", precision="fp32", platform="x86-cpu", stage="export",
                          test_id="tiny-fp32", status=status, toolchain=FAKE, toolchain_version=version,
                          model_revision=checkpoint_digest(ckpt))
        rec.finish_run(run, "passed" if status == "pass" else "failed")
    out = tmp_path / "row.json"
    code, output = _run(["--row", "tiny", "fp32", "x86-cpu", "--good", "1", "--bad", "2", "--checkpoint", str(ckpt),
                         "--repo", str(farm), "--db", url, "--data-dir", str(data_dir), "--output", str(out),
                         "--no-cache"])
    assert code == 0, output
    answer = json.loads(out.read_text())
    assert set(answer["changed"]) == {"revision", f"toolchain:{FAKE}"} and answer["found"]
    [farm_answer, version_answer] = answer["bisections"]
    assert (farm_answer["input"], farm_answer["first_bad"]) == ("revision", shas[2])
    assert (version_answer["input"], version_answer["first_bad"]) == ("toolchain", PLANTED)
    assert f"first bad: {shas[2][:7]} export: one path for every family" in output
    assert f"first bad: {FAKE} {PLANTED} (last good 0.2.0)" in output
    both = (f"first bad: {shas[2][:12]} export: one path for every family; first bad: {FAKE} {PLANTED} (last good "
            f"0.2.0)")
    assert bisection_lines_of_run(engine, 2) == {("tiny", "fp32", "x86-cpu"): both}
    assert write_run_pages(engine, tmp_path / "docs", [2], None) == [2]
    engine.dispose()
    assert f"Bisected: {both}." in (tmp_path / "docs" / "runs" / "run-2.md").read_text()


@pytest.mark.slow
def test_the_farm_s_own_eval_bisects_a_real_checkpoint_s_revisions(tmp_path: Path) -> None:
    """stories260K as a git repository (initial upload, a model card, the weights re-exported with layer 2's down
    projection NaN, the card again): the farm's real export -> build -> eval names the re-export, and its eval
    says where (measured: 4 probes, about 80 s on 2 busy cores)."""
    from safetensors.numpy import load_file, save_file

    from edgellm import BUNDLED_MODEL_DIR

    repo = tmp_path / "stories260K"
    shutil.copytree(BUNDLED_MODEL_DIR, repo)
    _init(repo)
    shas = [_commit(repo, "initial upload")]
    (repo / "README.md").write_text("# stories260K\n")
    shas.append(_commit(repo, "add a model card"))
    weights = load_file(str(repo / "model.safetensors"))
    weights["model.layers.2.mlp.down_proj.weight"][:] = float("nan")
    save_file(weights, str(repo / "model.safetensors"), metadata={"format": "pt"})
    shas.append(_commit(repo, "re-export the weights"))
    (repo / "README.md").write_text("# stories260K\n\nA tiny Llama.\n")
    shas.append(_commit(repo, "model card: describe it"))
    out = tmp_path / "ckpt.json"
    code, output = _run(["--checkpoint", str(repo), "--precision", "fp32", "--checkpoint-good-rev", shas[0][:7],
                         "--checkpoint-bad-rev", "HEAD", "--data-dir", str(tmp_path / "d"), "--output", str(out),
                         "--no-cache"])
    assert code == 0, output
    answer = json.loads(out.read_text())
    assert (answer["first_bad"], answer["last_good"]) == (shas[2], shas[1])
    assert answer["code"] == str(Path(__file__).resolve().parents[1])  # the farm's own code ran on each revision
    for p in answer["probes"]:
        if shas.index(p["revision"]) >= 2:
            assert p["status"] == "bad" and p["step"] == "eval" and "diverges at layer 2 (mlp)" in p["detail"]
        else:
            assert p["status"] == "good", p


@pytest.mark.parametrize(("args", "needle"), [
    (["--checkpoint-good-rev", "nosuchrev", "--checkpoint-bad-rev", "HEAD"],
     "--checkpoint-good-rev 'nosuchrev': unknown revision in"),
    (["--checkpoint-good-rev", "HEAD", "--checkpoint-bad-rev", "HEAD~3"],
     "is not an ancestor of --checkpoint-bad-rev"),
    (["--checkpoint-good-rev", "HEAD~3"], "--checkpoint-bad-rev is missing"),
])
def test_a_bad_checkpoint_revision_is_exit_2_naming_it(stand_in: dict[str, Any], tmp_path: Path, args: list[str],
                                                       needle: str) -> None:
    code, output = _run(["--checkpoint", str(stand_in["repo"]), "--precision", "fp32", *args, "--data-dir",
                         str(tmp_path / "d"), "--output", str(tmp_path / "o.json")])
    assert code == 2, output
    assert needle in output and not (tmp_path / "o.json").exists()


def test_a_checkpoint_outside_git_cannot_have_its_revisions_bisected(small_ckpt: Path, tmp_path: Path) -> None:
    code, output = _run(["--checkpoint", str(small_ckpt), "--precision", "fp32", "--checkpoint-good-rev", "a",
                         "--checkpoint-bad-rev", "b", "--data-dir", str(tmp_path / "d"), "--output",
                         str(tmp_path / "o.json")])
    assert code == 2 and "not in a git repository, so its revisions cannot be bisected" in " ".join(output.split())


def test_nothing_to_bisect_is_exit_2(small_ckpt: Path, tmp_path: Path) -> None:
    code, output = _run(["--checkpoint", str(small_ckpt), "--precision", "fp32", "--output",
                         str(tmp_path / "o.json")])
    assert code == 2 and "nothing to bisect" in output
