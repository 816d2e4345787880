"""``edgefarm bisect``'s flows: which change of one input made a checkpoint's row fail. ``bisect`` halves the commits
of a git repository: this repository's (input ``revision``: each probe runs its commit's own code) or the
checkpoint's (input ``checkpoint``: each probe runs the farm's code on its commit of the checkpoint).
``bisect_versions`` halves a toolchain's installable versions between two (input ``toolchain``: each probe runs the
toolchain's stages of the row from an environment of that version). Each probe is a task run named ``probe <short
sha> <subject>``, ``probe checkpoint <short sha> <subject>`` or ``probe <toolchain> <version>``, whose state says its
outcome (Completed "Good", Failed "Bad", Completed "Skipped"; "(cached)" in its message when its outcome came from
the content cache); the probes themselves are tasks/bisect.py.

The endpoints are probed first (good must pass, bad must fail: else no probe changes the outcome), then the
candidates (reachable from the latest bad, from no good: side branches a merge brought in included) are halved the
way ``git bisect`` halves them (``git rev-list --bisect-all``); a skipped revision is stepped around (the next best
halving). Versions are a line (oldest to newest, or the other way when a downgrade broke the row): halved, a skipped
one stepped around by its nearest untried neighbour. At most ``max_probes`` probes run: past that the answer is the
candidates left. The first bad commit's parents are then all known good; ``last_good`` is its first parent (of a
version: the one before it on the line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.states import Completed, Failed, State

from edgefarm.tasks.bisect import ProbeResult, Revision, candidates, midpoints, revision, run_probe, run_version_probe

STATE_NAMES = {"good": "Good", "bad": "Bad", "skip": "Skipped"}


@dataclass(frozen=True)
class BisectRequest:
    repo: str
    checkpoint: str
    checkpoint_digest: str
    precision: str
    platform: str
    good: str  # full shas, resolved before the flow starts (bad input is refused there)
    bad: str
    max_probes: int = 16
    cache_dir: str | None = None
    steps: tuple[str, ...] = ("export", "build", "eval")
    python: str | None = None
    input: str = "revision"  # or "checkpoint": ``repo`` is then the checkpoint's, ``code`` the farm's checkout
    code: str | None = None
    code_digest: str = ""
    subdir: str = ""  # the checkpoint inside its repository ("": at its top)


@dataclass(frozen=True)
class VersionBisectRequest:
    toolchain: str
    versions: tuple[str, ...]  # from the good end to the bad one, both included (resolved before the flow starts)
    data_dir: str  # the toolchain's environments go under <data_dir>/toolchains
    checkpoint: str
    checkpoint_digest: str
    code_digest: str
    precision: str
    platform: str
    max_probes: int = 16
    cache_dir: str | None = None


def _state(result: ProbeResult) -> State:
    data = result.to_json()
    message = (f"{result.status}{' (cached)' if result.cached else ''} in {result.seconds:.1f} s"
               + (f": {result.step} exit {result.exit_code}: {result.detail}" if result.step else ""))
    if result.status == "bad":
        return Failed(name=STATE_NAMES["bad"], message=message, data=data)
    return Completed(name=STATE_NAMES[result.status], message=message, data=data)


@task(cache_policy=NONE, retries=0)
def probe_revision(req: BisectRequest, rev: Revision) -> State:
    code = Path(req.code) if req.code else None
    return _state(run_probe(Path(req.repo), rev, Path(req.checkpoint), req.precision, req.platform,
                            cache_dir=Path(req.cache_dir) if req.cache_dir else None,
                            checkpoint_digest=req.checkpoint_digest, python=req.python, steps=req.steps,
                            log=get_run_logger(), code=code, code_digest=req.code_digest, subdir=req.subdir))


@task(cache_policy=NONE, retries=0)
def probe_version(req: VersionBisectRequest, version: str) -> State:
    from edgefarm.flows.settings import Settings

    wheels = Settings.resolve(data_dir=req.data_dir, create=False).toolchain_wheels()  # as `toolchains install`
    return _state(run_version_probe(req.toolchain, version, Path(req.data_dir), Path(req.checkpoint), req.precision,
                                    req.platform, checkpoint_digest=req.checkpoint_digest,
                                    code_digest=req.code_digest,
                                    cache_dir=Path(req.cache_dir) if req.cache_dir else None, wheels=wheels,
                                    log=get_run_logger()))


@dataclass
class _Search:
    req: BisectRequest | VersionBisectRequest
    probes: list[dict[str, Any]] = field(default_factory=list)

    def probe(self, rev: Revision) -> str:
        assert isinstance(self.req, BisectRequest)
        what = "checkpoint " if self.req.input == "checkpoint" else ""
        name = f"probe {what}{rev.short} {rev.subject[:60]}"
        state = probe_revision.with_options(name="probe", task_run_name=name)(self.req, rev, return_state=True)
        return self._keep(state, name, rev.sha, rev.subject)

    def probe_version(self, version: str) -> str:
        assert isinstance(self.req, VersionBisectRequest)
        subject = f"{self.req.toolchain} {version}"
        state = probe_version.with_options(name="probe", task_run_name=f"probe {subject}")(self.req, version,
                                                                                          return_state=True)
        return self._keep(state, f"probe {subject}", version, subject)

    def _keep(self, state: State, name: str, probed: str, subject: str) -> str:
        data = state.result(raise_on_failure=False)
        if not isinstance(data, dict):  # the probe itself raised: a bug or an infrastructure failure
            data = ProbeResult(probed, subject, "skip", 0.0, "probe", None, str(data)).to_json()
        data["task_run"] = name
        data["state"] = state.name
        self.probes.append(data)
        return str(data["status"])


@flow(name="bisect", log_prints=False, validate_parameters=False)
def bisect(req: BisectRequest) -> dict[str, Any]:
    """Returns ``{first_bad, last_good, found, reason, probes, commits}`` (``found`` False: no answer, why in
    ``reason``)."""
    from edgefarm.tasks.bisect import git, resolve

    log = get_run_logger()
    repo = Path(req.repo)
    good, bad = resolve(repo, req.good, "--good"), resolve(repo, req.bad, "--bad")
    search = _Search(req)
    out: dict[str, Any] = {"input": req.input, "good": good.sha, "bad": bad.sha,
                           "commits": len(candidates(repo, bad.sha, [good.sha])),
                           "first_bad": None, "last_good": None, "found": False, "probes": search.probes}
    ends = {"good": search.probe(good), "bad": search.probe(bad)}
    if ends != {"good": "good", "bad": "bad"}:
        g, b = ("good checkpoint revision", "bad checkpoint revision") if req.input == "checkpoint" else \
            ("--good", "--bad")
        out["reason"] = (f"no probe changes the outcome: {g} {good.short} is {ends['good']}, {b} {bad.short} is "
                         f"{ends['bad']} (expected good and bad)")
        return out
    first_bad, goods, skipped = bad.sha, [good.sha], set()
    while len(left := candidates(repo, first_bad, goods)) > 1 and len(search.probes) < req.max_probes:
        pick = next((sha for sha in midpoints(repo, first_bad, goods) if sha not in skipped), None)
        if pick is None:
            break
        rev = revision(repo, pick)
        status = search.probe(rev)
        log.info("%s is %s (%d candidates were left)", rev.short, status, len(left))
        if status == "good":
            goods.append(pick)
        elif status == "bad":
            first_bad = pick
        else:
            skipped.add(pick)
    left = candidates(repo, first_bad, goods)
    if len(left) == 1:
        found = revision(repo, first_bad)
        out.update(first_bad=found.sha, first_bad_subject=found.subject, found=True, reason=None,
                   last_good=git(repo, "rev-parse", f"{found.sha}^"))
    else:
        out["candidates"] = left
        out["reason"] = (f"{len(left)} candidate(s) left after {len(search.probes)} probe(s) ("
                         + ("--max-probes reached" if len(search.probes) >= req.max_probes else
                            "the rest were skipped") + ")")
    return out


def _nearest_untried(lo: int, hi: int, tried: set[int]) -> int | None:
    """The untried index strictly between ``lo`` and ``hi`` nearest their middle (a halving, or the next best)."""
    middle = (lo + hi) / 2
    left = [i for i in range(lo + 1, hi) if i not in tried]
    return min(left, key=lambda i: (abs(i - middle), i)) if left else None


@flow(name="bisect-versions", log_prints=False, validate_parameters=False)
def bisect_versions(req: VersionBisectRequest) -> dict[str, Any]:
    """Returns ``{input, toolchain, good, bad, versions, first_bad, last_good, found, reason, probes}``; a
    probe's ``revision`` is the version it probed."""
    log = get_run_logger()
    versions = list(req.versions)
    search = _Search(req)
    good, bad = versions[0], versions[-1]
    out: dict[str, Any] = {"input": "toolchain", "toolchain": req.toolchain, "good": good, "bad": bad,
                           "versions": versions, "first_bad": None, "last_good": None, "found": False,
                           "probes": search.probes}
    ends = {"good": search.probe_version(good), "bad": search.probe_version(bad)}
    if ends != {"good": "good", "bad": "bad"}:
        out["reason"] = (f"no probe changes the outcome: {req.toolchain} {good} is {ends['good']}, {bad} is "
                         f"{ends['bad']} (expected good and bad)")
        return out
    lo, hi, tried = 0, len(versions) - 1, set()
    while hi - lo > 1 and len(search.probes) < req.max_probes:
        pick = _nearest_untried(lo, hi, tried)
        if pick is None:
            break
        tried.add(pick)
        status = search.probe_version(versions[pick])
        log.info("%s %s is %s (%d candidates were left)", req.toolchain, versions[pick], status, hi - lo)
        if status == "good":
            lo = pick
        elif status == "bad":
            hi = pick
    if hi - lo == 1:
        out.update(first_bad=versions[hi], first_bad_subject=f"{req.toolchain} {versions[hi]}",
                   last_good=versions[lo], found=True, reason=None)
    else:
        out["candidates"] = versions[lo + 1:hi + 1]
        out["reason"] = (f"{hi - lo} candidate version(s) left after {len(search.probes)} probe(s) ("
                         + ("--max-probes reached" if len(search.probes) >= req.max_probes else
                            "the rest were skipped") + ")")
    return out
