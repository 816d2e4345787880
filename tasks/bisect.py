"""One probe of ``edgefarm bisect``, for each input it bisects:

- this repository's commits (``revision``): a revision checked out as a detached ``git worktree`` in a temporary
  directory, and that revision's own ``edgellm export -> build -> eval`` run on a checkpoint (``python -m edgellm``
  with PYTHONPATH = the worktree), so each probe tests the code of its revision;
- a checkpoint's commits (``checkpoint``: a checkpoint directory that is a git repository, as Hugging Face model
  repositories are): a revision of the checkpoint checked out the same way, and the farm's own code (this checkout)
  run on it;
- a toolchain's versions (:func:`run_version_probe`): the version installed into an environment of its own under the
  data dir (kept: the next bisection reuses it), and the toolchain's own stages of the row run with it
  (``ToolchainEnvironment.probe_version``).

A probe's outcome: ``good`` (every step exit 0), ``bad`` (a step failed: test failure 1, bad input 2, bug 4, or a
crash), ``skip`` (it could not tell: infrastructure 3, out of resources 5, a timeout, or a worktree that cannot be
made). Outcomes are cached by content: the revision's tree sha + the checkpoint's digest + precision + platform
(the worktree's path, the commit's message and date do not count); of a checkpoint revision, its tree sha + the
digest of the farm's source; of a toolchain version, the toolchain, the version, the checkpoint's digest and the
farm's source. An entry is trusted only when the key stored in it is the key asked for.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgellm.errors import ConfigurationError, EdgeLLMError
from edgellm.files import write_text_atomic

PLATFORM_BACKENDS = {"x86-cpu": "ort"}  # the platforms a --checkpoint bisect can probe on this host
OUTCOMES = ("good", "bad", "skip")
SKIP_EXIT_CODES = (3, 5)  # infrastructure, out of resources: the revision was not judged
STEP_TIMEOUT_S = 900


@dataclass(frozen=True)
class Revision:
    sha: str
    tree: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:7]


@dataclass
class ProbeResult:
    revision: str
    subject: str
    status: str  # one of OUTCOMES
    seconds: float
    step: str | None = None  # the step that failed
    exit_code: int | None = None
    detail: str = ""  # the failing step's last error line
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ConfigurationError(f"git {' '.join(args)} in {repo}: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()


def resolve(repo: Path, rev: str, what: str) -> Revision:
    """``rev`` (a sha, prefix, branch or tag) as a commit of ``repo``; an unknown one is ConfigurationError."""
    if not rev or rev.startswith("-"):
        raise ConfigurationError(f"{what} {rev!r}: not a revision; give a commit sha, branch or tag of {repo}")
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ConfigurationError(f"{what} {rev!r}: unknown revision in {repo}; give a commit sha, branch or tag "
                                 f"(`git -C {repo} log --oneline`)")
    return revision(repo, done.stdout.strip())


def check_order(repo: Path, good: Revision, bad: Revision, flags: tuple[str, str] = ("--good", "--bad")) -> None:
    """``good`` must be an ancestor of ``bad`` (ConfigurationError otherwise, naming them by ``flags``)."""
    ancestor = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good.sha, bad.sha],
                              capture_output=True, check=False)
    if ancestor.returncode != 0 or good.sha == bad.sha:
        raise ConfigurationError(f"{flags[0]} {good.short} is not an ancestor of {flags[1]} {bad.short}; give a good "
                                 f"revision older than the bad one")


def candidates(repo: Path, bad: str, goods: list[str]) -> list[str]:
    """The commits that may be the first bad one: reachable from ``bad`` and from none of ``goods`` (merges and
    side branches included, as ``git bisect`` counts them)."""
    return git(repo, "rev-list", bad, *[f"^{g}" for g in goods]).split()


def midpoints(repo: Path, bad: str, goods: list[str]) -> list[str]:
    """The candidates, best halving first (``git rev-list --bisect-all``), ``bad`` itself left out."""
    lines = git(repo, "rev-list", "--bisect-all", bad, *[f"^{g}" for g in goods]).splitlines()
    return [ln.split()[0] for ln in lines if ln and ln.split()[0] != bad]


def revision(repo: Path, sha: str) -> Revision:
    return Revision(sha, git(repo, "rev-parse", f"{sha}^{{tree}}"), git(repo, "log", "-1", "--format=%s", sha))


def cache_key(tree: str, checkpoint_digest: str, precision: str, platform: str) -> str:
    """A farm revision's probe: its tree, the checkpoint, the row."""
    return hashlib.sha256(json.dumps([tree, checkpoint_digest, precision, platform]).encode()).hexdigest()


def checkpoint_cache_key(tree: str, code_digest: str, precision: str, platform: str) -> str:
    """A checkpoint revision's probe: its tree, the farm's source that ran on it, the row."""
    return hashlib.sha256(json.dumps(["checkpoint", tree, code_digest, precision, platform]).encode()).hexdigest()


def version_cache_key(toolchain: str, version: str, checkpoint_digest: str, code_digest: str, precision: str,
                      platform: str) -> str:
    """A toolchain version's probe: the toolchain and version, the checkpoint, the farm's source, the row."""
    return hashlib.sha256(json.dumps(["toolchain", toolchain, version, checkpoint_digest, code_digest, precision,
                                      platform]).encode()).hexdigest()


def checkpoint_subdir(checkpoint: Path) -> str:
    """Where ``checkpoint`` is inside its git repository ('' at its top)."""
    return git(checkpoint, "rev-parse", "--show-prefix").rstrip("/")


def read_cached(cache_dir: Path | None, key: str) -> dict[str, Any] | None:
    if cache_dir is None or not (cache_dir / f"{key}.json").is_file():
        return None
    try:
        entry = json.loads((cache_dir / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key or entry.get("status") not in OUTCOMES:
        return None
    return entry


def write_cached(cache_dir: Path | None, key: str, result: ProbeResult) -> None:
    if cache_dir is None or result.status == "skip":  # a revision not judged is asked again next time
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(cache_dir / f"{key}.json", json.dumps({"key": key, **result.to_json()}))


def _steps(python: str, ckpt: Path, work: Path, precision: str, backend: str) -> list[tuple[str, list[str]]]:
    m = [python, "-m", "edgellm"]
    return [("export", [*m, "export", str(ckpt), str(work / "onnx"), "--precision", precision]),
            ("build", [*m, "build", str(work / "onnx"), str(work / "engine"), "--backend", backend]),
            ("eval", [*m, "eval", "--engine-dir", str(work / "engine"), "--checkpoint", str(ckpt),
                      "--output", str(work / "eval.json")])]


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_probe(repo: Path, rev: Revision, checkpoint: Path, precision: str, platform: str, *,
              cache_dir: Path | None = None, checkpoint_digest: str, python: str | None = None,
              steps: tuple[str, ...] = ("export", "build", "eval"), log: Any = None,
              code: Path | None = None, code_digest: str = "", subdir: str = "") -> ProbeResult:
    """Probe ``rev`` of ``repo`` (see the module doc): with ``code`` None, ``repo`` is the farm's and the probe runs
    the revision's code on ``checkpoint``; with ``code`` (the farm's checkout, whose source digest is
    ``code_digest``), ``repo`` is the checkpoint's and the probe runs that code on the revision's checkpoint (at
    ``subdir`` of the repository). The worktree and everything made in it are removed after."""
    key = (cache_key(rev.tree, checkpoint_digest, precision, platform) if code is None else
           checkpoint_cache_key(rev.tree, code_digest, precision, platform))
    if (hit := read_cached(cache_dir, key)) is not None:
        hit.pop("key")
        return ProbeResult(**{**hit, "revision": rev.sha, "subject": rev.subject, "cached": True})
    t0 = time.monotonic()
    result = ProbeResult(rev.sha, rev.subject, "good", 0.0)
    with tempfile.TemporaryDirectory(prefix=f"edgefarm-bisect-{rev.short}-") as tmp:
        tree, work = Path(tmp) / "src", Path(tmp) / "work"
        work.mkdir()
        made = subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), rev.sha],
                              capture_output=True, text=True, check=False)
        try:
            if made.returncode != 0:
                result = ProbeResult(rev.sha, rev.subject, "skip", 0.0, "worktree", made.returncode,
                                     _last_error(made.stderr))
            else:
                source = tree if code is None else code
                ckpt = checkpoint if code is None else tree / subdir
                env = {**os.environ, "PYTHONPATH": str(source), "HF_HUB_OFFLINE": "1",
                       "PYTHONDONTWRITEBYTECODE": "1"}
                for name, argv in _steps(python or sys.executable, ckpt, work, precision,
                                         PLATFORM_BACKENDS[platform]):
                    if name not in steps:
                        continue
                    try:
                        done = subprocess.run(argv, cwd=source, env=env, capture_output=True, text=True,
                                              timeout=STEP_TIMEOUT_S, check=False)
                    except subprocess.TimeoutExpired:
                        result = ProbeResult(rev.sha, rev.subject, "skip", 0.0, name, None,
                                             f"timed out after {STEP_TIMEOUT_S} s")
                        break
                    if log is not None:
                        log.info("probe %s: %s exit %s", rev.short, name, done.returncode)
                    if done.returncode != 0:
                        status = "skip" if done.returncode in SKIP_EXIT_CODES else "bad"
                        result = ProbeResult(rev.sha, rev.subject, status, 0.0, name, done.returncode,
                                             _last_error(done.stderr or done.stdout))
                        break
        finally:
            if made.returncode == 0:
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                               capture_output=True, check=False)
            subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True, check=False)
    result.seconds = round(time.monotonic() - t0, 2)
    write_cached(cache_dir, key, result)
    return result


def run_version_probe(toolchain: str, version: str, data_dir: Path, checkpoint: Path, precision: str, platform: str,
                      *, checkpoint_digest: str, code_digest: str, cache_dir: Path | None = None, wheels: Any = None,
                      log: Any = None) -> ProbeResult:
    """Probe ``version`` of ``toolchain`` (see the module doc): its environment installed (or found healthy) under
    ``data_dir``, then its stages of the row in a temporary directory. An install that fails is a skip (the
    version was not judged), as is an infrastructure or resource error of its stages; any other error is bad."""
    from edgefarm.toolchains.base import driver
    from edgellm.types import Precision

    subject = f"{toolchain} {version}"
    key = version_cache_key(toolchain, version, checkpoint_digest, code_digest, precision, platform)
    if (hit := read_cached(cache_dir, key)) is not None:
        hit.pop("key")
        return ProbeResult(**{**hit, "revision": version, "subject": subject, "cached": True})
    t0 = time.monotonic()
    found = driver(toolchain, data_dir)
    result = ProbeResult(version, subject, "good", 0.0)
    try:
        env = found.environment.install_version(version, wheels)
    except EdgeLLMError as exc:
        result = ProbeResult(version, subject, "skip", 0.0, "install", exc.kind.exit_code, _last_error(str(exc)))
    else:
        if log is not None:
            log.info("probe %s: environment %s", subject, env.path)
        with tempfile.TemporaryDirectory(prefix=f"edgefarm-bisect-{toolchain}-") as tmp:
            try:
                found.environment.probe_version(env, checkpoint, Path(tmp),
                                                Precision.parse(precision, what="precision"))
            except EdgeLLMError as exc:
                code = exc.kind.exit_code
                result = ProbeResult(version, subject, "skip" if code in SKIP_EXIT_CODES else "bad", 0.0,
                                     "stages", code, _last_error(str(exc)))
    if log is not None:
        log.info("probe %s: %s", subject, result.status)
    result.seconds = round(time.monotonic() - t0, 2)
    write_cached(cache_dir, key, result)
    return result
