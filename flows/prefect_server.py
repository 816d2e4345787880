"""The Prefect server ``edgefarm serve`` starts: Prefect's own app, run as ``prefect server start`` runs it (uvicorn,
services in-process), behind a Host header check. A web page that points its own DNS name at 127.0.0.1 (DNS
rebinding) is, to the browser, the server's own origin: CORS and CSRF tokens do not stop it, but its requests name
its host, and only the loopback names are answered. Prefect offers no setting for that; Starlette's
TrustedHostMiddleware does it. Run as ``python -m edgefarm.flows.prefect_server --host H --port P`` (flows/serve.py)."""

from __future__ import annotations

import argparse
import os

LOOPBACK_NAMES = ("127.0.0.1", "localhost")


def allowed_hosts(host: str) -> list[str]:
    """The Host header values the server answers (without the port): the loopback names it binds to."""
    return sorted({host, *LOOPBACK_NAMES})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvicorn
    from prefect.server.api.server import create_app
    from prefect.settings import (
        PREFECT_SERVER_API_KEEPALIVE_TIMEOUT,
        PREFECT_SERVER_API_WEBSOCKET_PING_INTERVAL,
        PREFECT_SERVER_API_WEBSOCKET_PING_TIMEOUT,
    )
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    app = TrustedHostMiddleware(create_app(final=True), allowed_hosts=allowed_hosts(args.host), www_redirect=False)
    uvicorn.run(app, host=args.host, port=args.port, timeout_keep_alive=PREFECT_SERVER_API_KEEPALIVE_TIMEOUT.value(),
                ws_ping_interval=PREFECT_SERVER_API_WEBSOCKET_PING_INTERVAL.value(),
                ws_ping_timeout=PREFECT_SERVER_API_WEBSOCKET_PING_TIMEOUT.value(),
                log_level=os.environ.get("PREFECT_SERVER_LOGGING_LEVEL", "warning").lower())


if __name__ == "__main__":
    main()
