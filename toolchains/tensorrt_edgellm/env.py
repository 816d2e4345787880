"""One isolated Python environment per tensorrt-edgellm version, under ``<root>/tensorrt-edgellm-<version>/``.

Its pins (transformers, onnx, numpy, nvidia-modelopt) clash with the farm's, so it never shares our environment.
Recipe (measured on a CPU-only host): CPU torch first (any other torch pulls multi-GB CUDA builds), then
``tensorrt-edgellm[tools]==V`` with that torch pinned, then remove torchvision (the registry's build is CUDA-linked
and breaks every command next to a CPU torch: ``operator torchvision::nms does not exist``).

Its packages come from the package registry, or from the artifact store's mirror of the version (``toolchains.mirror``:
``edgefarm toolchains mirror``; fetched into a temporary wheelhouse beside the environment, installed ``--no-index``),
as the ``WheelSource`` handed to :func:`install` says.

Installs are atomic (``toolchains.venvs``, the mechanism every toolchain with environments shares): the environment
is built in a temporary sibling directory (``.tensorrt-edgellm-<version>.*``) and renamed into place, so a failed or
interrupted install leaves nothing that looks installed. Its steps run in process groups that die with the installer
(``devices.lifetime``); SIGTERM and Ctrl-C kill them and remove the temporary directory before the installer ends.
The directory is marked in use while the install runs, so what a killed install left (kill -9) is removed by the
next install and by ``edgefarm gc``, never a running one's.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgefarm.toolchains import mirror, venvs
from edgefarm.toolchains.process import run_captured
from edgefarm.toolchains.tensorrt_edgellm import TOOLCHAIN
from edgellm.errors import ConfigurationError, InfrastructureError

CPU_TORCH = "torch==2.13.0"
CONSOLE_SCRIPTS = ("tensorrt-edgellm-quantize", "tensorrt-edgellm-export")
IMPORTS = ("tensorrt_edgellm", "modelopt", "torch", "onnx")
STEP_TIMEOUT_S = 1800
# An exact PEP 440 release (no ranges), bounded, ASCII only (it names a directory): 0.11.0, 0.11.0rc1, 0.11.0.post1,
# 0.11.0.dev2, and a local label (0.11.0+relabel). Matched whole (fullmatch: "$" would let a final newline in).
_N = "(?:0|[1-9][0-9]{0,5})"  # a number: at most 6 digits, no leading zeros
_VERSION = re.compile(rf"{_N}(?:\.{_N}){{0,5}}(?:(?:a|b|rc){_N})?(?:\.post{_N})?(?:\.dev{_N})?"
                      r"(?:\+[a-z0-9]{1,16}(?:\.[a-z0-9]{1,16}){0,3})?", re.ASCII)
MAX_VERSION_CHARS = 64


@dataclass(frozen=True)
class EnvHealth:
    """What ``edgefarm toolchains list`` shows for one environment."""

    path: Path
    version: str | None  # read back from the installed distribution, None when unreadable
    healthy: bool
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "path": str(self.path), "toolchain": TOOLCHAIN}


def check_version(version: str) -> str:
    """``version`` when it is an exact, bounded PEP 440 version (see ``_VERSION``), else ConfigurationError naming
    it (cut short when long) and what is valid."""
    if not (isinstance(version, str) and len(version) <= MAX_VERSION_CHARS and _VERSION.fullmatch(version)):
        shown = repr(version) if len(str(version)) <= 40 else f"{str(version)[:24]!r}... ({len(version)} characters)"
        raise ConfigurationError(f"bad {TOOLCHAIN} version {shown}; expected an exact version like 0.11.0 "
                                 f"(also 0.11.0rc1, 0.11.0.post1, 0.11.0.dev1, 0.11.0+local; numbers of at most 6 "
                                 f"digits, {MAX_VERSION_CHARS} characters in all), not a range or a name")
    return version


def toolchains_root(data_dir: Path) -> Path:
    """Where the farm keeps toolchain environments: ``<data dir>/toolchains``."""
    return Path(data_dir) / "toolchains"


def env_dir(root: Path, version: str) -> Path:
    return Path(root) / f"{TOOLCHAIN}-{check_version(version)}"


def script(env: Path, name: str) -> Path:
    """A console script of the environment (``tensorrt-edgellm-quantize`` ...)."""
    return Path(env) / "bin" / name


def health(env: Path, *, timeout: float = 300) -> EnvHealth:
    """Imports work, console scripts exist and point at this environment's interpreter; version read back."""
    env = Path(env)
    python = env / "bin" / "python"
    if not python.exists():
        return EnvHealth(env, None, False, [f"{python} is missing (not an environment)"])
    problems = []
    for name in CONSOLE_SCRIPTS:
        path = script(env, name)
        if not path.is_file():
            problems.append(f"console script {name} is missing")
        elif str(env.resolve() / "bin" / "python") not in path.read_text(encoding="utf-8", errors="replace")[:512]:
            problems.append(f"console script {name} runs another interpreter (moved environment?)")
    probe = ("import importlib, importlib.metadata as m, json\n"
             f"for name in {IMPORTS!r}: importlib.import_module(name)\n"
             f"print(json.dumps({{'version': m.version({TOOLCHAIN!r})}}))")
    try:
        done = run_captured([str(python), "-c", probe], env={}, timeout=timeout)
    except InfrastructureError:  # past its limit
        return EnvHealth(env, None, False, [*problems, f"import probe timed out after {timeout:.0f} s"])
    version = None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        problems.append(f"import probe failed: {last}")
    else:
        version = json.loads(done.stdout.strip().splitlines()[-1])["version"]
    expected = env.name.removeprefix(f"{TOOLCHAIN}-")
    if version is not None and version != expected:
        problems.append(f"installed version {version} does not match directory {env.name}")
    return EnvHealth(env, version, not problems, problems)


def installed_version(env: Path) -> str:
    """The tensorrt-edgellm version installed in ``env``, read from its distribution metadata (no imports: fast)."""
    found = sorted(Path(env).glob("lib/python3*/site-packages/tensorrt_edgellm-*.dist-info/METADATA"))
    for metadata in found:
        for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version: "):
                return line.removeprefix("Version: ").strip()
    raise ConfigurationError(f"{env} has no {TOOLCHAIN} installed (no tensorrt_edgellm dist-info); "
                             f"run: edgefarm toolchains install {TOOLCHAIN}==VERSION")


def list_envs(root: Path) -> list[EnvHealth]:
    """Every installed environment under ``root`` (temporary build directories are not listed)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return [health(p) for p in sorted(root.glob(f"{TOOLCHAIN}-*")) if p.is_dir()]


def requirements(version: str) -> tuple[str, ...]:
    """What an environment of ``version`` is installed from (its second step; the first, CPU torch, is in it)."""
    return (f"{TOOLCHAIN}[tools]=={check_version(version)}", CPU_TORCH)


def install(root: Path, version: str, *, log: Path | None = None,
            wheels: mirror.WheelSource | None = None) -> EnvHealth:
    """Install ``tensorrt-edgellm[tools]==version`` into ``<root>/tensorrt-edgellm-<version>`` unless a healthy one
    is there, from the store's mirror of it or the package registry as ``wheels`` says (None: the registry).
    Raises InfrastructureError when the package registry is unreachable, ConfigurationError for a version the
    registry does not have, one not mirrored where only the mirror may be used, or a damaged mirror."""
    dest = env_dir(root, version)
    if dest.is_dir():
        existing = health(dest)
        if existing.healthy:
            return existing
    venvs.install_atomically(dest, TOOLCHAIN, version,
                             lambda tmp, house, shown: _build(tmp, version, log, house, shown),
                             lambda path: health(path).healthy, wheels=wheels)
    result = health(dest)
    if not result.healthy:
        raise InfrastructureError(f"{TOOLCHAIN} {version} installed into {dest} but is unhealthy: "
                                  f"{'; '.join(result.problems)}")
    return result


def sweep_dead_installs(root: Path) -> list[Path]:
    """What installs that died left under ``root`` (their temporary directories), never a running one's."""
    return venvs.sweep_dead_installs(root, TOOLCHAIN)


def _build(env: Path, version: str, log: Path | None, wheelhouse: Path | None, mirrored_in: str | None) -> None:
    python = str(env / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
           *mirror.pip_source(wheelhouse)]
    steps: list[tuple[str, list[str]]] = [
        ("create the environment", [sys.executable, "-m", "venv", "--clear", str(env)]),
        (f"install {CPU_TORCH}", [*pip, CPU_TORCH]),
        (f"install {TOOLCHAIN}[tools]=={version}", [*pip, *requirements(version)]),
        ("remove torchvision", [python, "-m", "pip", "uninstall", "-y", "torchvision"]),
    ]
    venvs.run_steps(steps, toolchain=TOOLCHAIN, version=version, wheelhouse=wheelhouse, log=log,
                    error=lambda what, output: _pip_error(what, version, output, mirrored_in))


def _pip_error(what: str, version: str, output: str,
               mirrored_in: str | None = None) -> ConfigurationError | InfrastructureError:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if mirrored_in is not None and what != "create the environment":  # pip read only the mirror's wheels
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["(no output)"]
        return ConfigurationError(f"installing {TOOLCHAIN} {version} from its mirror in {mirrored_in} failed at "
                                  f"'{what}': {errors[0][:300]} (the mirror lacks a wheel this host needs? mirror it "
                                  f"again: {mirror.mirror_command(TOOLCHAIN, version)})")
    unreachable = next((ln for ln in lines if any(m in ln for m in mirror.PIP_UNREACHABLE)), None)
    # Both packages are on the public registry: "no versions at all" means pip could not reach one that has them.
    unreachable = unreachable or next((ln for ln in lines if "(from versions: none)" in ln), None)
    if unreachable is not None:
        return InfrastructureError(f"installing {TOOLCHAIN} {version}: package registry unreachable at "
                                   f"'{what}': {unreachable[:300]}")
    missing = next((ln for ln in lines if "Could not find a version that satisfies the requirement" in ln), None)
    if missing is not None and TOOLCHAIN in missing:
        return ConfigurationError(f"{TOOLCHAIN} version {version!r} is not on the package registry: {missing}")
    errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["(no output)"]
    return InfrastructureError(f"installing {TOOLCHAIN} {version} failed at '{what}': {errors[-1][:300]}")


def _relocate(built: Path, dest: Path) -> None:
    venvs.relocate(built, dest)


def _swap_into_place(built: Path, dest: Path) -> None:
    venvs.swap_into_place(built, dest, lambda path: health(path).healthy)


def installable_versions() -> list[str]:
    """The versions pip's index offers (oldest first) that name an environment (:func:`check_version`)."""
    return [v for v in venvs.installable_versions(TOOLCHAIN) if _VERSION.fullmatch(v)]
