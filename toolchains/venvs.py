"""One isolated Python environment per toolchain version, ``<root>/<toolchain>-<version>/``, and the versions a
toolchain's package source can install: the mechanism every toolchain with environments of its own shares (a
toolchain package says what goes into one: its requirements and install steps, and how it checks one).

Installs are atomic: an environment is built in a temporary sibling directory (``.<toolchain>-<version>.*``), its
paths rewritten to the final place and renamed into place, so a failed or interrupted install leaves nothing that
looks installed. Its steps run in process groups that die with the installer (``devices.lifetime``); SIGTERM and
Ctrl-C kill them and remove the temporary directory. The directory is marked in use while the install runs, so what
a killed install left (kill -9) is removed by the next install and by ``edgefarm gc``, never a running one's.

Packages come from pip's own configuration (its index, or the local wheelhouse or index pip is set up with:
``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX``, pip.conf), or from the artifact store's mirror of the
version (``toolchains.mirror``), as the ``WheelSource`` handed to an install says.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgefarm.artifacts.inuse import held_dir, remove_stale
from edgefarm.devices import lifetime
from edgefarm.toolchains import mirror
from edgefarm.toolchains.process import run_captured
from edgellm.errors import ConfigurationError, InfrastructureError

STEP_TIMEOUT_S = 1800
LIST_TIMEOUT_S = 300

# (what, argv) of one install step; made from the temporary environment's directory and the wheelhouse (or None)
Steps = Callable[[Path, Path | None], Sequence[tuple[str, list[str]]]]


@dataclass(frozen=True)
class Built:
    """An environment as its toolchain's check read it back."""

    path: Path
    version: str | None
    healthy: bool
    problems: list[str] = field(default_factory=list)


def sweep_dead_installs(root: Path, toolchain: str) -> list[Path]:
    """What installs of ``toolchain`` that died left under ``root`` (their temporary directories), never a running
    one's."""
    return remove_stale(Path(root), f".{toolchain}-*", 0)


def install_atomically(dest: Path, toolchain: str, version: str, build: Callable[[Path, Path | None, str | None],
                       None], healthy: Callable[[Path], bool], *, wheels: mirror.WheelSource | None = None) -> None:
    """Build ``dest`` (``<root>/<toolchain>-<version>``) with ``build(tmp, wheelhouse, mirrored_in)`` in a
    temporary sibling, move it into place (an unhealthy leftover at ``dest`` is replaced); the wheels come from the
    store's mirror of the version when ``wheels`` says so (fetched and verified first), else from pip's own index."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    sweep_dead_installs(dest.parent, toolchain)
    with contextlib.ExitStack() as stack:
        stack.enter_context(lifetime.terminate_as_interrupt())
        found = stack.enter_context(mirror.find(wheels, toolchain, version))
        house = None
        if found is not None:  # fetched (and verified) before anything is built
            house = found.fetch(stack.enter_context(held_dir(dest.parent, f".{dest.name}.wheels.")))
        tmp = stack.enter_context(held_dir(dest.parent, f".{dest.name}."))
        tmp.chmod(0o755)  # mkdtemp's 0700 would follow the rename
        build(tmp, house, None if found is None else found.shown)
        relocate(tmp, dest)
        swap_into_place(tmp, dest, healthy)


def run_steps(steps: Sequence[tuple[str, list[str]]], *, toolchain: str, version: str, wheelhouse: Path | None,
              log: Path | None = None,
              error: Callable[[str, str], Exception] | None = None) -> None:
    """Run install steps in turn (each in a process group that dies with us); a step that fails raises
    ``error(what, its output)`` (default: :func:`pip_error`), one past ``STEP_TIMEOUT_S`` InfrastructureError."""
    for what, argv in steps:
        try:
            done = lifetime.run(argv, timeout=STEP_TIMEOUT_S, env=mirror.pip_env(wheelhouse))
        except subprocess.TimeoutExpired:
            raise InfrastructureError(f"installing {toolchain} {version}: '{what}' took over {STEP_TIMEOUT_S} s "
                                      f"(slow package registry?)") from None
        if log is not None:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}\n")
        if done.returncode != 0:
            raise (error or (lambda w, out: pip_error(toolchain, version, w, out)))(what, done.stdout + done.stderr)


def pip_error(toolchain: str, version: str, what: str, output: str) -> ConfigurationError | InfrastructureError:
    """A failed pip step as an error of its kind: the index unreachable (infrastructure), the version not on it
    (configuration, naming it), else infrastructure with pip's error line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    unreachable = next((ln for ln in lines if any(m in ln for m in mirror.PIP_UNREACHABLE)), None)
    if unreachable is not None:
        return InfrastructureError(f"installing {toolchain} {version}: package index unreachable at '{what}': "
                                   f"{unreachable[:300]}")
    missing = next((ln for ln in lines if "Could not find a version that satisfies the requirement" in ln), None)
    if missing is not None:
        return ConfigurationError(f"{toolchain} version {version!r} cannot be installed from pip's index: {missing}")
    errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["(no output)"]
    return InfrastructureError(f"installing {toolchain} {version} failed at '{what}': {errors[-1][:300]}")


def relocate(built: Path, dest: Path) -> None:
    """venv and pip write absolute paths into console-script shebangs and activate scripts: point them at dest."""
    old, new = str(built).encode(), str(dest).encode()
    for path in [*sorted((built / "bin").iterdir()), built / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data:
            path.write_bytes(data.replace(old, new))


def swap_into_place(built: Path, dest: Path, healthy: Callable[[Path], bool]) -> None:
    with held_dir(dest.parent, f".{dest.name}.stale.") as stale:
        if dest.exists():  # an unhealthy leftover: move it aside, dropped once the new one is in place
            os.replace(dest, stale / "env")
        try:
            os.replace(built, dest)
        except OSError:
            if not healthy(dest):  # not a concurrent install that won the race
                raise


# --- a toolchain that is one pip distribution ---------------------------------------------------------------------

def distribution_version(env: Path, distribution: str, *, timeout: float = 120) -> str | None:
    """The version of ``distribution`` installed in ``env`` (asked of its interpreter), or None."""
    python = Path(env) / "bin" / "python"
    if not python.exists():
        return None
    probe = f"import importlib.metadata as m, json; print(json.dumps(m.version({distribution!r})))"
    try:
        done = run_captured([str(python), "-c", probe], env={}, timeout=timeout)
    except InfrastructureError:  # past its limit
        return None
    if done.returncode != 0:
        return None
    return str(json.loads(done.stdout.strip().splitlines()[-1]))


def check_distribution(env: Path, distribution: str, version: str) -> Built:
    found = distribution_version(env, distribution)
    problems = [] if found == version else [f"{distribution} {version} is not installed in {env} (found: {found})"]
    return Built(Path(env), found, not problems, problems)


def install_distribution(root: Path, toolchain: str, version: str, requirements: Sequence[str], *,
                         distribution: str | None = None, wheels: mirror.WheelSource | None = None,
                         pip_args: Sequence[str] = (), pth: Sequence[Path] = ()) -> Built:
    """``requirements`` into ``<root>/<toolchain>-<version>`` unless a healthy one is there: a venv without pip of
    this interpreter, filled by this interpreter's pip (``pip --python``); ``distribution`` (default: the
    toolchain's name) must then report ``version``. ``pth``: site directories appended after the environment's own
    (a ``.pth`` file: what the environment does not install itself is taken from there)."""
    dist = distribution or toolchain
    dest = Path(root) / f"{toolchain}-{version}"
    if dest.is_dir() and (existing := check_distribution(dest, dist, version)).healthy:
        return existing

    def steps(env: Path, house: Path | None) -> list[tuple[str, list[str]]]:
        pip = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install",
               "--disable-pip-version-check", "--no-input", *mirror.pip_source(house), *pip_args]
        return [("create the environment", [sys.executable, "-m", "venv", "--clear", "--without-pip", str(env)]),
                (f"install {' '.join(requirements)}", [*pip, *requirements])]

    def build(env: Path, house: Path | None, shown: str | None) -> None:
        run_steps(steps(env, house)[:1], toolchain=toolchain, version=version, wheelhouse=house)
        if pth:
            (site,) = sorted(env.glob("lib/python3*/site-packages"))
            (site / "zz_underneath.pth").write_text("".join(f"{p}\n" for p in pth))
        run_steps(steps(env, house)[1:], toolchain=toolchain, version=version, wheelhouse=house)

    install_atomically(dest, toolchain, version, build, lambda p: check_distribution(p, dist, version).healthy,
                       wheels=wheels)
    built = check_distribution(dest, dist, version)
    if not built.healthy:
        raise InfrastructureError(f"{toolchain} {version} installed into {dest} but is unhealthy: "
                                  f"{'; '.join(built.problems)}")
    return built


# --- what can be installed ------------------------------------------------------------------------------------------

def installable_versions(distribution: str, *, pre: bool = False) -> list[str]:
    """Every version of ``distribution`` that pip's own index (the registry, or the local index or wheelhouse pip
    is configured with) offers, oldest first (PEP 440 order; pre-releases only with ``pre``). InfrastructureError
    when pip cannot reach its index, ConfigurationError when it has no such distribution."""
    from packaging.version import InvalidVersion, Version

    argv = [sys.executable, "-m", "pip", "index", "versions", distribution, "--json", "--disable-pip-version-check",
            "--no-input", *(["--pre"] if pre else [])]
    try:
        done = lifetime.run(argv, timeout=LIST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise InfrastructureError(f"listing the versions of {distribution}: pip took over {LIST_TIMEOUT_S} s") \
            from None
    lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    if done.returncode != 0:
        unreachable = next((ln for ln in lines if any(m in ln for m in mirror.PIP_UNREACHABLE)), None)
        if unreachable is not None:
            raise InfrastructureError(f"listing the versions of {distribution}: package index unreachable: "
                                      f"{unreachable[:300]}")
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines[-1:] or ["(no output)"]
        raise ConfigurationError(f"pip's index offers no version of {distribution}: {errors[0][:300]}")
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])["versions"]
        parsed = sorted({Version(str(v)): str(v) for v in found}.items())
    except (ValueError, KeyError, IndexError, TypeError, InvalidVersion) as exc:
        raise InfrastructureError(f"listing the versions of {distribution}: pip's answer unreadable ({exc})") \
            from None
    return [v for _, v in parsed]


def between(versions: Sequence[str], good: str, bad: str, *, toolchain: str) -> list[str]:
    """The versions from ``good`` to ``bad``, both included, in that direction (a downgrade may be what broke a
    row); an end that is not in ``versions`` is ConfigurationError naming it and the installable ones."""
    problems = []
    for flag, value in (("--good-version", good), ("--bad-version", bad)):
        if value not in versions:
            shown = (("..., " if len(versions) > 12 else "") + ", ".join(versions[-12:])) if versions else "none"
            problems.append(f"{flag} {value!r}: not an installable version of {toolchain}; valid: {shown}")
    if problems:
        raise ConfigurationError("\n".join(problems))
    if good == bad:
        raise ConfigurationError(f"--good-version and --bad-version are both {good!r}: give two versions")
    i, j = versions.index(good), versions.index(bad)
    return list(versions[i:j + 1]) if i < j else list(reversed(versions[j:i + 1]))
