"""``edgefarm bisect``'s flow: which commit of this repository made a checkpoint's row fail. Each probe is a task run
named ``probe <short sha> <subject>`` whose state says its outcome (Completed "Good", Failed "Bad", Completed
"Skipped"; "(cached)" in its message when its outcome came from the content cache); the probe itself is
tasks/bisect.py.

The endpoints are probed first (good must pass, bad must fail: else no probe changes the outcome), then the
candidates (reachable from the latest bad, from no good: side branches a merge brought in included) are halved the
way ``git bisect`` halves them (``git rev-list --bisect-all``); a skipped revision is stepped around (the next best
halving). At most ``max_probes`` probes run: past that the answer is the candidates left. The first bad commit's
parents are then all known good; ``last_good`` is its first parent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.states import Completed, Failed, State

from tasks.bisect import ProbeResult, Revision, candidates, midpoints, revision, run_probe

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


@task(cache_policy=NONE, retries=0)
def probe_revision(req: BisectRequest, rev: Revision) -> State:
    result = run_probe(Path(req.repo), rev, Path(req.checkpoint), req.precision, req.platform,
                       cache_dir=Path(req.cache_dir) if req.cache_dir else None,
                       checkpoint_digest=req.checkpoint_digest, python=req.python, steps=req.steps,
                       log=get_run_logger())
    data = result.to_json()
    message = (f"{result.status}{' (cached)' if result.cached else ''} in {result.seconds:.1f} s"
               + (f": {result.step} exit {result.exit_code}: {result.detail}" if result.step else ""))
    if result.status == "bad":
        return Failed(name=STATE_NAMES["bad"], message=message, data=data)
    return Completed(name=STATE_NAMES[result.status], message=message, data=data)


@dataclass
class _Search:
    req: BisectRequest
    probes: list[dict[str, Any]] = field(default_factory=list)

    def probe(self, rev: Revision) -> str:
        name = f"probe {rev.short} {rev.subject[:60]}"
        state = probe_revision.with_options(name="probe", task_run_name=name)(self.req, rev, return_state=True)
        data = state.result(raise_on_failure=False)
        if not isinstance(data, dict):  # the probe itself raised: a bug or an infrastructure failure
            data = ProbeResult(rev.sha, rev.subject, "skip", 0.0, "probe", None, str(data)).to_json()
        data["task_run"] = name
        data["state"] = state.name
        self.probes.append(data)
        return str(data["status"])


@flow(name="bisect", log_prints=False, validate_parameters=False)
def bisect(req: BisectRequest) -> dict[str, Any]:
    """Returns ``{first_bad, last_good, found, reason, probes, commits}`` (``found`` False: no answer, why in
    ``reason``)."""
    from tasks.bisect import git, resolve

    log = get_run_logger()
    repo = Path(req.repo)
    good, bad = resolve(repo, req.good, "--good"), resolve(repo, req.bad, "--bad")
    search = _Search(req)
    out: dict[str, Any] = {"good": good.sha, "bad": bad.sha, "commits": len(candidates(repo, bad.sha, [good.sha])),
                           "first_bad": None, "last_good": None, "found": False, "probes": search.probes}
    ends = {"good": search.probe(good), "bad": search.probe(bad)}
    if ends != {"good": "good", "bad": "bad"}:
        out["reason"] = (f"no probe changes the outcome: --good {good.short} is {ends['good']}, --bad {bad.short} "
                         f"is {ends['bad']} (expected good and bad)")
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
