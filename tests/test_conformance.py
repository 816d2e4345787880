"""The conformance matrix (edgellm.conformance): every registered family x the features its published configs use x
the dtype its checkpoint is saved in x the export precision -> export, build, and parity with transformers on the
same weights. fp32 exports are exact (greedy equal over 16 tokens, logits within fp32's limits); half precisions and
quantized exports are judged by the limits of edgellm.thresholds. Cells are generated from the registries: nothing
here lists a family, a feature, a rope type or a quantization method.

The cells selected in this session run once, in a process per core (tests/helpers/conformance_cells.py; cells that
share a checkpoint in one worker), and each parametrized test reports its own cell's outcome.
"""

from __future__ import annotations

import os
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path

import pytest

from edgellm import conformance
from edgellm.models.base import registered_families
from tests.helpers.conformance_cells import init_worker, one_reference_per_input, run_group

CELLS = conformance.cells()
WORKERS = max(1, min(4, os.cpu_count() or 1))
GROUP_TIMEOUT_S = 1200


def test_the_matrix_is_every_registered_family_feature_dtype_and_precision() -> None:
    families = [f for f in registered_families() if f.hf_config is not None]
    assert {c.family for c in CELLS} == {f.name for f in families} and len(families) >= 4
    for family in families:
        mine = [c for c in CELLS if c.family == family.name]
        names = {f.name for f in conformance.features(family)}
        assert {"base", "tied", "mha", "mqa", "head_dim", "sharded", "attention_bias", "mlp_bias"} <= names
        assert all(f"rope_{t}" in names or t in names for t in family.rope_types)
        ropes = {f.name for f in conformance.features(family) if f.rope}
        assert {(c.feature.name, c.dtype) for c in mine if c.kind == "structure"} == {
            (n, d) for n in names for d in (("bf16",) if n in ropes else conformance.CHECKPOINT_DTYPES)}
        assert {(c.feature.name, c.precision) for c in mine if c.kind == "precision"} == {
            (n, p) for n in names - ropes for p in conformance.HALF_PRECISIONS}
        assert {(c.dtype, c.precision) for c in mine if c.kind == "quantized"} == ({
            (d, m) for d in conformance.CHECKPOINT_DTYPES for m in conformance.quantized_methods()}
            if family.quantized_export else set())
    assert set(conformance.quantized_methods()) == {"int4_awq", "int8_sq"}
    assert len({c.id for c in CELLS}) == len(CELLS)


def test_a_group_computes_one_reference_per_checkpoint_settings_and_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgellm import accuracy
    from edgellm.reference import ReferenceSettings

    calls: list[tuple[str, ReferenceSettings, str]] = []

    def compute(checkpoint: Path, settings: ReferenceSettings, device: str = "cpu") -> dict[str, list[int]]:
        calls.append((str(checkpoint), settings, device))
        return {"greedy_ids": [len(calls)]}

    monkeypatch.setattr(accuracy, "compute_reference", compute)
    short = ReferenceSettings(max_tokens=128, window=64)
    with one_reference_per_input():
        first = accuracy.compute_reference(Path("/c"), short, "cpu")
        again = accuracy.compute_reference(Path("/c"), short, "cpu")
        assert again == first and again is not first  # a copy: an eval that changes its reference changes no other
        accuracy.compute_reference(Path("/c"), ReferenceSettings(), "cpu")
        accuracy.compute_reference(Path("/d"), short, "cpu")
        accuracy.compute_reference(Path("/c"), short, "cuda")
    assert len(calls) == 4
    assert accuracy.compute_reference is compute  # restored


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """Every selected cell's outcome (None: passed), computed once for the module."""
    selected = [item.callspec.params["cell"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_conformance" and hasattr(item, "callspec")]
    groups: dict[tuple[str, str, str], list[conformance.Cell]] = defaultdict(list)
    for cell in selected:
        groups[cell.checkpoint_key].append(cell)
    root = Path(tmp_path_factory.mktemp("conformance"))
    found: dict[str, str | None] = {}
    try:
        with ProcessPoolExecutor(max_workers=WORKERS, mp_context=get_context("spawn"),
                                 initializer=init_worker) as pool:
            futures = [(cells, pool.submit(run_group, cells, root)) for cells in groups.values()]
            for cells, future in futures:
                try:
                    found.update(future.result(timeout=GROUP_TIMEOUT_S))
                except BrokenProcessPool:
                    break  # the pool is gone: the groups left run here, below
                except Exception as exc:  # a hung or failed group: its cells fail with why, the others stand
                    found.update({c.id: f"worker: {type(exc).__name__}: {exc}" for c in cells})
    except (OSError, BrokenProcessPool) as exc:  # no worker processes on this machine: the same cells, one by one
        print(f"conformance: worker processes unavailable ({type(exc).__name__}: {exc}); running cells here")
    for cells in groups.values():
        if any(c.id not in found for c in cells):
            found.update(run_group(cells, root / "here"))
    return found


# the first cell's setup runs every selected cell (about 3 minutes on 2 idle cores): the per-test limit is the whole
# matrix's, with room for a loaded machine
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("cell", CELLS, ids=[c.id for c in CELLS])
def test_conformance(cell: conformance.Cell, outcomes: dict[str, str | None]) -> None:
    assert cell.id in outcomes, f"{cell.id} did not run"
    assert outcomes[cell.id] is None, f"{cell.id}:\n{outcomes[cell.id]}"
