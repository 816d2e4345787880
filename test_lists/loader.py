"""Public entry points: find lists, load one for the orchestration, validate many for ``edgefarm lists validate``."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.platforms import PlatformCatalog
from edgefarm.test_lists.testlist import TestList
from edgefarm.test_lists.validate import CATALOG_STEM, NOT_LISTS, WAIVERS_STEM, Problem, Report, Validator
from edgefarm.test_lists.waivers import utc_today
from edgellm.errors import ConfigurationError

if TYPE_CHECKING:
    from edgefarm.registries import Registries

log = logging.getLogger(__name__)

LISTS_DIR = Path(__file__).resolve().parent


class TestListError(ConfigurationError):
    """A list (or its waivers) failed validation; ``problems`` holds every problem found."""

    __test__ = False  # not a pytest class

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__(f"{len(problems)} problem(s) in test lists: " + "; ".join(str(p) for p in problems))


def _registries(registries: Registries | None) -> Registries:
    """``registries``, else the farm's (``registries.current()``)."""
    if registries is not None:
        return registries
    from edgefarm.registries import current

    return current()


def list_files(lists_dir: Path | None = None, *, registries: Registries | None = None) -> dict[str, Path]:
    """List name -> file: the ``*.yml`` of ``lists_dir``, or by default the shipped ones with the site directory's
    ``lists/`` over them (``registries``', default the farm's: a site list adds one or replaces the shipped one of its
    name); waivers.yml and the model catalog are not lists."""
    if lists_dir is not None:
        found = {p.stem: p for p in sorted(Path(lists_dir).glob("*.yml"))}
    else:
        found = _registries(registries).files("lists", LISTS_DIR)
    return {name: path for name, path in sorted(found.items()) if name not in NOT_LISTS}


def list_names(lists_dir: Path | None = None, *, registries: Registries | None = None) -> list[str]:
    """Names of the lists in ``lists_dir`` (default: the shipped ones and the site directory's)."""
    return list(list_files(lists_dir, registries=registries))


def _list_path(name_or_path: str | Path, lists_dir: Path | None, registries: Registries | None) -> Path:
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or text.endswith((".yml", ".yaml")):
        path = Path(name_or_path)
        if not path.is_file():
            raise ConfigurationError(f"test list file {text!r} does not exist")
        return path
    files = list_files(lists_dir, registries=registries)
    if text not in files:
        where = lists_dir if lists_dir is not None else LISTS_DIR
        raise ConfigurationError(f"unknown test list {text!r}; known: {', '.join(files) or '(none)'} in {where}")
    return files[text]


def load_list(
    name_or_path: str | Path,
    *,
    lists_dir: Path | None = None,
    platforms: PlatformCatalog | Iterable[str] | None = None,
    today: dt.date | None = None,
    registries: Registries | None = None,
) -> TestList:
    """Load and validate one list plus its directory's waivers.yml; any error raises TestListError listing all. A
    list by name and what it is checked against (the catalog, the platforms) are ``registries``' (default: the
    farm's)."""
    path = _list_path(name_or_path, lists_dir, registries)
    validator = Validator(platforms, today or utc_today(), registries=registries)
    test_list, errors, warnings = validator.list_file(path)
    waivers_path = path.parent / f"{WAIVERS_STEM}.yml"
    shared = []
    if waivers_path.is_file():
        shared, werrors, _ = validator.waivers_file(waivers_path, None)
        errors += werrors
    if errors or test_list is None:
        raise TestListError(errors)
    for w in warnings:
        log.warning("%s", w)
    return dataclasses.replace(test_list, waivers=(*test_list.waivers, *shared))


def _expand(paths: Iterable[Path]) -> tuple[list[Path], list[Problem]]:
    files: list[Path] = []
    missing = []
    for p in paths:
        if p.is_dir():
            files += sorted(p.glob("*.yml"))
        elif p.is_file():
            files.append(p)
        else:
            missing.append(Problem(p, "no such file or directory"))
    return list(dict.fromkeys(files)), missing


def validate_paths(
    paths: Iterable[Path] | None = None,
    *,
    platforms: PlatformCatalog | Iterable[str] | None = None,
    today: dt.date | None = None,
    registries: Registries | None = None,
) -> Report:
    """Validate list files and waivers.yml files (directories expand to their ``*.yml``); collect every problem.
    Models are checked against the catalog among ``paths`` (a directory's ``models.yml``), else the shipped one;
    the shipped lists, catalog and platforms are ``registries``' (default: the farm's), site files included."""
    if paths:
        files, missing = _expand([Path(p) for p in paths])
    else:  # the shipped lists, and the site directory's over them (a site file replaces the shipped one of its name)
        files, missing = list(_registries(registries).files("lists", LISTS_DIR).values()), []
    catalog, catalog_problems = None, []
    for f in files:
        if f.stem == CATALOG_STEM:
            try:
                catalog = Catalog.load(f, registries=registries)
            except ConfigurationError as exc:
                catalog_problems += [Problem(f, line) for line in str(exc).splitlines()]
    validator = Validator(platforms, today or utc_today(), models=catalog, registries=registries)
    report = Report(files=files, errors=missing + catalog_problems, today=validator.today)
    built: dict[Path, TestList | None] = {}
    for f in files:
        if f.stem == CATALOG_STEM:
            continue
        if f.stem == WAIVERS_STEM:
            continue
        test_list, errors, warnings = validator.list_file(f)
        built[f.resolve()] = test_list
        report.errors += errors
        report.warnings += warnings
        if test_list is not None:
            report.lists.append(test_list)
            report.waivers += test_list.waivers
    for f in files:
        if f.stem != WAIVERS_STEM:
            continue
        siblings = []
        for sib in sorted(f.parent.glob("*.yml")):
            if sib.stem in NOT_LISTS:
                continue
            if sib.resolve() not in built:  # needed only to see which tests the waivers can match
                built[sib.resolve()] = validator.list_file(sib)[0]
            siblings.append(built[sib.resolve()])
        waivers, errors, warnings = validator.waivers_file(f, [t for t in siblings if t is not None])
        report.errors += errors
        report.warnings += warnings
        report.waivers += waivers
    return report
