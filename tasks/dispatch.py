"""A quantize stage sent to the worker of another pool (``quantize_on``: a GPU host quantizes what this host's CPU
cannot in time), and its outcome read back.

The stage runs there as it would here (``flows.quantize_remote``: its key, the shared content cache, the
quantizer, its checks), with that worker's data dir, toolchains and quantize device; its product goes into the
run's artifact store (a bucket every worker reaches) and the outcome comes back through the results database
(``RunWorker.outcome``, keyed by the flow run), never through the worker's disk. A worker that does not run the
run's code revision refuses (a configuration error, never retried); one that never takes the flow run, or crashes,
is an infrastructure error (the stage is retried, then the job fails as infrastructure).
"""

from __future__ import annotations

import logging
from typing import Any

from edgefarm import stages
from edgefarm.devices.pools import quantize_deployment
from edgefarm.results.runs import dispatched_outcome
from edgefarm.stages import Stage
from edgefarm.stages.job import JobSpec
from edgefarm.stages.outcome import StageOutcome
from edgefarm.stages.wire import job_to_json, outcome_from_json
from edgefarm.tasks.farm import Farm, FarmContext
from edgellm.errors import ConfigurationError, InfrastructureError

log = logging.getLogger(__name__)
QUEUE_WAIT_S = 300  # how long a sent stage may wait for a worker of its pool, beyond its own timeout


def parameters(ctx: FarmContext, job: JobSpec) -> dict[str, Any]:
    """The flow run's parameters: plain JSON, no secret (the database URL and the store's credentials are the
    worker's own environment's)."""
    return {"job": job_to_json(job), "run_id": ctx.run_id, "revision": ctx.revision,
            "source_digest": ctx.source_digest, "artifacts": ctx.artifacts,
            "max_unquantized_share": ctx.max_unquantized_share}


def quantize_remotely(ctx: FarmContext, job: JobSpec) -> StageOutcome:
    """Run ``job``'s quantize stage on a worker of pool ``ctx.quantize_on`` and return its outcome."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    pool = ctx.quantize_on
    name = quantize_deployment(pool)
    timeout = job.timeouts.get(str(Stage.QUANTIZE), stages.spec(Stage.QUANTIZE).timeout_s) + QUEUE_WAIT_S
    try:
        flow_run = run_deployment(name, parameters=parameters(ctx, job), timeout=timeout, as_subflow=True,
                                  flow_run_name=f"quantize {job.model} {job.precision} (run {ctx.run_id})")
    except ObjectNotFound:
        raise ConfigurationError(f"quantize_on {pool!r}: no deployment {name} on the Prefect server; register it "
                                 f"(prefect deploy --prefect-file infra/prefect.yaml --name "
                                 f"{name.split('/')[1]}) and start a worker of pool {pool}") from None
    state = flow_run.state  # type: ignore[union-attr]
    state_name = state.name if state is not None else "unknown"
    if state is None or not state.is_final():
        _cancel(flow_run.id)  # type: ignore[union-attr]
        raise InfrastructureError(f"quantize {job.model} {job.precision}: no worker of pool {pool} finished it "
                                  f"within {timeout} s (flow run {flow_run.id} {state_name})")  # type: ignore[union-attr]
    found = dispatched_outcome(Farm.get(ctx).engine, ctx.run_id, str(flow_run.id))  # type: ignore[union-attr]
    if not state.is_completed() or found is None:
        why = (state.message or "").splitlines()[0][:500] if state.message else "no outcome recorded"
        raise InfrastructureError(f"quantize {job.model} {job.precision} on pool {pool} ended {state_name}: {why}")
    out = outcome_from_json(found.outcome)
    out.reason = f"on pool {pool} (host {found.host}, revision {found.revision}): {out.reason or 'done'}"[:2000]
    log.info("quantize %s: %s on pool %s (%s)", job.key, out.status.value, pool, found.host)
    return out


def _cancel(flow_run_id: Any) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run_id, Cancelled(message="the run stopped waiting for it"), force=True)
    except Exception as exc:  # best effort: the run already fails the stage as infrastructure
        log.warning("could not cancel flow run %s: %s", flow_run_id, exc)
