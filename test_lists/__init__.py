"""Test lists: which models, at which precision and limits, run which stages on which platforms.

One YAML file per list in this directory (``<name>.yml``), shared fragments under ``fragments/`` and
directory-wide waivers in ``waivers.yml``. ``edgefarm lists validate`` checks them all.
"""

from edgefarm.test_lists.ids import TestId
from edgefarm.test_lists.loader import TestListError, list_names, load_list, validate_paths
from edgefarm.test_lists.platforms import PlatformCatalog, known_platforms
from edgefarm.test_lists.schema import ListStage
from edgefarm.test_lists.testlist import TestEntry, TestList
from edgefarm.test_lists.validate import Problem, Report
from edgefarm.test_lists.waivers import Waiver, expired_waivers

__all__ = [
    "ListStage",
    "PlatformCatalog",
    "Problem",
    "Report",
    "TestEntry",
    "TestId",
    "TestList",
    "TestListError",
    "Waiver",
    "expired_waivers",
    "known_platforms",
    "list_names",
    "load_list",
    "validate_paths",
]
