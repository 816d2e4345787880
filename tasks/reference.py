"""Reference: the transformers reference of a checkpoint (``edgellm reference``), computed on the orchestrating
host once per model and cached by content, so accuracy on a device needs neither torch nor transformers.

Key (``reference_key``; the generic body looks it up) = (checkpoint sha256, reference settings, edgellm version,
transformers version). The reference is a stage of
its own without result rows: accuracy, which needs it, records a failure of it as its own error, with the reason.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
from pathlib import Path

import edgellm
from edgefarm.artifacts.inuse import held_dir
from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.devices.transport.local import LocalTransport
from edgefarm.results.models import ResultStatus
from edgefarm.stages import REFERENCE
from edgefarm.stages.job import JobSpec
from edgefarm.stages.outcome import Keyed, StageOutcome, classify
from edgefarm.tasks.farm import Farm, FarmContext
from edgellm import BUNDLED_TEXT_FILE
from edgellm import __version__ as edgellm_version
from edgellm.build_id import build_id
from edgellm.errors import ConfigurationError
from edgellm.reference import DEFAULT_GREEDY_TOKENS, DEFAULT_WINDOW, FORMAT, PROMPTS

EVAL_MAX_TOKENS = 1024  # perplexity tokens: enough to separate a broken engine, cheap on tiny models
REFERENCE_WINDOW = DEFAULT_WINDOW  # perplexity window; every farm engine has max_input_len >= this


def transformers_version() -> str:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def reference_key_inputs(checkpoint_sha: str) -> dict[str, object]:
    text_sha = hashlib.sha256(BUNDLED_TEXT_FILE.read_bytes()).hexdigest()
    prompts_sha = hashlib.sha256("\0".join(PROMPTS).encode()).hexdigest()
    return {"stage": "reference", "format": FORMAT, "checkpoint_sha256": checkpoint_sha,
            "settings": {"max_tokens": EVAL_MAX_TOKENS, "greedy_tokens": DEFAULT_GREEDY_TOKENS,
                         "window": REFERENCE_WINDOW, "text_sha256": text_sha, "prompts_sha256": prompts_sha,
                         "layer_states": True},
            "edgellm": edgellm_version, "edgellm_build": build_id(), "transformers": transformers_version()}


def reference_key(ctx: FarmContext, job: JobSpec) -> Keyed:
    """The table's cache key function: a reference is no toolchain's product. A pre-quantized checkpoint's is its
    float base's (transformers reads no ModelOpt checkpoint, and would read some as float without a word)."""
    if job.prequantized is not None and job.reference_checkpoint is None:
        raise ConfigurationError(f"model {job.model!r}: {job.prequantized}; its transformers reference needs the "
                                 f"float checkpoint it was quantized from: name it in the model catalog (base: MODEL)")
    return Keyed(reference_key_inputs(job.reference_source.sha256), toolchain=None, toolchain_version=None,
                 device="orchestrator")


def reference(ctx: FarmContext, job: JobSpec, *, keyed: Keyed) -> StageOutcome:
    """A cache miss: ``edgellm reference`` on the source checkpoint (a pre-quantized one's float base)."""
    source = job.reference_source
    farm, model, timeout_s = Farm.get(ctx), source.model, job.timeout(REFERENCE)
    work = farm.ctx.scratch_dir
    with held_dir(work, "reference-") as tmp:
        logs = farm.ctx.host_work_dir / "logs" / f"run-{farm.ctx.run_id}"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"reference-{model.replace('/', '--')}.log"
        argv = [sys.executable, "-m", "edgellm", "reference", str(Path(source.path)),
                "--output", str(tmp / "reference.npz"), "--max-tokens", str(EVAL_MAX_TOKENS),
                "--greedy-tokens", str(DEFAULT_GREEDY_TOKENS), "--window", str(REFERENCE_WINDOW),
                "--layer-states"]  # a failing accuracy stage's eval then says which layer diverges (issue 36)
        log_path.write_text(f"$ {' '.join(argv)}\n", encoding="utf-8")
        env = {"PYTHONPATH": str(Path(edgellm.__file__).resolve().parents[1])}
        result = LocalTransport("orchestrator", work).run(argv, timeout=timeout_s, log=log_path, env=env)
        status, kind, reason = classify(result, timeout_s)
        out = StageOutcome(stage=REFERENCE, status=status, error_kind=kind, reason=reason,
                           device="orchestrator", duration_s=result.duration)
        out.artifacts.append(farm.store.put(log_path, ArtifactKind.LOG))
        if status is ResultStatus.PASS:
            ref = farm.store.put(tmp / "reference.npz", ArtifactKind.OTHER)
            keyed.made(ref)
            out.outputs["reference"] = ref
            out.metrics["reference_s"] = (result.duration, "s")
        return out
