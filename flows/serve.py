"""``edgefarm serve``: a local Prefect server with its UI plus a runner serving the deployments of infra/prefect.yaml,
so the nightly cron schedule fires on one machine and people watch runs, read logs and retry in the UI. Production
runs the same deployments on a shared server with one worker per platform pool (infra/README.md).
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgefarm.devices.lifetime import die_with_parent
from edgellm.errors import ConfigurationError, InfrastructureError
from edgellm.yamlio import read_yaml

PREFECT_YAML = Path(__file__).resolve().parent.parent / "infra" / "prefect.yaml"
log = logging.getLogger(__name__)


def load_deployment_specs(path: Path = PREFECT_YAML) -> list[dict[str, Any]]:
    """The deployments declared in prefect.yaml (YAML anchors resolved)."""
    data = read_yaml(path, aliases=True)  # Prefect's format shares settings through anchors: bounded expansion
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


def ui_env(api_url: str, static_dir: Path) -> dict[str, str]:
    """Settings for a server that serves Prefect's UI: the UI's build is copied under the farm's data dir (not into
    the installed package), it talks to this server's API, and shows no promotional content (offline)."""
    return {"PREFECT_UI_ENABLED": "true", "PREFECT_UI_API_URL": api_url, "PREFECT_UI_STATIC_DIRECTORY": str(static_dir),
            "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false"}


def guard_env(host: str, port: int, auth: str | None = None) -> dict[str, str]:
    """Settings that keep web pages out of a loopback server's API (a page open in the operator's browser could
    otherwise read run parameters and logs, or start deployments): only the UI's own origin may make cross-origin
    requests, every state-changing request needs Prefect's CSRF token (which only those origins can read), and
    with ``auth`` every request needs it as HTTP basic auth. A guarded server also answers loopback Host names only
    (flows/prefect_server.py), which stops a page that points its own DNS name at 127.0.0.1."""
    origins = sorted({f"http://{h}:{port}" for h in (host, "127.0.0.1", "localhost")})
    env = {"PREFECT_SERVER_CSRF_PROTECTION_ENABLED": "true", "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED": "true",
           "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": ",".join(origins)}
    if auth is not None:
        if ":" not in auth or not auth.split(":", 1)[1]:
            raise ConfigurationError(f"$EDGEFARM_SERVE_AUTH_STRING must be USER:PASSWORD with a password; got a "
                                     f"value of {len(auth)} characters without one")
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth
    return env


def start_server(host: str, port: int, log_file: Path, *, ui: bool = False, guard: dict[str, str] | None = None,
                 timeout_s: float = 60.0) -> tuple[subprocess.Popen[bytes], str]:
    """A Prefect server on loopback, healthy when this returns; with ``ui`` it also serves the UI at the API's
    root (the UI's files go next to ``log_file``); ``guard``: settings of :func:`guard_env`, and the Host check."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise ConfigurationError(f"serve binds to loopback only; got host {host!r} (valid: 127.0.0.1, localhost)")
    api_url = f"http://{host}:{port}/api"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    env = os.environ.copy()
    if ui:
        env.update(ui_env(api_url, log_file.parent / "ui"))
    env.update(guard or {})
    if guard:  # Prefect's app behind a Host header check (flows/prefect_server.py)
        env["PREFECT_SERVER_UI_ENABLED"] = "true" if ui else "false"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PREFECT_YAML.parent.parent), env.get("PYTHONPATH")) if p)
        command = [sys.executable, "-m", "edgefarm.flows.prefect_server", "--host", host, "--port", str(port)]
    else:
        command = [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port),
                   "--ui" if ui else "--no-ui"]
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
            preexec_fn=die_with_parent,  # never outlives serve (or a run's temporary server, its runner)
        )
    try:
        wait_healthy(api_url, timeout_s, proc=proc)
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


def serve(host: str, port: int, data_dir: Path, names: list[str] | None = None,
          announce: Callable[[str], None] | None = None, auth: str | None = None) -> int:
    """Start the server with its UI, then serve the chosen deployments (default: nightly and l0-x86-cpu) until
    interrupted; ``announce`` gets the UI's URL once the server is healthy; ``auth``: the login its API asks
    for (Settings.serve_auth), if any. Prefect must not have been imported
    yet: its API URL is set here."""
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
    guard = guard_env(host, port, auth)
    # a first start migrates a new database and copies the UI's files: minutes on a busy small machine
    proc, api_url = start_server(host, port, data_dir / "prefect" / "server.log", ui=True, guard=guard,
                                 timeout_s=300)
    os.environ["PREFECT_CLIENT_CSRF_SUPPORT_ENABLED"] = "true"  # this process's runner is a client of that API
    if "PREFECT_SERVER_API_AUTH_STRING" in guard:
        os.environ["PREFECT_API_AUTH_STRING"] = guard["PREFECT_SERVER_API_AUTH_STRING"]
    os.environ["PREFECT_API_URL"] = api_url
    os.environ["PREFECT_UI_URL"] = api_url.removesuffix("/api")
    try:
        from prefect import serve as prefect_serve

        deployments = [_to_deployment(specs[n]) for n in wanted]
        log.info("Prefect server at %s; serving %s", api_url, ", ".join(wanted))
        if announce is not None:
            announce(api_url.removesuffix("/api"))
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
