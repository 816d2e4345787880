"""``edgefarm bisect``: which change made a checkpoint's row fail, bisected for each input that changed
(flows/bisect.py; the probes: tasks/bisect.py): this repository's commits (``--good/--bad REV``: each probed
commit's own ``edgellm export -> build -> eval``), a toolchain's versions (``--toolchain NAME --good-version V
--bad-version V``: each probed version installed into an environment of its own, the toolchain's stages of the row
run with it), the checkpoint's commits (``--checkpoint-good-rev/--checkpoint-bad-rev REV`` of a checkpoint
directory that is a git repository: the farm's code run on each probed commit of it). With ``--row``, the ends are
two runs of the row in the results database, and every input that changed between them (the results record the
farm's revision, the toolchain versions and the checkpoint's digest) is bisected in turn. Exit codes: 0 found
(with several inputs: one was), 1 no answer (no probe changes the outcome, or --max-probes reached), 2 bad input
(the message names the value and what is valid), 3 infrastructure failure."""

from __future__ import annotations

import dataclasses
import functools
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from edgefarm.cli.common import DataDirOption, DbOption, configure_prefect, err, farm_errors, out

STEPS = ("export", "build", "eval")
RowKey = tuple[str, str, str]


@dataclass(frozen=True)
class Ask:
    """What every bisection of one command shares: the checkpoint, the row's precision and platform, the bounds."""

    checkpoint: Path
    precision: str
    platform: str
    max_probes: int
    steps: tuple[str, ...]
    repo: Path | None  # --repo: this repository (default: the one holding the current directory)
    data_dir: Path
    cache: bool

    @functools.cached_property
    def digest(self) -> str:
        """The checkpoint's digest (read once: it hashes every file)."""
        from edgellm.reference import checkpoint_digest

        return checkpoint_digest(self.checkpoint)

    @property
    def cache_dir(self) -> str | None:
        return str(self.data_dir / "bisect-cache") if self.cache else None


@dataclass(frozen=True)
class Job:
    """One bisection of a command: the input it bisects (``results.bisections.INPUTS``), its flow's request, and
    the ends as given."""

    input: str
    req: Any  # flows.bisect.BisectRequest or VersionBisectRequest
    good_ref: str
    bad_ref: str


def _validate(checkpoint: Path, precision: str, platform: str, output: Path, max_probes: int, steps: str, *,
              host_probes: bool = True) -> tuple[str, ...]:
    """Every problem of the request at once (ConfigurationError, exit 2); returns the steps. ``host_probes``: the
    probes run edgellm on this host (commits of this repository or of the checkpoint), so the platform must be one
    this host probes."""
    from edgefarm.tasks.bisect import PLATFORM_BACKENDS
    from edgellm.errors import ConfigurationError
    from edgellm.types import Precision

    problems = []
    if not checkpoint.is_dir() or not (checkpoint / "config.json").is_file():
        problems.append(f"--checkpoint {checkpoint}: not a checkpoint directory (no config.json)")
    try:
        Precision.parse(precision, what="precision")
    except ConfigurationError as exc:
        problems.append(f"--precision: {exc}")
    if host_probes and platform not in PLATFORM_BACKENDS:
        problems.append(f"--platform {platform!r}: a --checkpoint bisect probes on this host; valid: "
                        f"{', '.join(PLATFORM_BACKENDS)}")
    if not output.parent.is_dir():
        problems.append(f"--output {output}: directory {output.parent} not found")
    if max_probes < 2:
        problems.append(f"--max-probes {max_probes}: the two ends take 2; valid: an integer >= 2")
    wanted = tuple(s.strip() for s in steps.split(",") if s.strip())
    if not wanted or any(s not in STEPS for s in wanted):
        problems.append(f"--steps {steps!r}: valid: a comma-separated subset of {', '.join(STEPS)}")
    if problems:
        raise ConfigurationError("bad bisect request:\n" + "\n".join(problems))
    return wanted


def _toplevel(where: Path) -> Path | None:
    top = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                         check=False)
    return Path(top.stdout.strip()) if top.returncode == 0 else None


def _farm_repo(repo: Path | None) -> Path:
    from edgellm.errors import ConfigurationError

    where = repo or Path.cwd()
    top = _toplevel(where)
    if top is None:
        raise ConfigurationError(f"bad bisect request:\n--repo {where}: not a git repository")
    return top


# --- one job per input ----------------------------------------------------------------------------------------------

def _revision_job(ask: Ask, good: str, bad: str, given: tuple[str, str] | None = None) -> Job:
    """This repository's commits between ``good`` and ``bad`` (resolved and ordered here, before any probe)."""
    from edgefarm.flows.bisect import BisectRequest
    from edgefarm.tasks.bisect import check_order, resolve

    top = _farm_repo(ask.repo)
    g, b = resolve(top, good, "--good"), resolve(top, bad, "--bad")
    check_order(top, g, b)
    req = BisectRequest(repo=str(top), checkpoint=str(ask.checkpoint.resolve()),
                        checkpoint_digest=ask.digest, precision=ask.precision,
                        platform=ask.platform, good=g.sha, bad=b.sha, max_probes=ask.max_probes,
                        cache_dir=ask.cache_dir, steps=ask.steps)
    return Job("revision", req, *(given or (good, bad)))


def _checkpoint_repo(checkpoint: Path) -> Path:
    from edgellm.errors import ConfigurationError

    top = _toplevel(checkpoint)
    if top is None:
        raise ConfigurationError(f"--checkpoint {checkpoint}: not in a git repository, so its revisions cannot be "
                                 f"bisected (a Hugging Face model repository cloned with git is one)")
    return top


def _checkpoint_job(ask: Ask, good: str, bad: str) -> Job:
    """The checkpoint's commits between ``good`` and ``bad``; each probe runs the farm's code (--repo's checkout,
    default: the one running) on its commit of the checkpoint."""
    from edgefarm.flows.bisect import BisectRequest
    from edgefarm.flows.revision import ROOT, source_digest
    from edgefarm.tasks.bisect import check_order, checkpoint_subdir, resolve

    flags = ("--checkpoint-good-rev", "--checkpoint-bad-rev")
    repo = _checkpoint_repo(ask.checkpoint)
    g, b = resolve(repo, good, flags[0]), resolve(repo, bad, flags[1])
    check_order(repo, g, b, flags)
    code = _farm_repo(ask.repo) if ask.repo is not None else ROOT
    req = BisectRequest(repo=str(repo), checkpoint=str(ask.checkpoint.resolve()),
                        checkpoint_digest=ask.digest, precision=ask.precision,
                        platform=ask.platform, good=g.sha, bad=b.sha, max_probes=ask.max_probes,
                        cache_dir=ask.cache_dir, steps=ask.steps, input="checkpoint", code=str(code),
                        code_digest=source_digest(code), subdir=checkpoint_subdir(ask.checkpoint))
    return Job("checkpoint", req, good, bad)


def _version_job(ask: Ask, toolchain: str, good: str, bad: str) -> Job:
    """``toolchain``'s installable versions from ``good`` to ``bad`` (listed, and the ends checked, here)."""
    from edgefarm.flows.bisect import VersionBisectRequest
    from edgefarm.flows.revision import current
    from edgefarm.toolchains.base import driver, parse, version_probing
    from edgefarm.toolchains.venvs import between
    from edgellm.errors import ConfigurationError
    from edgellm.types import Precision

    name = parse(toolchain, what="--toolchain")
    if name not in version_probing():
        raise ConfigurationError(f"--toolchain {name}: its versions cannot be bisected (it has no environment per "
                                 f"version: it runs the farm's own code or environment); toolchains whose versions "
                                 f"can: {', '.join(version_probing()) or 'none'}")
    found = driver(name, ask.data_dir)
    if (problem := found.precision_problem(Precision.parse(ask.precision, what="precision"))) is not None:
        raise ConfigurationError(f"--precision {ask.precision}: {problem}")
    versions = between(found.environment.installable_versions(), good, bad, toolchain=name)
    req = VersionBisectRequest(toolchain=name, versions=tuple(versions), data_dir=str(ask.data_dir),
                               checkpoint=str(ask.checkpoint.resolve()),
                               checkpoint_digest=ask.digest, code_digest=current().source,
                               precision=ask.precision, platform=ask.platform, max_probes=ask.max_probes,
                               cache_dir=ask.cache_dir)
    return Job("toolchain", req, good, bad)


# --- the row form: what changed between two runs --------------------------------------------------------------------

def _row_jobs(row: RowKey, good: str, bad: str, ask: Ask, db: str | None, ckpt_good: str | None,
              ckpt_bad: str | None) -> tuple[list[Job], dict[str, object]]:
    """--row: what changed between the two runs (from the results database), and a job for each changed input
    that can be bisected; why the others cannot (the ends read from the runs included: a commit this checkout lacks,
    a version pip's index does not offer) is in the facts (``not_bisected``). None that can is ConfigurationError
    naming each; a bad --checkpoint-good-rev/--checkpoint-bad-rev is ConfigurationError at once."""
    from edgefarm.flows.settings import Settings
    from edgefarm.results.db import read_only_engine
    from edgefarm.results.row_inputs import changed, row_inputs
    from edgefarm.toolchains.base import names, version_probing
    from edgellm.errors import ConfigurationError

    runs = []
    for flag, value in (("--good", good), ("--bad", bad)):
        if not value.isdigit() or int(value) < 1:
            raise ConfigurationError(f"{flag} {value!r}: with --row, a run id (an integer >= 1)")
        runs.append(int(value))
    settings = Settings.resolve(db=db, data_dir=ask.data_dir, create=False)
    engine = read_only_engine(settings.db_url)
    sides = [row_inputs(engine, run, *row) for run in runs]
    diff = changed(*sides)
    facts: dict[str, object] = {"row": list(row), "runs": [s.to_json() for s in sides], "changed": diff}
    if sides[0].status != "pass" or sides[1].status != "fail":
        raise ConfigurationError(f"row {' '.join(row)}: run {runs[0]} is {sides[0].status} and run {runs[1]} is "
                                 f"{sides[1].status}; --good needs a passing run of the row, --bad a failing one")
    want = sides[1].checkpoint_sha256
    if want is not None and ask.digest != want:
        raise ConfigurationError(f"--checkpoint {ask.checkpoint}: its digest is not the row's checkpoint "
                                 f"{want[:16]}... in run {runs[1]}; give that checkpoint's directory")
    jobs: list[Job] = []
    notes: dict[str, str] = {}
    given = (str(runs[0]), str(runs[1]))
    if "revision" not in diff:
        notes["revision"] = f"the farm's revision is the same in runs {runs[0]} and {runs[1]}"
    else:
        revs = [s.revision or "" for s in sides]
        dirty = [r for r in revs if not r or r.endswith("-dirty") or r.startswith("edgellm-")]
        if dirty:
            notes["revision"] = (f"run revision {dirty[0]!r} is no commit that can be checked out (uncommitted "
                                 f"changes or an installed package); bisect between commits with --good/--bad REV")
        else:
            try:
                jobs.append(_revision_job(ask, revs[0], revs[1], given))
            except ConfigurationError as exc:  # e.g. a commit this checkout does not have
                notes["revision"] = str(exc)
    used = set(sides[0].used) | set(sides[1].used)
    for key, (was, now) in diff.items():
        if not key.startswith("toolchain:"):
            continue
        name = key.removeprefix("toolchain:")
        if name not in used:
            notes[key] = f"the row's stages did not run {name}"
        elif name not in names() or name not in version_probing():
            notes[key] = (f"{name}'s versions cannot be bisected (no environment per version): its change is "
                          f"the farm's, bisected with the farm's commits")
        elif not was or not now:
            notes[key] = f"{name} ran in one run only ({was or 'absent'} -> {now or 'absent'})"
        else:
            try:
                job = _version_job(ask, name, str(was), str(now))
            except ConfigurationError as exc:  # e.g. a recorded version pip's index does not offer
                notes[key] = " ".join(str(exc).split())
                continue
            jobs.append(dataclasses.replace(job, good_ref=given[0], bad_ref=given[1]))
    if "checkpoint_sha256" in diff or ckpt_good or ckpt_bad:
        if ckpt_good is None:
            notes["checkpoint"] = ("the checkpoint's digest changed; the results record no git revision of it: give "
                                   "--checkpoint-good-rev REV (a commit of the checkpoint's repository whose content "
                                   "is the good run's) to bisect its commits")
        else:
            job = _checkpoint_job(ask, ckpt_good, ckpt_bad or "HEAD")
            jobs.append(dataclasses.replace(job, good_ref=ckpt_good, bad_ref=ckpt_bad or "HEAD"))
    facts["not_bisected"] = notes
    if not jobs:
        raise ConfigurationError(f"nothing that changed between runs {runs[0]} and {runs[1]} can be bisected: "
                                 + "; ".join(f"{k}: {v}" for k, v in notes.items()))
    return jobs, facts


def _catalog_checkpoint(model: str, data_dir: Path | None) -> Path:
    """The catalog's checkpoint of ``model``, located as a run locates it (a synthetic one made)."""
    from edgefarm.cli.common import check_name
    from edgefarm.flows.settings import Settings
    from edgefarm.test_lists.catalog import Catalog

    sources = Catalog.load().sources
    check_name("model", model, sources)
    return Path(sources[model].locate(Settings.resolve(data_dir=data_dir).data_dir))


# --- running and recording --------------------------------------------------------------------------------------------

def _run_flow(job: Job, facts: dict[str, object]) -> dict[str, Any]:
    from edgefarm.cli.running import announce_flow_run
    from edgefarm.flows.bisect import bisect, bisect_versions

    req = job.req
    head: dict[str, Any] = {"checkpoint": req.checkpoint, "checkpoint_sha256": req.checkpoint_digest,
                            "precision": req.precision, "platform": req.platform}
    if job.input == "toolchain":
        result = announce_flow_run(bisect_versions)(req)
    else:
        result = announce_flow_run(bisect)(req)
        head["repo"] = req.repo
        if req.code:
            head["code"] = req.code
    return {**head, **facts, **result}


def _run_jobs(jobs: list[Job], facts: dict[str, object], budget: int) -> list[dict[str, Any]]:
    """Each job in turn, the probes shared out of ``budget``; a job the budget cannot start (2 probes) says so."""
    answers = []
    left = budget
    for job in jobs:
        if left < 2:
            answers.append({"input": job.input, **facts, "found": False, "first_bad": None, "probes": [],
                            "reason": f"--max-probes {budget} spent on the bisections before"})
            continue
        answer = _run_flow(dataclasses.replace(job, req=dataclasses.replace(job.req, max_probes=left)), facts)
        answer["_job"] = job
        left -= len(answer["probes"])
        answers.append(answer)
    return answers


def _combined(answers: list[dict[str, Any]], facts: dict[str, object]) -> dict[str, Any]:
    """One answer as it is; several as ``{..facts, bisections: [...], found}`` (found: one input explains it)."""
    clean = [{k: v for k, v in a.items() if k != "_job"} for a in answers]
    if len(clean) == 1:
        return clean[0]
    inner = [{k: v for k, v in a.items() if k not in facts} for a in clean]
    found = [a for a in clean if a.get("found")]
    return {**facts, "bisections": inner, "found": bool(found),
            "reason": None if found else "; ".join(f"{a['input']}: {a.get('reason')}" for a in clean)}


def _record(db_url: str, answer: dict[str, Any], good_ref: str, bad_ref: str, row: RowKey | None,
            runs: tuple[int, int] | None = None) -> None:
    """The answer into the results database (``results.bisections``), with the row and its runs when known."""
    from edgefarm.results.bisections import from_answer, record_bisection
    from edgefarm.results.db import make_engine

    sides = answer.get("runs") or []  # the row form's two runs (results.row_inputs.RowInputs.to_json)
    toolchain = sides[-1].get("job_toolchain") if sides else None
    engine = make_engine(db_url)
    try:
        answer["bisection_id"] = record_bisection(engine, from_answer(
            answer, good_ref=good_ref, bad_ref=bad_ref, row=row, toolchain=toolchain,
            good_run_id=runs[0] if runs else None, bad_run_id=runs[1] if runs else None))
    finally:
        engine.dispose()


def first_bad_line(answer: dict[str, Any]) -> str:
    """``first bad: ...`` of a found answer, as the command prints it (short shas)."""
    if answer.get("input") == "toolchain":
        return f"first bad: {answer['first_bad_subject']} (last good {answer['last_good']})"
    what = "checkpoint revision " if answer.get("input") == "checkpoint" else ""
    return f"first bad: {what}{answer['first_bad'][:7]} {answer['first_bad_subject']}"


def _print(answer: dict[str, Any]) -> None:
    for p in answer["probes"]:
        name = p["subject"] if answer.get("input") == "toolchain" else f"{p['revision'][:7]} {p['subject'][:70]}"
        out.print(f"{p['status']:<5} {p['seconds']:7.1f} s{' cached' if p['cached'] else ''}  {name}", markup=False)
    if answer.get("found"):
        out.print(first_bad_line(answer), markup=False)
    else:
        err.print(f"edgefarm bisect: no answer ({answer.get('input', 'revision')}): {answer['reason']}", markup=False)


def _regressions(run: int | None, output: Path, max_probes: int, steps: str, repo: Path | None, cache: bool,
                 db: str | None, data_dir: Path | None) -> None:
    """--bisect-regressions: each newly failing row of a nightly bisected in turn (each input that changed), the
    probes shared out of --max-probes; a row that cannot be bisected (nothing bisectable changed, no checkpoint)
    says why in its entry."""
    from edgefarm.cli.running import temporary_server
    from edgefarm.flows.settings import Settings
    from edgefarm.results.db import read_only_engine
    from edgefarm.results.row_inputs import newly_failing
    from edgellm.errors import ConfigurationError

    settings = Settings.resolve(db=db, data_dir=data_dir)
    before, now, rows = newly_failing(read_only_engine(settings.db_url), run)
    answers: list[dict[str, Any]] = []
    left = max_probes
    configure_prefect(settings.data_dir)
    with temporary_server(settings.data_dir):
        for row in rows:
            entry: dict[str, Any] = {"row": list(row)}
            try:
                if left < 2:
                    raise ConfigurationError(f"--max-probes {max_probes} spent on the rows before")
                checkpoint = _catalog_checkpoint(row[0], data_dir)
                wanted = _validate(checkpoint, row[1], row[2], output, left, steps)
                ask = Ask(checkpoint, row[1], row[2], left, wanted, repo, settings.data_dir, cache)
                jobs, facts = _row_jobs(row, str(before), str(now), ask, db, None, None)
                done = _run_jobs(jobs, facts, left)
                left -= sum(len(a["probes"]) for a in done)
                for a in done:
                    if "_job" in a:
                        _record(settings.db_url, a, a["_job"].good_ref, a["_job"].bad_ref, row, (before, now))
                entry.update(_combined(done, facts))
            except ConfigurationError as exc:
                entry.update(found=False, reason=str(exc))
            answers.append(entry)
            for a in entry.get("bisections") or [entry]:
                out.print(f"{' '.join(row)}: " + (first_bad_line(a).replace("first bad: ", "first bad ", 1)
                                                  if a.get("found") else f"no answer: {a['reason']}"), markup=False)
    output.write_text(json.dumps({"previous_run": before, "run": now, "rows": answers}, indent=2) + "\n")
    if not rows:
        out.print(f"no row newly fails in nightly run {now} (against run {before})", markup=False)
    raise typer.Exit(0 if all(a.get("found") for a in answers) else 1)


def _explicit_jobs(ask: Ask, good: str | None, bad: str | None, toolchain: str | None, good_version: str | None,
                   bad_version: str | None, ckpt_good: str | None, ckpt_bad: str | None) -> list[Job]:
    """The bisections the flags ask for: each pair complete, at least one."""
    from edgellm.errors import ConfigurationError

    problems = []
    if (good is None) != (bad is None):
        problems.append(f"{'--good' if good is None else '--bad'} is missing: give both ends (revisions of this "
                        f"repository)")
    version_flags = {"--toolchain": toolchain, "--good-version": good_version, "--bad-version": bad_version}
    if any(v is not None for v in version_flags.values()) and any(v is None for v in version_flags.values()):
        problems.append(f"{', '.join(f for f, v in version_flags.items() if v is None)} missing: a toolchain's "
                        f"versions are bisected with --toolchain NAME --good-version V --bad-version V")
    if (ckpt_good is None) != (ckpt_bad is None):
        problems.append(f"{'--checkpoint-good-rev' if ckpt_good is None else '--checkpoint-bad-rev'} is missing: "
                        f"give both ends (revisions of the checkpoint's repository)")
    if problems:
        raise ConfigurationError("bad bisect request:\n" + "\n".join(problems))
    jobs = []
    if good is not None and bad is not None:
        jobs.append(_revision_job(ask, good, bad))
    if toolchain is not None and good_version is not None and bad_version is not None:
        jobs.append(_version_job(ask, toolchain, good_version, bad_version))
    if ckpt_good is not None and ckpt_bad is not None:
        jobs.append(_checkpoint_job(ask, ckpt_good, ckpt_bad))
    if not jobs:
        raise ConfigurationError("nothing to bisect: give --good/--bad REV (this repository's commits), --toolchain "
                                 "NAME --good-version V --bad-version V (its versions), --checkpoint-good-rev/"
                                 "--checkpoint-bad-rev REV (the checkpoint's commits), --row with two run ids, or "
                                 "--bisect-regressions")
    return jobs


def bisect(
    output: Annotated[Path, typer.Option("--output", help="write the JSON answer here", dir_okay=False)],
    good: Annotated[str | None, typer.Option("--good", help="a revision of this repository whose pipeline passes "
                                                            "(with --row: a run id)")] = None,
    bad: Annotated[str | None, typer.Option("--bad", help="a later revision whose pipeline fails (with --row: a run "
                                                          "id)")] = None,
    checkpoint: Annotated[Path | None, typer.Option("--checkpoint", help="a Hugging Face checkpoint directory (with "
                                                                         "--row: default, the catalog's checkpoint "
                                                                         "of the row's model)")] = None,
    precision: Annotated[str | None, typer.Option("--precision", help="the export precision (fp32, fp16, int4_awq "
                                                                      "...); with --row, the row's")] = None,
    platform: Annotated[str, typer.Option("--platform", help="where the probes run: x86-cpu")] = "x86-cpu",
    row: Annotated[tuple[str, str, str] | None, typer.Option("--row", help="MODEL PRECISION PLATFORM: bisect what "
                                                                          "changed between two runs of this row")
                   ] = None,
    toolchain: Annotated[str | None, typer.Option("--toolchain", help="bisect this toolchain's versions between "
                                                                      "--good-version and --bad-version")] = None,
    good_version: Annotated[str | None, typer.Option("--good-version", help="a version of --toolchain whose stages "
                                                                            "pass")] = None,
    bad_version: Annotated[str | None, typer.Option("--bad-version", help="a version of --toolchain whose stages "
                                                                          "fail")] = None,
    ckpt_good: Annotated[str | None, typer.Option("--checkpoint-good-rev", help="a commit of the checkpoint's git "
                                                                                "repository that passes (with "
                                                                                "--row: the good run's)")] = None,
    ckpt_bad: Annotated[str | None, typer.Option("--checkpoint-bad-rev", help="a later commit of it that fails "
                                                                              "(with --row: default HEAD)")] = None,
    max_probes: Annotated[int, typer.Option("--max-probes", help="at most this many probes (the ends count), for "
                                                                 "all the bisections of the command")] = 16,
    steps: Annotated[str, typer.Option("--steps", help="which steps of each revision run")] = ",".join(STEPS),
    repo: Annotated[Path | None, typer.Option("--repo", help="the repository (default: the one holding the "
                                                             "current directory)", file_okay=False)] = None,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="reuse probe outcomes by content")] = True,
    regressions: Annotated[bool, typer.Option("--bisect-regressions", help="after a nightly: bisect every row that "
                                                                          "fails in it and passed in the nightly "
                                                                          "before (--max-probes: for them all)")
                           ] = False,
    run: Annotated[int | None, typer.Option("--run", help="with --bisect-regressions: that nightly run (default: "
                                                          "the latest finished)")] = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Bisect what made a checkpoint's pipeline fail: this repository's commits (--good/--bad REV: each probed
    revision's own export -> build -> eval, in a worktree of it), a toolchain's versions (--toolchain NAME
    --good-version V --bad-version V: each in an environment of its own) or the checkpoint's commits
    (--checkpoint-good-rev/--checkpoint-bad-rev REV). With --row, --good and --bad are two runs of that row in the
    results database, and every input that changed between them is bisected."""
    with farm_errors("bisect"):
        from edgefarm.cli.running import temporary_server
        from edgefarm.flows.settings import Settings
        from edgellm.errors import ConfigurationError

        if regressions:
            _regressions(run, output, max_probes, steps, repo, cache, db, data_dir)
            return
        if row is not None:
            if good is None or bad is None:
                raise ConfigurationError(f"{'--good' if good is None else '--bad'} is missing: with --row, give "
                                         f"both ends as run ids")
            if precision is not None and precision != row[1]:
                raise ConfigurationError(f"--precision {precision!r} is not the row's {row[1]!r}; leave it out")
            if toolchain or good_version or bad_version:
                raise ConfigurationError("--toolchain, --good-version and --bad-version are read from the two runs "
                                         "with --row; leave them out")
            precision, platform = row[1], row[2]
        if precision is None:
            raise ConfigurationError("--precision is missing: give the export precision (fp32, fp16, int4_awq ...)")
        if checkpoint is None:
            if row is None:
                raise ConfigurationError("--checkpoint is missing: give a checkpoint directory (or --row MODEL "
                                         "PRECISION PLATFORM for a catalog model's)")
            checkpoint = _catalog_checkpoint(row[0], data_dir)
        only_versions = row is None and good is None and ckpt_good is None and ckpt_bad is None and \
            toolchain is not None
        wanted = _validate(checkpoint, precision, platform, output, max_probes, steps, host_probes=not only_versions)
        settings = Settings.resolve(db=db, data_dir=data_dir)
        ask = Ask(checkpoint, precision, platform, max_probes, wanted, repo, settings.data_dir, cache)
        facts: dict[str, object] = {}
        if row is not None:
            assert good is not None and bad is not None
            jobs, facts = _row_jobs(row, good, bad, ask, db, ckpt_good, ckpt_bad)
        else:
            jobs = _explicit_jobs(ask, good, bad, toolchain, good_version, bad_version, ckpt_good, ckpt_bad)
        configure_prefect(settings.data_dir)
        with temporary_server(settings.data_dir):
            answers = _run_jobs(jobs, facts, max_probes)
        for a in answers:
            job = a.get("_job")
            if job is None:
                continue
            if row is not None:
                assert good is not None and bad is not None
                _record(settings.db_url, a, job.good_ref, job.bad_ref, row, (int(good), int(bad)))
            elif db is not None:  # a --checkpoint bisection is recorded where a database is named
                _record(settings.db_url, a, job.good_ref, job.bad_ref, None)
        result = _combined(answers, facts)
        output.write_text(json.dumps(result, indent=2) + "\n")
    for a in answers:
        _print(a)
    raise typer.Exit(0 if result["found"] else 1)
