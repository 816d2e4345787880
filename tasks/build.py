"""Build: ONNX -> engine on a device of the target platform, cached by content.

Key = (ONNX sha256, platform, the job's toolchain and its version on the device, the device's edgellm source
digest, build parameters). The toolchain says how to build (never a fixed backend: an Orin is never built with
ONNX Runtime). The precision found in the built engine (read back by the build) must be the one asked for.
"""

from __future__ import annotations

import json
import logging

from artifacts.kinds import ArtifactKind, Packing
from devices.inventory import Device
from devices.transport import Transport, open_transport
from edgellm.errors import ErrorKind, InfrastructureError
from results import cache
from results.models import ResultStatus
from stages import Stage
from tasks.common import (
    attempt_recorder,
    from_device_run,
)
from tasks.device_exec import DeviceRun, device_env_info, promote_to_cache, run_stage
from tasks.farm import Farm, FarmContext
from tasks.outcome import StageOutcome
from tasks.spec import JobSpec
from toolchains.base import require

log = logging.getLogger(__name__)


def platform_env(farm: Farm, platform: str) -> dict[str, object]:
    """``edgellm env`` of the platform's first reachable device (no lease: a read-only probe)."""
    errors = []
    with farm.lock:
        bad = set(farm.bad_devices)
    for device in sorted(farm.inventory.select(platform=platform), key=lambda d: (d.id in bad, d.id)):
        try:
            with open_transport(device) as transport:
                return device_env_info(farm, device, transport)
        except InfrastructureError as exc:
            errors.append(f"{device.id}: {exc}")
    raise InfrastructureError(f"no reachable {platform} device to ask for its backend version: {'; '.join(errors)}")


def build(ctx: FarmContext, job: JobSpec, exported: StageOutcome) -> StageOutcome:
    """Build the export's ONNX into an engine on a device of the platform (cached by content)."""

    def body() -> StageOutcome:
        farm = Farm.get(ctx)
        onnx = exported.outputs["onnx"]
        toolchain = require(job.toolchain)
        env = platform_env(farm, job.platform)
        version = toolchain.version(env)
        inputs = {"stage": "build", "onnx_sha256": onnx.sha256, "platform": job.platform,
                  "toolchain": job.toolchain.value, "toolchain_version": version,
                  "edgellm_build": env.get("edgellm_build"), **job.build_params}
        key = cache.cache_key(inputs)
        hit = cache.lookup(farm.engine, key)
        if hit is not None and farm.store.has(hit.sha256):
            cache.touch(farm.engine, key)
            ref = farm.store.ref(hit.sha256, ArtifactKind.ENGINE, Packing.TAR)
            log.info("build %s on %s: cache hit (key %s, engine sha256 %s)", job.test_id, job.platform,
                        key[:12], hit.sha256[:12])
            out = StageOutcome(stage=Stage.BUILD, status=ResultStatus.PASS, reason="cache hit", cached=True,
                               toolchain_version=version)
            out.outputs["engine"] = ref
            out.artifacts.append(ref)
            out.metrics["cache_hit"] = (1.0, "")
            return out

        def argv(device: Device, transport: Transport, job_dir: str) -> list[str]:
            return toolchain.build_command(device.interpreter, f"cache/{onnx.sha256}", f"{job_dir}/engine",
                                           job.build_params)

        produced: dict[str, object] = {}

        def keep(transport: Transport, run: DeviceRun) -> None:
            if run.status is not ResultStatus.PASS:
                return
            ref = farm.store.put(run.fetched["engine"], ArtifactKind.ENGINE)
            promote_to_cache(transport, f"{run.job_dir}/engine", ref.sha256)
            produced["engine"] = ref

        run = run_stage(farm, platform=job.platform, what=f"build-{job.key}", argv=argv, inputs=[onnx],
                        fetch={"engine": "engine"}, timeout=job.timeout(Stage.BUILD),
                        on_attempt_failed=attempt_recorder(farm, job, Stage.BUILD), after=keep)
        out = from_device_run(Stage.BUILD, run, job)
        if "engine" in produced:
            ref = produced["engine"]
            manifest = json.loads((run.fetched["engine"] / "engine_manifest.json").read_text())
            cache.remember(farm.engine, key, ArtifactKind.ENGINE, ref.sha256, inputs,  # type: ignore[attr-defined]
                           toolchain=job.toolchain, toolchain_version=out.toolchain_version)
            out.outputs["engine"] = ref
            out.artifacts.append(ref)  # type: ignore[arg-type]
            out.metrics["cache_hit"] = (0.0, "")
            out.metrics["engine_bytes"] = (float(ref.size), "B")  # type: ignore[attr-defined]
            build_s = manifest.get("build_seconds")
            if isinstance(build_s, (int, float)):
                out.metrics["build_s"] = (float(build_s), "s")
            found = manifest.get("precision")
            if found != job.precision.value:  # never count an engine of another precision as evidence
                out.status, out.error_kind = ResultStatus.FAIL, ErrorKind.TEST_FAILURE
                out.reason = f"asked for {job.precision.value} but the built engine holds {found} weights"
            else:
                out.reason = f"engine precision {found} (read back from the built graph)"
        return out

    return body()
