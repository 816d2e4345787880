"""``edgefarm serve``: a local Prefect server plus a runner serving the deployments of infra/prefect.yaml, so the
nightly cron schedule fires on one machine. Production runs the same deployments on a shared server with one
worker per platform pool (infra/README.md).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from edgellm.errors import ConfigurationError, InfrastructureError

PREFECT_YAML = Path(__file__).resolve().parent.parent / "infra" / "prefect.yaml"
log = logging.getLogger(__name__)


def load_deployment_specs(path: Path = PREFECT_YAML) -> list[dict[str, Any]]:
    """The deployments declared in prefect.yaml (YAML anchors resolved)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"{path}: cannot read deployments: {exc}".replace("\n", " ")) from None
    deployments = data.get("deployments") if isinstance(data, dict) else None
    if not isinstance(deployments, list) or not deployments:
        raise ConfigurationError(f"{path}: no 'deployments' list")
    return deployments


def wait_healthy(api_url: str, timeout_s: float = 60.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise InfrastructureError(f"Prefect server exited with code {proc.returncode} while starting")
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise InfrastructureError(f"Prefect server at {api_url} not healthy after {timeout_s:.0f} s")


def start_server(host: str, port: int, log_file: Path) -> tuple[subprocess.Popen[bytes], str]:
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ConfigurationError(f"serve binds to loopback only; got host {host!r} (valid: 127.0.0.1, localhost)")
    api_url = f"http://{host}:{port}/api"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=os.environ.copy(),
        )
    try:
        wait_healthy(api_url, proc=proc)
    except BaseException:
        stop_server(proc)
        raise
    return proc, api_url


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def serve(host: str, port: int, data_dir: Path, names: list[str] | None = None) -> int:
    """Start the server, then serve the chosen deployments (default: nightly and l0-x86-cpu) until interrupted.
    Prefect must not have been imported yet: its API URL is set here."""
    if "prefect" in sys.modules:
        raise ConfigurationError("serve must run before Prefect is imported (its API URL is set at start)")
    specs = {d["name"]: d for d in load_deployment_specs()}
    wanted = names or ["nightly", "l0-x86-cpu"]
    unknown = [n for n in wanted if n not in specs]
    if unknown:
        raise ConfigurationError(f"unknown deployment(s) {', '.join(unknown)}; known: {', '.join(sorted(specs))}")
    # Started in the background by a non-interactive shell, SIGINT is ignored, and Prefect's runner turns SIGTERM
    # into SIGINT: restore the default so `kill` stops serve (and the server with it).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    proc, api_url = start_server(host, port, data_dir / "prefect" / "server.log")
    os.environ["PREFECT_API_URL"] = api_url
    try:
        from prefect import serve as prefect_serve

        deployments = [_to_deployment(specs[n]) for n in wanted]
        log.warning("Prefect server at %s; serving %s", api_url.removesuffix("/api"), ", ".join(wanted))
        prefect_serve(*deployments, print_starting_message=False)
    finally:
        stop_server(proc)
    return 0


def _to_deployment(spec: dict[str, Any]) -> Any:
    from prefect.flows import load_flow_from_entrypoint

    root = PREFECT_YAML.parent.parent
    file, func = spec["entrypoint"].split(":")
    flow = load_flow_from_entrypoint(f"{root / file}:{func}")
    from prefect.schedules import Cron

    schedules = [Cron(s["cron"], timezone=s.get("timezone") or "UTC") for s in spec.get("schedules") or []
                 if "cron" in s]
    return flow.to_deployment(
        name=spec["name"], parameters=spec.get("parameters") or {}, tags=spec.get("tags") or [],
        description=spec.get("description"), schedules=schedules or None,
    )
