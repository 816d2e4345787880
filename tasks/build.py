"""Build: ONNX -> engine on a device of the target platform, cached by content.

Key (``build_key``; the generic body looks it up) = (ONNX sha256, platform, the job's toolchain and its version on
the device, the device's edgellm source digest, what the toolchain adds of the device's install (route, stand-in),
build parameters); an engine is remembered only once its precision was read back. The toolchain driver says how to
build, where the engine lands and how its precision is read back (never a fixed backend: a platform runs only the
toolchains its device type names). The precision read back from the built engine must be the one asked for.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from artifacts.kinds import ArtifactKind
from artifacts.store import ArtifactRef
from devices.inventory import Device
from devices.transport import Transport, open_transport
from edgellm.errors import ErrorKind, InfrastructureError
from results.models import ResultStatus
from stages import Stage
from stages.job import JobSpec
from stages.outcome import Keyed, StageOutcome
from tasks.common import attempt_recorder, from_device_run
from tasks.device_exec import DeviceRun, promote_to_cache, run_stage, toolchain_env
from tasks.farm import Farm, FarmContext
from toolchains.base import DeviceStep, ToolchainDriver

log = logging.getLogger(__name__)


def platform_env(farm: Farm, platform: str, toolchain: ToolchainDriver) -> tuple[Device, dict[str, object]]:
    """The platform's first reachable device the toolchain drives, and its env there (no lease: a probe)."""
    errors = []
    with farm.lock:
        bad = set(farm.bad_devices)
    usable = [d for d in farm.inventory.select(platform=platform) if toolchain.drives(d)]
    for device in sorted(usable, key=lambda d: (d.id in bad, d.id)):
        try:
            with open_transport(device) as transport:
                return device, toolchain_env(farm, device, transport, toolchain)
        except InfrastructureError as exc:
            errors.append(f"{device.id}: {exc}")
    raise InfrastructureError(f"no reachable {platform} device to ask for its backend version: {'; '.join(errors)}")


def engine_key_inputs(onnx_sha: str, job: JobSpec, version: str, env: dict[str, object],
                      installed: dict[str, Any]) -> dict[str, object]:
    """An engine's cache key inputs: ``env`` is the probed device's ``edgellm env``, ``installed`` what its toolchain
    install contributes (``ToolchainDriver.build_key_inputs``)."""
    return {"stage": "build", "onnx_sha256": onnx_sha, "platform": job.platform, "toolchain": job.toolchain,
            "toolchain_version": version, "edgellm_build": env.get("edgellm_build"), **installed, **job.build_params}


def build_key(ctx: FarmContext, job: JobSpec, exported: StageOutcome) -> Keyed:
    """The table's cache key function: the export's ONNX, built by the toolchain as a device of the platform has it
    (probed, not leased)."""
    farm = Farm.get(ctx)
    toolchain = job.driver(ctx.data_dir)
    probe, env = platform_env(farm, job.platform, toolchain)
    version = toolchain.device_version(probe, env)
    inputs = engine_key_inputs(exported.outputs["onnx"].sha256, job, version, env, toolchain.build_key_inputs(probe))
    return Keyed(inputs, toolchain=job.toolchain, toolchain_version=version, route=toolchain.route(),
                 standin=toolchain.standin(probe))


def build(ctx: FarmContext, job: JobSpec, exported: StageOutcome, *, keyed: Keyed) -> StageOutcome:
    """A cache miss: build the export's ONNX into an engine on a leased device of the platform."""
    farm, onnx = Farm.get(ctx), exported.outputs["onnx"]
    toolchain = job.driver(ctx.data_dir)

    def step(device: Device, transport: Transport, job_dir: str) -> DeviceStep:
        return toolchain.build_step(device, f"cache/{onnx.sha256}", f"{job_dir}/engine", job.build_params)

    produced: dict[str, ArtifactRef] = {}

    def keep(transport: Transport, run: DeviceRun) -> None:
        if run.status is not ResultStatus.PASS:
            return
        ref = farm.store.put(run.fetched["engine"], ArtifactKind.ENGINE)
        promote_to_cache(transport, f"{run.job_dir}/engine", ref.sha256)
        produced["engine"] = ref

    run = run_stage(farm, platform=job.platform, what=f"build-{job.key}", argv=step, inputs=[onnx],
                    timeout=job.timeout(Stage.BUILD), on_attempt_failed=attempt_recorder(farm, job, Stage.BUILD,
                                                                                          toolchain),
                    after=keep, toolchain=toolchain)
    out = from_device_run(Stage.BUILD, run, toolchain)
    if "engine" in produced:
        ref = produced["engine"]
        out.outputs["engine"] = ref
        out.artifacts.append(ref)
        out.metrics["engine_bytes"] = (float(ref.size), "B")
        scratch = farm.ctx.host_work_dir / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            onnx_dir = None
            if toolchain.needs_onnx_for_check():
                onnx_dir = Path(tmp) / "onnx"
                farm.store.extract(onnx.sha256, onnx_dir)
            found = toolchain.check_engine(run.fetched["engine"], onnx_dir, job.build_params)
        out.metrics.update(found.metrics)
        if found.precision != job.precision.value:  # never count an engine of another precision as evidence
            out.status, out.error_kind = ResultStatus.FAIL, ErrorKind.TEST_FAILURE
            out.reason = f"asked for {job.precision.value} but the built engine holds {found.precision} weights"
        else:
            keyed.made(ref, out.toolchain_version)  # only once read back: a hit's precision was checked
            out.reason = found.detail
    return out

