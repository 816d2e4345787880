#!/usr/bin/env bash
# Installs the system packages the tests need: the OpenSSH server and PostgreSQL binaries (the test harness starts
# its own sshd hosts and PostgreSQL cluster on 127.0.0.1 and stops them at the end; no daemon is started here) and
# Debian's Chromium, which the browser tests drive headless to look at the published pages and Prefect's UI.
set -euo pipefail

need=()
command -v /usr/sbin/sshd >/dev/null 2>&1 || need+=(openssh-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium fonts-liberation)
if ((${#need[@]} == 0)); then
  echo "system packages present: sshd, PostgreSQL, $(chromium --version 2>/dev/null || echo chromium)"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "missing system packages: ${need[*]} (install them as root: apt-get install ${need[*]})" >&2
  exit 1
fi
echo "installing system packages: ${need[*]}"
# Keep apt from starting daemons on default ports, and from creating an unused default cluster.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
fi
mkdir -p /etc/postgresql-common/createcluster.d
echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/ci.conf
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${need[@]}"
# Fail here, visibly, rather than in the browser tests.
chromium --version
