"""A toolchain's wheels in the artifact store, for hosts that cannot reach a package registry (air-gapped labs).

``edgefarm toolchains mirror NAME==VERSION`` resolves what the toolchain's installer installs for that version
(``ToolchainEnvironment.requirements``, the same requirement set) for this host's Python and platform, with ``pip
wheel`` from the registry or, with ``--from DIR``, from a local wheelhouse only; it stores each wheel as a blob and a
manifest (toolchain, version, Python and platform tags, requirements, each wheel's file name, sha256 and size) named
``toolchains/<name>/<version>/<python>-<platform>`` (the store's names: ``artifacts.store``; gc keeps a named manifest
and every wheel it lists). An install of that version on a host of the same tags first looks for that name: found, each
wheel is fetched by its sha256 (the store re-hashes what it serves: a corrupt one is refused) into a temporary
wheelhouse and pip installs with ``--no-index --find-links`` (no registry is asked).

Where an install may get wheels is one setting, ``$EDGEFARM_TOOLCHAIN_INDEX`` (read by flows.settings), an
:class:`Index`: ``auto`` (default: the mirror when there is one, else the registry, as before), ``mirror`` (the
mirror only: a version not mirrored is not installable, and the rows that need it are skipped saying so) or
``registry`` (never look at the store).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgellm.errors import ConfigurationError, InfrastructureError
from edgellm.types import ChoiceEnum

if TYPE_CHECKING:
    from edgefarm.artifacts.store import Store

SCHEMA = "edgefarm.toolchain-mirror/1"
PIP_TIMEOUT_S = 3600  # resolving and downloading a GPU toolchain's wheels (torch alone is GBs with CUDA)
# a wheel's file name (PEP 427) as it may land in a wheelhouse: one path component, nothing hidden
WHEEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+!-]{0,250}\.whl")
# Lines pip prints when it cannot reach the index (an install or a download then fails with "from versions: none").
PIP_UNREACHABLE = ("NewConnectionError", "Failed to establish a new connection",
                   "Temporary failure in name resolution", "Name or service not known", "ConnectTimeoutError",
                   "Network is unreachable", "ProxyError", "Connection refused", "ReadTimeoutError", "SSLError")


class Index(ChoiceEnum):
    """Where a toolchain install gets its wheels (the setting ``flows.settings`` reads)."""

    AUTO = "auto"  # the store's mirror of that version when there is one, else the package registry
    MIRROR = "mirror"  # the mirror only (air-gapped): a version not mirrored cannot be installed
    REGISTRY = "registry"  # the package registry only


@dataclass(frozen=True)
class WheelSource:
    """What an install is handed (``flows.settings.Settings.toolchain_wheels``): the setting, the artifact store
    as messages name it, and how to open it (only when an install looks)."""

    index: Index
    shown: str  # e.g. s3://bucket/prefix; never a credential
    open_store: Callable[[], Store]
    setting: str = "the toolchain index setting"  # the variable that chose ``index``, as messages name it


@dataclass(frozen=True)
class Wheel:
    name: str  # its file name, checked against WHEEL_NAME before it becomes a path
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    toolchain: str
    version: str
    python: str  # e.g. cp311
    platform: str  # e.g. linux_x86_64
    requirements: tuple[str, ...]  # what the installer asks pip for
    wheels: tuple[Wheel, ...]

    @property
    def name(self) -> str:
        return mirror_name(self.toolchain, self.version, self.python, self.platform)

    def to_json(self) -> bytes:
        return json.dumps({"schema": SCHEMA, "toolchain": self.toolchain, "version": self.version,
                           "python": self.python, "platform": self.platform,
                           "requirements": list(self.requirements),
                           "wheels": [{"name": w.name, "sha256": w.sha256, "bytes": w.bytes} for w in self.wheels]},
                          indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> Manifest:
        """A stored manifest, every field checked (a wheel's name becomes a file name): ConfigurationError
        naming ``where`` and what is wrong."""
        from edgefarm.artifacts.store import check_sha

        try:
            found = json.loads(data)
            if found.get("schema") != SCHEMA:
                raise ValueError(f"schema {found.get('schema')!r}, not {SCHEMA}")
            wheels = tuple(Wheel(str(w["name"]), check_sha(w["sha256"]), int(w["bytes"])) for w in found["wheels"])
            bad = [w.name for w in wheels if not WHEEL_NAME.fullmatch(w.name)]
            if bad or not wheels:
                raise ValueError(f"bad wheel file name(s) {bad!r}" if bad else "no wheels")
            return cls(str(found["toolchain"]), str(found["version"]), str(found["python"]), str(found["platform"]),
                       tuple(str(r) for r in found["requirements"]), wheels)
        except (ValueError, KeyError, TypeError, AttributeError, ConfigurationError) as exc:
            raise ConfigurationError(f"the toolchain mirror manifest {where} is not one ({exc}); mirror it "
                                     f"again") from None


def host_tags() -> tuple[str, str]:
    """This host's Python tag (``cp311``) and platform (``linux_x86_64``): a toolchain's environment is made
    from the farm's own interpreter, so its wheels are this interpreter's."""
    impl = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
    platform = re.sub(r"[^A-Za-z0-9]+", "_", sysconfig.get_platform())
    return f"{impl}{sys.version_info.major}{sys.version_info.minor}", platform


def mirror_name(toolchain: str, version: str, python: str, platform: str) -> str:
    """The store name of a mirror (``artifacts.store.check_ref_name`` checks it)."""
    return f"toolchains/{toolchain}/{version}/{python}-{platform}"


def mirror_command(toolchain: str, version: str) -> str:
    return f"edgefarm toolchains mirror {toolchain}=={version}"


def not_mirrored(toolchain: str, version: str, shown: str, setting: str) -> str:
    """Why a version cannot be installed when the registry is disabled and the store holds no mirror of it."""
    python, platform = host_tags()
    return (f"toolchain {toolchain} {version} is not mirrored in {shown} for {python}-{platform} (run `"
            f"{mirror_command(toolchain, version)}`); registry disabled by {setting}={Index.MIRROR.value}")


# --- making a mirror ------------------------------------------------------------------------------------------------

def resolve_wheels(requirements: Sequence[str], dest: Path, *, wheelhouse: Path | None = None,
                   what: str = "the toolchain") -> list[Path]:
    """Every wheel ``requirements`` need on this host (dependencies included) into ``dest``: ``pip wheel`` from
    the registry, or only from the local ``wheelhouse`` (``--no-index``). ConfigurationError when the wheelhouse
    (or the registry) cannot give them, InfrastructureError when the registry cannot be reached."""
    from edgefarm.devices import lifetime

    argv = [sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "--no-input", "--wheel-dir",
            str(dest), *requirements, *pip_source(wheelhouse)]
    source = f"the wheelhouse {str(wheelhouse)!r}" if wheelhouse is not None else "the package registry"
    try:
        done = lifetime.run(argv, timeout=PIP_TIMEOUT_S, env=pip_env(wheelhouse))
    except subprocess.TimeoutExpired:
        raise InfrastructureError(f"resolving the wheels of {what} from {source} took over {PIP_TIMEOUT_S} s") \
            from None
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        unreachable = next((ln for ln in lines if any(m in ln for m in PIP_UNREACHABLE)), None)
        # the toolchain's own packages are on the public registry: "no versions at all" means pip reached none
        unreachable = unreachable or next((ln for ln in lines if "(from versions: none)" in ln), None)
        if wheelhouse is None and unreachable is not None:
            raise InfrastructureError(f"mirroring {what}: package registry unreachable: {unreachable[:300]} (on a "
                                      f"host without one, give a wheelhouse: --from DIR)")
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["(no output)"]
        python, platform = host_tags()
        raise ConfigurationError(f"{source} cannot give {what} ({' '.join(requirements)}) for {python}-{platform}: "
                                 f"{errors[0][:300]}")
    found = sorted(dest.glob("*.whl"))
    if not found:
        raise ConfigurationError(f"{source} gave no wheels for {what} ({' '.join(requirements)})")
    return found


def mirror(store: Store, toolchain: str, version: str, requirements: Sequence[str], *,
           wheelhouse: Path | None = None) -> Manifest:
    """Resolve ``requirements`` (see :func:`resolve_wheels`), store each wheel and the manifest, and name the
    manifest (which keeps the wheels) last: a reader finds a whole mirror or the one before."""
    from edgefarm.artifacts.kinds import ArtifactKind

    if wheelhouse is not None and not wheelhouse.is_dir():
        raise ConfigurationError(f"wheelhouse {str(wheelhouse)!r} is not a directory; give --from a directory of "
                                 f"wheels (*.whl) holding {' '.join(requirements)} and their dependencies")
    python, platform = host_tags()
    with tempfile.TemporaryDirectory(prefix="edgefarm-mirror-") as tmp:
        files = resolve_wheels(requirements, Path(tmp), wheelhouse=wheelhouse, what=f"{toolchain} {version}")
        wheels = []
        for path in files:
            if not WHEEL_NAME.fullmatch(path.name):
                raise ConfigurationError(f"wheel file name {path.name!r} is not a wheel's (PEP 427)")
            ref = store.put(path, ArtifactKind.OTHER)
            wheels.append(Wheel(path.name, ref.sha256, ref.size))
    manifest = Manifest(toolchain, version, python, platform, tuple(requirements), tuple(wheels))
    stored = store.put(manifest.to_json(), ArtifactKind.REPORT)
    store.set_ref(manifest.name, stored.sha256, keeps=[w.sha256 for w in wheels])
    return manifest


# --- installing from one --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Found:
    """A mirror an install takes its wheels from."""

    store: Store
    shown: str
    manifest: Manifest

    def fetch(self, dest: Path) -> Path:
        """Every wheel into the (empty) directory ``dest``, each verified by its sha256; a corrupt or missing
        one is refused (ConfigurationError naming it and how to mirror again)."""
        from edgefarm.artifacts.store import CorruptArtifactError, MissingArtifactError

        m = self.manifest
        for wheel in m.wheels:
            try:
                self.store.get_file(wheel.sha256, dest / wheel.name)
            except (CorruptArtifactError, MissingArtifactError) as exc:
                state = "does not match its sha256" if isinstance(exc, CorruptArtifactError) else "is missing"
                raise ConfigurationError(
                    f"the mirror of {m.toolchain} {m.version} in {self.shown} is damaged: wheel {wheel.name} "
                    f"(sha256 {wheel.sha256}) {state}: refused; mirror it again: "
                    f"{mirror_command(m.toolchain, m.version)}") from None
        return dest


@contextlib.contextmanager
def find(source: WheelSource | None, toolchain: str, version: str) -> Iterator[Found | None]:
    """The mirror of ``toolchain`` ``version`` for this host that an install should use, or None for the registry
    (no source, ``registry``, or ``auto`` with no mirror); with ``mirror`` and none stored, ConfigurationError
    (:func:`not_mirrored`). The store stays open while the block runs."""
    from edgefarm.artifacts.store import CorruptArtifactError, MissingArtifactError

    if source is None or source.index is Index.REGISTRY:
        yield None
        return
    store = source.open_store()
    try:
        name = mirror_name(toolchain, version, *host_tags())
        sha = store.get_ref(name)
        if sha is None:
            if source.index is Index.MIRROR:
                raise ConfigurationError(not_mirrored(toolchain, version, source.shown, source.setting))
            yield None
            return
        where = f"{name} in {source.shown}"
        try:
            data = store.read_bytes(sha)
        except (CorruptArtifactError, MissingArtifactError):
            raise ConfigurationError(f"the toolchain mirror manifest {where} (sha256 {sha}) is damaged: refused; "
                                     f"mirror it again: {mirror_command(toolchain, version)}") from None
        manifest = Manifest.from_json(data, where)
        if manifest.name != name:
            raise ConfigurationError(f"the toolchain mirror manifest {where} describes {manifest.name}; mirror it "
                                     f"again: {mirror_command(toolchain, version)}")
        yield Found(store, source.shown, manifest)
    finally:
        store.close()


def pip_source(wheelhouse: Path | None) -> list[str]:
    """pip's arguments for where an install's packages come from: the registry (none), or only ``wheelhouse``."""
    return [] if wheelhouse is None else ["--no-index", "--find-links", str(wheelhouse)]


def pip_env(wheelhouse: Path | None) -> dict[str, str] | None:
    """The environment of a pip that reads ``wheelhouse`` only: this process's without pip's own settings
    (``PIP_FIND_LINKS`` and pip's config files add packages from elsewhere, whatever ``--find-links`` says); None
    (this process's, unchanged) for the registry, which the installer and the mirror then reach alike."""
    if wheelhouse is None:
        return None
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}
