"""Work pools by name, and the deployments stages are sent to.

A pool is where a Prefect worker takes flow runs from (one per platform, ``orchestrator`` for the nightly, and any
pool declared a quantization host: ``quantize_on``). A quantize stage sent to pool P runs the deployment
``quantize-checkpoint/quantize-on-P`` (infra/prefect.yaml), on a worker of P.
"""

from __future__ import annotations

import re

from edgellm.errors import ConfigurationError

POOL_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
QUANTIZE_FLOW = "quantize-checkpoint"


def check_pool_name(name: object) -> str:
    """``name`` when it is a work pool name this farm uses (lowercase letters, digits, '-', at most 63), else a
    ConfigurationError naming it."""
    if not isinstance(name, str) or not POOL_NAME.fullmatch(name):
        shown = repr(name) if len(repr(name)) <= 70 else f"{repr(name)[:60]}..."
        raise ConfigurationError(f"bad work pool name {shown}; valid: lowercase letters, digits and '-', starting "
                                 f"with a letter or digit, at most 63 characters (e.g. x86-h200)")
    return name


def quantize_deployment_name(pool: str) -> str:
    """The deployment whose runs quantize on a worker of ``pool``."""
    return f"quantize-on-{check_pool_name(pool)}"


def quantize_deployment(pool: str) -> str:
    """``flow/deployment`` as ``run_deployment`` and ``prefect deployment run`` name it."""
    return f"{QUANTIZE_FLOW}/{quantize_deployment_name(pool)}"
