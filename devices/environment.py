"""The environment a stage command (a vendor tool, the board agent, the library's CLI) gets from the process that
starts it on this machine: ours, less every credential. A tool on a device needs neither the artifact store's keys
nor the results database's URL; what a device or step declares it needs (``Device.env``, a step's env) is added by
the caller after this, by name.

Dropped: variables named like a credential (``AWS_*``, ``EDGEFARM_DB_URL``, ``DATABASE_URL``, ``PG*`` secrets, an SSH
agent's socket, ``*PASSWORD*``, ``*_TOKEN*``, ``*SECRET*``, ``*CREDENTIAL*``, ``*API_KEY*``, ``*ACCESS_KEY*``,
``*PRIVATE_KEY*``, ``*_AUTH*``), and any variable whose value holds a secret by ``edgellm.redact``'s rules (a proxy
URL with a password, ``password=...``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from edgellm.redact import redact

_CREDENTIAL = re.compile(
    r"^AWS_|^EDGEFARM_DB_URL$|^DATABASE_URL$|^PG(PASSWORD|PASSFILE|SERVICEFILE|SSLKEY)$|^SSH_AUTH_SOCK$|ASKPASS"
    r"|PASSWORD|PASSWD|(^|_)TOKENS?(_|$)|SECRET|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|(^|_)AUTH",
    re.IGNORECASE)  # TOKEN as a word: TOKENIZERS_PARALLELISM is no credential


def is_credential(name: str, value: str) -> bool:
    """Whether the variable ``name=value`` carries a credential (by its name or its value)."""
    return bool(_CREDENTIAL.search(name)) or redact(value) != value


def stage_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (this process's by default) without its credentials: the base of every stage command's
    environment."""
    source = os.environ if environ is None else environ
    return {name: value for name, value in source.items() if not is_credential(name, value)}
