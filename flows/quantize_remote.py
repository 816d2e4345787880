"""quantize_checkpoint: a quantize stage sent here by a run whose ``quantize_on`` names this worker's pool
(``tasks.dispatch``). Deployed per quantization pool as ``quantize-checkpoint/quantize-on-<pool>``.

The worker runs it with its own settings (data dir, toolchains, EDGEFARM_QUANTIZE_DEVICE, database, store), after
checking that it runs the run's code revision and stores into the run's artifact store, and that the source
checkpoint it locates here has the digest the run planned with. The stage itself is the generic body's
(``tasks.common.run_stage``): the shared content cache, the quantizer, its checks. Its outcome and this worker's
revision and toolchains are recorded in the run (``RunWorker``), where the sending run reads them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from prefect import flow
from prefect.runtime import flow_run as prefect_flow_run

from edgefarm.devices.pools import QUANTIZE_FLOW
from edgefarm.flows import revision as code_revision
from edgefarm.flows.pipeline import toolchain_versions
from edgefarm.flows.prefect_env import send_logs_to_prefect
from edgefarm.flows.settings import Settings
from edgefarm.results.db import for_parameters, make_engine
from edgefarm.results.recorder import Recorder
from edgefarm.stages import Stage
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import StageOutcome
from edgefarm.stages.wire import job_from_json, outcome_to_json
from edgefarm.tasks.common import run_stage
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.test_lists.catalog import Catalog
from edgellm.errors import ConfigurationError
from edgellm.reference import checkpoint_digest

log = logging.getLogger(__name__)


@flow(name=QUANTIZE_FLOW, log_prints=False)
def quantize_checkpoint(job: dict[str, Any], run_id: int, revision: str, source_digest: str,
                        artifacts: str, max_unquantized_share: float = 0.0) -> str:
    """Quantize ``job``'s checkpoint for run ``run_id`` here; the outcome goes into the run's record."""
    send_logs_to_prefect()
    settings = Settings.resolve()
    here = code_revision.current()
    spec = job_from_json(job)
    recorder = Recorder(make_engine(settings.db_url))
    accepted, why = True, None
    try:
        try:
            out = _quantize(settings, spec, run_id, revision, source_digest, artifacts, max_unquantized_share)
        except ConfigurationError as exc:  # refused here: the sending run fails the stage with the reason
            accepted, why = False, str(exc).splitlines()[0]
            out = StageOutcome.from_error(str(Stage.QUANTIZE), exc)
        recorder.record_worker(run_id, role=str(Stage.QUANTIZE), pool=code_revision.worker_pool(),
                               host=code_revision.host_name(),
                               data_dir=str(settings.data_dir), revision=here.git, source_digest=here.source,
                               toolchains=_toolchains(out), flow_run_id=_flow_run_id(), accepted=accepted,
                               reason=why, outcome=outcome_to_json(out))
    finally:
        recorder.engine.dispose()
    return f"quantize {spec.model} {spec.precision}: {out.status.value}"


def _quantize(settings: Settings, job: JobSpec, run_id: int, expected_git: str, expected_source: str,
              artifacts: str, max_unquantized_share: float) -> StageOutcome:
    what = f"quantize {job.model} {job.precision}"
    code_revision.require_same(expected_source, expected_git, what=what)
    if (settings.artifacts or "") != artifacts:
        raise ConfigurationError(
            f"{what}: this worker's artifact store is {settings.artifacts or 'its own data dir'}, the run's is "
            f"{artifacts or 'the data dir of its orchestrator'}; refused: set EDGEFARM_ARTIFACTS to the run's bucket")
    here = Catalog.load().get(job.model).locate(settings.data_dir)
    digest = checkpoint_digest(here)
    if digest != job.checkpoint.sha256:
        raise ConfigurationError(f"{what}: checkpoint {here} here has sha256 {digest[:12]}, the run planned "
                                 f"{job.checkpoint.sha256[:12]}; refused (another checkpoint revision)")
    local = dataclasses.replace(job, checkpoint=CheckpointRef(model=job.model, path=str(here), sha256=digest))
    ctx = FarmContext(run_id=run_id, db_url=for_parameters(settings.db_url), data_dir=str(settings.data_dir),
                      inventory_dir=str(settings.inventory_dir), host_slots=1,
                      quantize_device=settings.quantize_device, max_unquantized_share=max_unquantized_share,
                      artifacts=settings.artifacts or "", artifact_cache_gb=settings.artifact_cache_gb)
    try:
        return run_stage(ctx, str(Stage.QUANTIZE), local, ())
    finally:
        Farm.close(ctx)


def _flow_run_id() -> str | None:
    found = prefect_flow_run.id
    return str(found) if found else None


def _toolchains(out: StageOutcome) -> dict[str, str]:
    found = dict(toolchain_versions())
    if out.toolchain and out.toolchain_version:
        found[out.toolchain] = out.toolchain_version
    return found
