"""Air-gapped toolchains (issue 22 item 4): ``edgefarm toolchains mirror NAME==VERSION`` stores a toolchain's wheels
in the artifact store under a well-known name; installing that version takes them from there (no package registry);
a missing mirror with the registry disabled is a skip reason the plan shows.

The store's names (``set_ref``/``get_ref``) are tested on both backends: the local directory and a bucket (moto in
server mode on 127.0.0.1). Nothing here reaches a package registry: the wheels are built in the test (``_wheel``),
and pip's index is a dead 127.0.0.1 port wherever pip runs."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgefarm.artifacts.location import S3Location
from edgefarm.artifacts.s3 import Retry, S3ArtifactStore
from edgefarm.artifacts.store import ArtifactStore, MissingArtifactError, Store, StoreError
from edgefarm.cli import app
from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.plan import Decision, Plan, installing_toolchains, plan_test_list
from edgefarm.flows.settings import Settings
from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.loader import load_list
from edgefarm.toolchains import mirror
from edgellm.errors import ConfigurationError
from tests.fixtures.moto import MotoServer

FAST = Retry(attempts=3, base_s=0.02, max_s=0.1)


@pytest.fixture(params=["local", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Each backend in turn: a local directory store, then a bucket of the session's moto server."""
    if request.param == "local":
        store: Store = ArtifactStore(tmp_path / "store")
    else:
        server: MotoServer = request.getfixturevalue("moto_s3")
        store = S3ArtifactStore(S3Location(server.create_bucket(), "farm"), cache_dir=tmp_path / "cache",
                                cache_bytes=64 << 20, environ=server.env(), retry=FAST)
    try:
        yield store
    finally:
        store.close()


# --- the store's names ----------------------------------------------------------------------------------------------

def test_a_name_names_a_blob_is_replaced_whole_and_refuses_what_is_not_stored(any_store: Store) -> None:
    assert any_store.get_ref("toolchains/x/1.0/cp311-linux-x86_64") is None  # never set: no name, no error
    first, kept = any_store.put(b"manifest one"), any_store.put(b"a wheel")
    any_store.set_ref("toolchains/x/1.0/cp311-linux-x86_64", first.sha256, keeps=[kept.sha256])
    assert any_store.get_ref("toolchains/x/1.0/cp311-linux-x86_64") == first.sha256
    second = any_store.put(b"manifest two")
    any_store.set_ref("toolchains/x/1.0/cp311-linux-x86_64", second.sha256)
    assert any_store.get_ref("toolchains/x/1.0/cp311-linux-x86_64") == second.sha256
    absent = "0" * 64
    with pytest.raises(MissingArtifactError, match=absent):
        any_store.set_ref("toolchains/x/2.0/cp311-linux-x86_64", absent)
    with pytest.raises(MissingArtifactError, match=absent):
        any_store.set_ref("toolchains/x/2.0/cp311-linux-x86_64", first.sha256, keeps=[absent])
    assert any_store.get_ref("toolchains/x/2.0/cp311-linux-x86_64") is None  # nothing half-set


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "../up", ".hidden", "a//b", "a/", "sp ace", "a\nb",
                                 "x" * 300, "/".join("a" * 9)])
def test_a_bad_name_is_refused_naming_it_and_what_is_valid(bad: str, tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    blob = store.put(b"x")
    for call in (lambda: store.set_ref(bad, blob.sha256), lambda: store.get_ref(bad)):
        with pytest.raises(ConfigurationError) as caught:
            call()
        assert f"bad artifact name {bad!r}" in str(caught.value) and "letters, digits" in str(caught.value)
    assert not (tmp_path / "store" / "refs").exists()


def test_gc_keeps_what_a_name_names_and_keeps_and_nothing_else(any_store: Store) -> None:
    named, kept, loose = any_store.put(b"named"), any_store.put(b"kept"), any_store.put(b"loose")
    any_store.set_ref("mirror/a", named.sha256, keeps=[kept.sha256])
    any_store.close()  # drop a local store's pins: only names and references keep blobs now
    time.sleep(1.1)  # S3's object times have whole seconds
    assert any_store.gc(set(), older_than_s=0) == [loose.sha256]
    assert sorted(any_store.list()) == sorted([named.sha256, kept.sha256])
    any_store.set_ref("mirror/a", kept.sha256)  # the name moved on: the old blob is no longer kept
    assert any_store.gc(set(), older_than_s=0) == [named.sha256]


def test_a_name_record_that_is_not_one_fails_as_the_store_s_fault(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    (tmp_path / "store" / "refs" / "mirror").mkdir(parents=True)
    (tmp_path / "store" / "refs" / "mirror" / "a").write_text(json.dumps({"sha256": "nope", "keeps": []}))
    with pytest.raises(StoreError, match=r"artifact name 'mirror/a' in .* is not a name record"):
        store.get_ref("mirror/a")
    with pytest.raises(StoreError, match="is not a name record"):  # gc never guesses what a broken name kept
        store.gc(set(), older_than_s=0)


# --- stand-in wheels: tensorrt-edgellm 0.11.0's requirement set, made here ----------------------------------------
# STAND-IN: tiny pure-Python wheels under the real distribution names (tensorrt-edgellm with its [tools] extra,
# torch, onnx, nvidia-modelopt, torchvision), so the farm's real installer runs end to end from a mirror in seconds
# and offline. Nothing in them is NVIDIA's code; they only answer the installer's health probe (imports, version,
# console scripts).

def _wheel(dest: Path, name: str, version: str, modules: dict[str, str], *, requires: tuple[str, ...] = (),
           extras: dict[str, tuple[str, ...]] | None = None, scripts: dict[str, str] | None = None) -> Path:
    """A minimal valid wheel (PEP 427: METADATA, WHEEL, RECORD with hashes; py3-none-any) written into ``dest``."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    for extra, needs in (extras or {}).items():
        meta += [f"Provides-Extra: {extra}", *(f'Requires-Dist: {r}; extra == "{extra}"' for r in needs)]
    wheel = "Wheel-Version: 1.0\nGenerator: edgefarm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {**modules, f"{info}/METADATA": "\n".join(meta) + "\n", f"{info}/WHEEL": wheel}
    if scripts:
        files[f"{info}/entry_points.txt"] = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    out = dest / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as whl:
        for path, text in files.items():
            whl.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), text)
    return out


NEEDED = ["nvidia_modelopt-0.1.0-py3-none-any.whl", "onnx-1.0.0-py3-none-any.whl",
          "tensorrt_edgellm-0.11.0-py3-none-any.whl", "torch-2.13.0-py3-none-any.whl",
          "torchvision-0.1.0-py3-none-any.whl"]


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    """A lab's wheelhouse: the stand-in requirement set, plus a wheel nothing asks for (never mirrored)."""
    house = tmp_path / "wheelhouse"
    house.mkdir()
    cli = "import sys\n\ndef main():\n    print('STAND-IN tensorrt-edgellm')\n    sys.exit(0)\n"
    _wheel(house, "tensorrt-edgellm", "0.11.0", {"tensorrt_edgellm/__init__.py": "STANDIN = True\n",
                                                 "tensorrt_edgellm/cli.py": cli},
           requires=("onnx",), extras={"tools": ("nvidia-modelopt", "torchvision")},
           scripts={"tensorrt-edgellm-quantize": "tensorrt_edgellm.cli:main",
                    "tensorrt-edgellm-export": "tensorrt_edgellm.cli:main"})
    _wheel(house, "torch", "2.13.0", {"torch/__init__.py": "__version__ = '2.13.0'\n"})
    _wheel(house, "torchvision", "0.1.0", {"torchvision/__init__.py": ""}, requires=("torch",))
    _wheel(house, "onnx", "1.0.0", {"onnx/__init__.py": ""})
    _wheel(house, "nvidia-modelopt", "0.1.0", {"modelopt/__init__.py": ""})
    _wheel(house, "unrelated", "1.0.0", {"unrelated/__init__.py": ""})
    return house


@pytest.fixture
def no_registry(monkeypatch: pytest.MonkeyPatch) -> str:
    """pip's index: a 127.0.0.1 port nothing listens on (any registry request fails at once); no pip config."""
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/simple"
    monkeypatch.setenv("PIP_INDEX_URL", dead)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "5")
    return dead


@pytest.fixture(params=["local", "s3"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """$EDGEFARM_ARTIFACTS for each backend, shared by the host that mirrors and the one that installs: a
    directory, then a bucket of the session's moto server (this process's AWS_* pointed at it)."""
    if request.param == "local":
        url = str(tmp_path / "shared-store")
    else:
        server: MotoServer = request.getfixturevalue("moto_s3")
        request.getfixturevalue("s3_env")
        url = f"s3://{server.create_bucket()}/farm"
    monkeypatch.setenv("EDGEFARM_ARTIFACTS", url)
    return url


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def _mirror(wheelhouse: Path, data_dir: Path) -> str:
    code, out = _cli("toolchains", "mirror", "tensorrt-edgellm==0.11.0", "--from", str(wheelhouse),
                     "--data-dir", str(data_dir))
    assert code == 0, out
    return out


def _stored_manifest(data_dir: Path) -> tuple[str, dict[str, object]]:
    store = Settings.resolve(data_dir=data_dir).artifact_store()
    try:
        name = mirror.mirror_name("tensorrt-edgellm", "0.11.0", *mirror.host_tags())
        sha = store.get_ref(name)
        assert sha is not None, f"no mirror named {name}"
        return name, json.loads(store.read_bytes(sha))
    finally:
        store.close()


def _leftovers(data_dir: Path) -> list[str]:
    root = data_dir / "toolchains"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


# --- mirror, then install with no registry --------------------------------------------------------------------------

def test_a_mirrored_toolchain_installs_and_imports_with_the_registry_dead(
        store_url: str, wheelhouse: Path, no_registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lab mirrors from its wheelhouse; another host (its own data dir) installs from the store alone."""
    out = _mirror(wheelhouse, tmp_path / "lab")
    python, platform = mirror.host_tags()
    assert f"mirrored tensorrt-edgellm 0.11.0 for {python}-{platform}" in out and "5 wheel(s)" in out
    name, manifest = _stored_manifest(tmp_path / "lab")
    assert name == f"toolchains/tensorrt-edgellm/0.11.0/{python}-{platform}"
    assert (manifest["toolchain"], manifest["version"], manifest["python"], manifest["platform"]) == \
        ("tensorrt-edgellm", "0.11.0", python, platform)
    assert manifest["requirements"] == ["tensorrt-edgellm[tools]==0.11.0", "torch==2.13.0"]
    wheels = manifest["wheels"]
    assert isinstance(wheels, list) and sorted(w["name"] for w in wheels) == NEEDED  # "unrelated" left behind
    for w in wheels:
        assert w["sha256"] == hashlib.sha256((wheelhouse / w["name"]).read_bytes()).hexdigest()

    # s3 installs under auto (the mirror is found first), the directory store under mirror (the registry is off);
    # pip's own find-links offer a newer onnx, which an install that read anything but the mirror would take
    monkeypatch.setenv("EDGEFARM_TOOLCHAIN_INDEX", "auto" if store_url.startswith("s3://") else "mirror")
    decoys = tmp_path / "decoys"
    decoys.mkdir()
    _wheel(decoys, "onnx", "9.9.9", {"onnx/__init__.py": "DECOY = True\n"})
    monkeypatch.setenv("PIP_FIND_LINKS", str(decoys))
    worker = tmp_path / "worker"
    code, out = _cli("toolchains", "install", "tensorrt-edgellm==0.11.0", "--data-dir", str(worker))
    assert code == 0, out
    assert "healthy" in out and "unhealthy" not in out
    env = worker / "toolchains" / "tensorrt-edgellm-0.11.0"
    probe = subprocess.run([str(env / "bin" / "python"), "-c",
                            "import importlib.metadata as m, tensorrt_edgellm, modelopt, torch, onnx\n"
                            "print(m.version('tensorrt-edgellm'), tensorrt_edgellm.STANDIN, torch.__version__, "
                            "m.version('onnx'))"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.split() == ["0.11.0", "True", "2.13.0", "1.0.0"]
    quantize = subprocess.run([str(env / "bin" / "tensorrt-edgellm-quantize")], capture_output=True, text=True)
    assert quantize.returncode == 0 and "STAND-IN" in quantize.stdout  # the console script, relocated, runs
    installed = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "list", "--format=json"],
                               capture_output=True, text=True, check=True)
    names = {p["name"] for p in json.loads(installed.stdout)}
    assert "unrelated" not in names and "torchvision" not in names  # never mirrored; removed by the installer
    assert _leftovers(worker) == ["tensorrt-edgellm-0.11.0"]  # the fetched wheelhouse is gone


def test_the_same_install_from_the_registry_reaches_the_dead_port(
        wheelhouse: Path, no_registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contrast: the mirror is there, but EDGEFARM_TOOLCHAIN_INDEX=registry asks the (dead) registry, and
    fails saying so: the install above succeeded only because the mirror was used."""
    monkeypatch.setenv("EDGEFARM_ARTIFACTS", str(tmp_path / "shared-store"))
    _mirror(wheelhouse, tmp_path / "lab")
    monkeypatch.setenv("EDGEFARM_TOOLCHAIN_INDEX", "registry")
    code, out = _cli("toolchains", "install", "tensorrt-edgellm==0.11.0", "--data-dir", str(tmp_path / "worker"))
    assert code == 3, out
    assert "package registry unreachable" in " ".join(out.split())
    assert _leftovers(tmp_path / "worker") == []


def test_a_corrupt_mirrored_wheel_is_refused_before_anything_is_built(
        store_url: str, wheelhouse: Path, no_registry: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    _mirror(wheelhouse, tmp_path / "lab")
    _, manifest = _stored_manifest(tmp_path / "lab")
    torch = next(w for w in manifest["wheels"] if w["name"].startswith("torch-"))  # type: ignore[attr-defined]
    sha = torch["sha256"]
    if store_url.startswith("s3://"):  # the bucket's object rots; the installing worker's cache is empty
        server: MotoServer = request.getfixturevalue("moto_s3")
        bucket = store_url.removeprefix("s3://").split("/")[0]
        server.client().put_object(Bucket=bucket, Key=f"farm/sha256/{sha[:2]}/{sha[2:]}", Body=b"not torch")
    else:
        blob = Path(store_url) / "sha256" / sha[:2] / sha[2:]
        blob.chmod(0o644)
        blob.write_bytes(b"not torch")
    monkeypatch.setenv("EDGEFARM_TOOLCHAIN_INDEX", "mirror")
    code, out = _cli("toolchains", "install", "tensorrt-edgellm==0.11.0", "--data-dir", str(tmp_path / "worker"))
    text = " ".join(out.split())
    assert code == 2, out
    assert (f"is damaged: wheel torch-2.13.0-py3-none-any.whl (sha256 {sha}) does not match its sha256: refused; "
            f"mirror it again: edgefarm toolchains mirror tensorrt-edgellm==0.11.0") in text
    assert "Traceback" not in out
    assert _leftovers(tmp_path / "worker") == []  # no environment begun, no fetched wheels left


def test_a_missing_mirror_with_the_registry_disabled_skips_the_rows_saying_so(
        moto_s3: MotoServer, s3_env: dict[str, str], no_registry: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the planner: the pinned toolchain is installable, installing it finds no mirror and may not ask the
    registry, so every row that needs it is skipped with that reason (and nothing was built)."""
    bucket = moto_s3.create_bucket()
    monkeypatch.setenv("EDGEFARM_ARTIFACTS", f"s3://{bucket}/farm")
    monkeypatch.setenv("EDGEFARM_TOOLCHAIN_INDEX", "mirror")
    settings = Settings.resolve(data_dir=tmp_path / "data")
    inventory, catalog = load_inventory(data_dir=settings.data_dir), Catalog.load()

    def make() -> Plan:
        return plan_test_list(load_list("l0_checkpoint_export"), inventory, catalog, data_dir=settings.data_dir)

    before = make()
    skipped = {j.key for j in before.jobs if j.decision is Decision.SKIPPED}
    assert skipped and not before.runnable()  # not installed yet (but installable)
    plan = installing_toolchains(make, settings.data_dir, settings.toolchain_wheels())
    python, platform = mirror.host_tags()
    reason = (f"toolchain tensorrt-edgellm 0.11.0 is not mirrored in s3://{bucket}/farm for {python}-{platform} "
              f"(run `edgefarm toolchains mirror tensorrt-edgellm==0.11.0`); registry disabled by "
              f"EDGEFARM_TOOLCHAIN_INDEX=mirror")
    assert not plan.runnable()
    for job in plan.jobs:
        if job.key in skipped:
            assert job.decision is Decision.SKIPPED and reason in job.reason, job.reason
    assert _leftovers(settings.data_dir) == []  # no environment begun



# --- bad input: exit 2, one message naming the value and what is valid, no traceback --------------------------------

@pytest.mark.parametrize(("args", "expected"), [
    (["nope==1.0"], "unknown toolchain 'nope' in 'nope==1.0'; installable: tensorrt-edgellm (e.g. "
                    "tensorrt-edgellm==0.11.0)"),
    (["onnxruntime-genai==0.5.0"], "unknown toolchain 'onnxruntime-genai' in 'onnxruntime-genai==0.5.0'; "
                                   "installable: tensorrt-edgellm"),
    (["tensorrt-edgellm"], "give a pinned version: tensorrt-edgellm==0.11.0 (got 'tensorrt-edgellm')"),
    (["tensorrt-edgellm==>=0.11"], "bad tensorrt-edgellm version '>=0.11'; expected an exact version like 0.11.0"),
    (["tensorrt-edgellm==0.11.0", "--from", "/nonexistent/wheels"],
     "wheelhouse '/nonexistent/wheels' is not a directory; give --from a directory of wheels (*.whl) holding "
     "tensorrt-edgellm[tools]==0.11.0 torch==2.13.0 and their dependencies"),
], ids=["unknown", "no-environments", "no-version", "range", "no-wheelhouse"])
def test_mirror_refuses_bad_input_naming_it(args: list[str], expected: str, tmp_path: Path, no_registry: str) -> None:
    code, out = _cli("toolchains", "mirror", *args, "--data-dir", str(tmp_path / "data"))
    assert code == 2, out
    assert expected in " ".join(out.split()) and "Traceback" not in out
    assert not (tmp_path / "data" / "artifacts" / "refs").exists()


def test_a_wheelhouse_lacking_a_dependency_mirrors_nothing(wheelhouse: Path, no_registry: str,
                                                           tmp_path: Path) -> None:
    (wheelhouse / "onnx-1.0.0-py3-none-any.whl").unlink()
    code, out = _cli("toolchains", "mirror", "tensorrt-edgellm==0.11.0", "--from", str(wheelhouse),
                     "--data-dir", str(tmp_path / "data"))
    text = " ".join(out.split())
    assert code == 2, out
    python, platform = mirror.host_tags()
    assert (f"the wheelhouse {str(wheelhouse)!r} cannot give tensorrt-edgellm 0.11.0 (tensorrt-edgellm[tools]==0.11.0 "
            f"torch==2.13.0) for {python}-{platform}:") in text and "onnx" in text
    assert not (tmp_path / "data" / "artifacts" / "refs").exists()  # no half mirror named


def test_a_bad_toolchain_index_setting_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFARM_TOOLCHAIN_INDEX", "offline")
    with pytest.raises(ConfigurationError, match="unknown EDGEFARM_TOOLCHAIN_INDEX 'offline'; valid: auto, mirror, "
                                                 "registry"):
        Settings.resolve(data_dir=tmp_path)
    code, out = _cli("toolchains", "install", "tensorrt-edgellm==0.11.0", "--data-dir", str(tmp_path))
    assert code == 2 and "unknown EDGEFARM_TOOLCHAIN_INDEX 'offline'" in out, out
    monkeypatch.delenv("EDGEFARM_TOOLCHAIN_INDEX")
    assert Settings.resolve(data_dir=tmp_path).toolchain_index is mirror.Index.AUTO


@pytest.mark.parametrize("name", ["../escape.whl", "sub/dir.whl", ".hidden.whl", "not-a-wheel.tar.gz"])
def test_a_stored_manifest_naming_a_wheel_outside_the_wheelhouse_is_refused(name: str) -> None:
    """A manifest's file names become paths in the wheelhouse: only a wheel's plain file name passes."""
    good = mirror.Manifest("t", "1.0", "cp311", "linux_x86_64", ("t==1.0",),
                           (mirror.Wheel("t-1.0-py3-none-any.whl", "a" * 64, 1),))
    assert mirror.Manifest.from_json(good.to_json(), "here") == good
    data = json.loads(good.to_json())
    data["wheels"][0]["name"] = name
    with pytest.raises(ConfigurationError, match=re.escape(f"the toolchain mirror manifest here is not one (bad "
                                                           f"wheel file name(s) [{name!r}])")):
        mirror.Manifest.from_json(json.dumps(data).encode(), "here")


def test_mirroring_from_an_unreachable_registry_is_infrastructure_and_names_the_way_out(no_registry: str,
                                                                                       tmp_path: Path) -> None:
    code, out = _cli("toolchains", "mirror", "tensorrt-edgellm==0.11.0", "--data-dir", str(tmp_path / "data"))
    text = " ".join(out.split())
    assert code == 3, out
    assert "mirroring tensorrt-edgellm 0.11.0: package registry unreachable:" in text
    assert "give a wheelhouse: --from DIR" in text and "Traceback" not in out
    assert not (tmp_path / "data" / "artifacts" / "refs").exists()
