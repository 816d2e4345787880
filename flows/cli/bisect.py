"""``edgefarm bisect``: the first commit of this repository whose own ``edgellm export -> build -> eval`` fails on a
checkpoint that an older commit passed (flows/bisect.py; a probe: tasks/bisect.py). Exit codes: 0 found, 1 no answer
(no probe changes the outcome, or --max-probes reached), 2 bad input (the message names the value and what is
valid), 3 infrastructure failure."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.common import DataDirOption, DbOption, _prefect, err, farm_errors, out

STEPS = ("export", "build", "eval")


def _validate(checkpoint: Path, precision: str, platform: str, output: Path, max_probes: int, steps: str,
              repo: Path | None) -> tuple[Path, tuple[str, ...]]:
    """Every problem of the request at once (ConfigurationError, exit 2); returns the repository and the steps."""
    from edgellm.errors import ConfigurationError
    from edgellm.types import Precision
    from tasks.bisect import PLATFORM_BACKENDS

    problems = []
    if not checkpoint.is_dir() or not (checkpoint / "config.json").is_file():
        problems.append(f"--checkpoint {checkpoint}: not a checkpoint directory (no config.json)")
    try:
        Precision.parse(precision, what="precision")
    except ConfigurationError as exc:
        problems.append(f"--precision: {exc}")
    if platform not in PLATFORM_BACKENDS:
        problems.append(f"--platform {platform!r}: a --checkpoint bisect probes on this host; valid: "
                        f"{', '.join(PLATFORM_BACKENDS)}")
    if not output.parent.is_dir():
        problems.append(f"--output {output}: directory {output.parent} not found")
    if max_probes < 2:
        problems.append(f"--max-probes {max_probes}: the two ends take 2; valid: an integer >= 2")
    wanted = tuple(s.strip() for s in steps.split(",") if s.strip())
    if not wanted or any(s not in STEPS for s in wanted):
        problems.append(f"--steps {steps!r}: valid: a comma-separated subset of {', '.join(STEPS)}")
    where = repo or Path.cwd()
    top = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                         check=False)
    if top.returncode != 0:
        problems.append(f"--repo {where}: not a git repository")
    if problems:
        raise ConfigurationError("bad bisect request:\n" + "\n".join(problems))
    return Path(top.stdout.strip()), wanted


def _row_revisions(row: tuple[str, str, str], good: str, bad: str, db: str | None, data_dir: Path | None,
                   checkpoint: Path) -> tuple[str, str, dict[str, object]]:
    """--row: the farm revisions of the two runs and what changed between them (from the results database)."""
    from edgellm.errors import ConfigurationError
    from edgellm.reference import checkpoint_digest
    from flows.settings import Settings
    from results.db import read_only_engine
    from results.row_inputs import changed, row_inputs

    runs = []
    for flag, value in (("--good", good), ("--bad", bad)):
        if not value.isdigit() or int(value) < 1:
            raise ConfigurationError(f"{flag} {value!r}: with --row, a run id (an integer >= 1)")
        runs.append(int(value))
    settings = Settings.resolve(db=db, data_dir=data_dir, create=False)
    engine = read_only_engine(settings.db_url)
    sides = [row_inputs(engine, run, *row) for run in runs]
    diff = changed(*sides)
    facts: dict[str, object] = {"row": list(row), "runs": [s.to_json() for s in sides], "changed": diff}
    if sides[0].status != "pass" or sides[1].status != "fail":
        raise ConfigurationError(f"row {' '.join(row)}: run {runs[0]} is {sides[0].status} and run {runs[1]} is "
                                 f"{sides[1].status}; --good needs a passing run of the row, --bad a failing one")
    if "revision" not in diff:
        raise ConfigurationError(f"the farm's revision is the same in runs {runs[0]} and {runs[1]}; what changed: "
                                 f"{', '.join(diff) or 'nothing recorded'} (only the farm's commits are bisected)")
    revs = [s.revision or "" for s in sides]
    dirty = [r for r in revs if not r or r.endswith("-dirty") or r.startswith("edgellm-")]
    if dirty:
        raise ConfigurationError(f"run revision {dirty[0]!r} is no commit that can be checked out (uncommitted "
                                 f"changes or an installed package); bisect between commits with --good/--bad REV")
    want = sides[1].checkpoint_sha256
    if want is not None and checkpoint_digest(checkpoint) != want:
        raise ConfigurationError(f"--checkpoint {checkpoint}: its digest is not the row's checkpoint {want[:16]}... "
                                 f"in run {runs[1]}; give that checkpoint's directory")
    return revs[0], revs[1], facts


def _catalog_checkpoint(model: str, data_dir: Path | None) -> Path:
    """The catalog's checkpoint of ``model``, located as a run locates it (a synthetic one made)."""
    from flows.cli.common import check_name
    from flows.settings import Settings
    from test_lists.catalog import Catalog

    sources = Catalog.load().sources
    check_name("model", model, sources)
    return Path(sources[model].locate(Settings.resolve(data_dir=data_dir).data_dir))


def _request(top: Path, checkpoint: Path, precision: str, platform: str, good: str, bad: str, max_probes: int,
             steps: tuple[str, ...], data_dir: Path | None) -> Any:
    from edgellm.reference import checkpoint_digest
    from flows.bisect import BisectRequest

    return BisectRequest(repo=str(top), checkpoint=str(checkpoint.resolve()),
                         checkpoint_digest=checkpoint_digest(checkpoint), precision=precision, platform=platform,
                         good=good, bad=bad, max_probes=max_probes,
                         cache_dir=str(data_dir / "bisect-cache") if data_dir is not None else None, steps=steps)


def _run_flow(req: Any, facts: dict[str, object]) -> dict[str, Any]:
    from flows.bisect import bisect as flow
    from flows.cli.running import _announce_flow_run

    result = _announce_flow_run(flow)(req)
    return {"checkpoint": req.checkpoint, "checkpoint_sha256": req.checkpoint_digest, "precision": req.precision,
            "platform": req.platform, "repo": req.repo, **facts, **result}


def _record(db_url: str, answer: dict[str, Any], good_ref: str, bad_ref: str, row: tuple[str, str, str] | None,
            runs: tuple[int, int] | None = None) -> None:
    """The answer into the results database (``results.bisections``), with the row and its runs when known."""
    from results.bisections import from_answer, record_bisection
    from results.db import make_engine

    sides = answer.get("runs") or []  # the row form's two runs (results.row_inputs.RowInputs.to_json)
    toolchain = sides[-1].get("job_toolchain") if sides else None
    engine = make_engine(db_url)
    try:
        answer["bisection_id"] = record_bisection(engine, from_answer(
            answer, good_ref=good_ref, bad_ref=bad_ref, row=row, toolchain=toolchain,
            good_run_id=runs[0] if runs else None, bad_run_id=runs[1] if runs else None))
    finally:
        engine.dispose()


def _regressions(run: int | None, output: Path, max_probes: int, steps: str, repo: Path | None, cache: bool,
                 db: str | None, data_dir: Path | None) -> None:
    """--bisect-regressions: each newly failing row of a nightly bisected in turn, the probes shared out of
    --max-probes; a row that cannot be bisected (same revision, no checkpoint) says why in its entry."""
    from edgellm.errors import ConfigurationError
    from flows.cli.running import _temporary_server
    from flows.settings import Settings
    from results.db import read_only_engine
    from results.row_inputs import newly_failing
    from tasks.bisect import check_order, resolve

    settings = Settings.resolve(db=db, data_dir=data_dir)
    before, now, rows = newly_failing(read_only_engine(settings.db_url), run)
    answers: list[dict[str, Any]] = []
    left = max_probes
    _prefect(settings.data_dir)
    with _temporary_server(settings.data_dir):
        for row in rows:
            entry: dict[str, Any] = {"row": list(row)}
            try:
                if left < 2:
                    raise ConfigurationError(f"--max-probes {max_probes} spent on the rows before")
                checkpoint = _catalog_checkpoint(row[0], data_dir)
                top, wanted = _validate(checkpoint, row[1], row[2], output, left, steps, repo)
                good, bad, facts = _row_revisions(row, str(before), str(now), db, data_dir, checkpoint)
                g, b = resolve(top, good, "run revision"), resolve(top, bad, "run revision")
                check_order(top, g, b)
                entry.update(_run_flow(_request(top, checkpoint, row[1], row[2], g.sha, b.sha, left, wanted,
                                                settings.data_dir if cache else None), facts))
                left -= len(entry["probes"])
                _record(settings.db_url, entry, str(before), str(now), row, (before, now))
            except ConfigurationError as exc:
                entry.update(found=False, reason=str(exc))
            answers.append(entry)
            out.print(f"{' '.join(row)}: " + (f"first bad {entry['first_bad'][:7]} {entry['first_bad_subject']}"
                                              if entry.get("found") else f"no answer: {entry['reason']}"),
                      markup=False)
    output.write_text(json.dumps({"previous_run": before, "run": now, "rows": answers}, indent=2) + "\n")
    if not rows:
        out.print(f"no row newly fails in nightly run {now} (against run {before})", markup=False)
    raise typer.Exit(0 if all(a.get("found") for a in answers) else 1)


def bisect(
    output: Annotated[Path, typer.Option("--output", help="write the JSON answer here", dir_okay=False)],
    good: Annotated[str | None, typer.Option("--good", help="a revision whose pipeline passes (with --row: a run "
                                                            "id)")] = None,
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
    max_probes: Annotated[int, typer.Option("--max-probes", help="at most this many probes (the ends count)")] = 16,
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
    """Bisect this repository's commits between --good and --bad on a checkpoint: the first bad commit, by running
    each probed revision's own export -> build -> eval in a worktree of it. With --row, --good and --bad are two runs
    of that row in the results database, and the farm revisions they ran are bisected."""
    with farm_errors("bisect"):
        from edgellm.errors import ConfigurationError
        from flows.cli.running import _temporary_server
        from flows.settings import Settings
        from tasks.bisect import check_order, resolve

        if regressions:
            _regressions(run, output, max_probes, steps, repo, cache, db, data_dir)
            return
        if good is None or bad is None:
            raise ConfigurationError(f"{'--good' if good is None else '--bad'} is missing: give both ends (revisions; "
                                     f"with --row, run ids), or --bisect-regressions")
        facts: dict[str, object] = {}
        if row is not None:
            if precision is not None and precision != row[1]:
                raise ConfigurationError(f"--precision {precision!r} is not the row's {row[1]!r}; leave it out")
            precision, platform = row[1], row[2]
        if precision is None:
            raise ConfigurationError("--precision is missing: give the export precision (fp32, fp16, int4_awq ...)")
        if checkpoint is None:
            if row is None:
                raise ConfigurationError("--checkpoint is missing: give a checkpoint directory (or --row MODEL "
                                         "PRECISION PLATFORM for a catalog model's)")
            checkpoint = _catalog_checkpoint(row[0], data_dir)
        top, wanted = _validate(checkpoint, precision, platform, output, max_probes, steps, repo)
        given = (good, bad)  # with --row: the run ids
        if row is not None:
            good, bad, facts = _row_revisions(row, good, bad, db, data_dir, checkpoint)
        good_rev, bad_rev = resolve(top, good, "--good"), resolve(top, bad, "--bad")
        check_order(top, good_rev, bad_rev)  # refused here, before any probe
        settings = Settings.resolve(db=db, data_dir=data_dir)
        req = _request(top, checkpoint, precision, platform, good_rev.sha, bad_rev.sha, max_probes, wanted,
                       settings.data_dir if cache else None)
        _prefect(settings.data_dir)
        with _temporary_server(settings.data_dir):
            result = _run_flow(req, facts)
        if row is not None:
            _record(settings.db_url, result, *given, row, (int(given[0]), int(given[1])))
        elif db is not None:  # a --checkpoint bisection is recorded where a database is named
            _record(settings.db_url, result, *given, None)
        output.write_text(json.dumps(result, indent=2) + "\n")
    for p in result["probes"]:
        out.print(f"{p['revision'][:7]} {p['status']:<5} {p['seconds']:7.1f} s{' cached' if p['cached'] else ''}  "
                  f"{p['subject'][:70]}", markup=False)
    if result["found"]:
        out.print(f"first bad: {result['first_bad'][:7]} {result['first_bad_subject']}", markup=False)
        raise typer.Exit(0)
    err.print(f"edgefarm bisect: no answer: {result['reason']}", markup=False)
    raise typer.Exit(1)
