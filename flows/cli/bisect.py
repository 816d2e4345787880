"""``edgefarm bisect``: the first commit of this repository whose own ``edgellm export -> build -> eval`` fails on a
checkpoint that an older commit passed (flows/bisect.py; a probe: tasks/bisect.py). Exit codes: 0 found, 1 no answer
(no probe changes the outcome, or --max-probes reached), 2 bad input (the message names the value and what is
valid), 3 infrastructure failure."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Annotated

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


def bisect(
    good: Annotated[str, typer.Option("--good", help="a revision whose pipeline passes (with --row: a run id)")],
    bad: Annotated[str, typer.Option("--bad", help="a later revision whose pipeline fails (with --row: a run id)")],
    output: Annotated[Path, typer.Option("--output", help="write the JSON answer here", dir_okay=False)],
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
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Bisect this repository's commits between --good and --bad on a checkpoint: the first bad commit, by running
    each probed revision's own export -> build -> eval in a worktree of it. With --row, --good and --bad are two runs
    of that row in the results database, and the farm revisions they ran are bisected."""
    with farm_errors("bisect"):
        from edgellm.errors import ConfigurationError
        from edgellm.reference import checkpoint_digest
        from flows.settings import Settings
        from tasks.bisect import check_order, resolve

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
        if row is not None:
            good, bad, facts = _row_revisions(row, good, bad, db, data_dir, checkpoint)
        good_rev, bad_rev = resolve(top, good, "--good"), resolve(top, bad, "--bad")
        check_order(top, good_rev, bad_rev)  # refused here, before any probe
        settings = Settings.resolve(db=db, data_dir=data_dir)
        from flows.bisect import BisectRequest
        from flows.bisect import bisect as flow
        from flows.cli.running import _announce_flow_run, _temporary_server

        req = BisectRequest(repo=str(top), checkpoint=str(checkpoint.resolve()),
                            checkpoint_digest=checkpoint_digest(checkpoint), precision=precision, platform=platform,
                            good=good_rev.sha, bad=bad_rev.sha, max_probes=max_probes,
                            cache_dir=str(settings.data_dir / "bisect-cache") if cache else None, steps=wanted)
        _prefect(settings.data_dir)
        with _temporary_server(settings.data_dir):
            result = _announce_flow_run(flow)(req)
        result = {"checkpoint": req.checkpoint, "checkpoint_sha256": req.checkpoint_digest, "precision": precision,
                  "platform": platform, "repo": req.repo, **facts, **result}
        output.write_text(json.dumps(result, indent=2) + "\n")
    for p in result["probes"]:
        out.print(f"{p['revision'][:7]} {p['status']:<5} {p['seconds']:7.1f} s{' cached' if p['cached'] else ''}  "
                  f"{p['subject'][:70]}", markup=False)
    if result["found"]:
        out.print(f"first bad: {result['first_bad'][:7]} {result['first_bad_subject']}", markup=False)
        raise typer.Exit(0)
    err.print(f"edgefarm bisect: no answer: {result['reason']}", markup=False)
    raise typer.Exit(1)
