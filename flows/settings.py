"""Where the farm keeps its state, resolved once per command or flow run: flag, else environment, else the embedded
default. The only reader of the farm's environment variables; everything else is handed these values (the store,
the database, the inventory, the toolchain drivers) and nothing writes them back into the environment."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edgefarm.artifacts.location import DEFAULT_CACHE_GB, S3Location, open_store, parse_artifacts_url
from edgefarm.artifacts.store import Store
from edgefarm.devices.inventory import INVENTORY_ENV, PACKAGED_INVENTORY_DIR
from edgefarm.devices.pools import check_pool_name
from edgefarm.registries import Registries
from edgefarm.results.db import default_url, from_parameter
from edgefarm.toolchains.base import Index, WheelSource
from edgellm import __version__
from edgellm.errors import ConfigurationError

ENV_DATA_DIR = "EDGEFARM_DATA_DIR"
ENV_DB_URL = "EDGEFARM_DB_URL"
ENV_DOCS_DIR = "EDGEFARM_DOCS_DIR"
ENV_QUANTIZE_DEVICE = "EDGEFARM_QUANTIZE_DEVICE"
ENV_MAX_UNQUANTIZED_SHARE = "EDGEFARM_MAX_UNQUANTIZED_SHARE"
ENV_FETCH_ENGINES = "EDGEFARM_FETCH_ENGINES"
ENV_SERVE_AUTH = "EDGEFARM_SERVE_AUTH_STRING"  # "user:password" the API of `edgefarm serve` asks for
ENV_ARTIFACTS = "EDGEFARM_ARTIFACTS"  # where the artifact store keeps its bytes (artifacts.location)
ENV_ARTIFACT_CACHE_GB = "EDGEFARM_ARTIFACT_CACHE_GB"  # the bound of a worker's read-through cache of a bucket
ENV_TOOLCHAIN_INDEX = "EDGEFARM_TOOLCHAIN_INDEX"  # where toolchain installs get wheels (toolchains.mirror.Index)
ENV_SITE_DIR = "EDGEFARM_SITE_DIR"  # a lab's device types, lists, matrices, inventory, catalog (devices.site)
ENV_QUANTIZE_ON = "EDGEFARM_QUANTIZE_ON"  # the work pool quantize stages are sent to (over a matrix's quantize_on)
ENV_HOST_SLOTS = "EDGEFARM_HOST_SLOTS"  # host stages (quantize, export, reference) at once on the orchestrating host
MAX_HOST_SLOTS = 1024
BOOLEANS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False, "": False}
QUANTIZE_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Settings:
    # the real URL (a password included): never a flow parameter (results.db.for_parameters), nor in this repr
    db_url: str = field(repr=False)
    data_dir: Path
    inventory_dir: Path
    docs_dir: Path
    quantize_device: str = "cpu"  # where the quantizer runs on the orchestrating host ($EDGEFARM_QUANTIZE_DEVICE)
    # the share of a checkpoint's linears a quantization method may leave in float ($EDGEFARM_MAX_UNQUANTIZED_SHARE)
    max_unquantized_share: float = 0.0
    # also copy each built engine's bytes into the store ($EDGEFARM_FETCH_ENGINES=1); by default engines stay on
    # the device that built them and only their manifest and read-back files come back
    fetch_engines: bool = False
    serve_auth: str | None = field(default=None, repr=False)  # $EDGEFARM_SERVE_AUTH_STRING (a secret: never shown)
    # where the artifact store keeps its bytes ($EDGEFARM_ARTIFACTS, artifacts.location): None = <data dir>/artifacts,
    # else a directory or s3://bucket/prefix (validated: it never carries a credential, those stay in AWS_*)
    artifacts: str | None = None
    artifact_cache_gb: float = DEFAULT_CACHE_GB  # $EDGEFARM_ARTIFACT_CACHE_GB: a worker's cache of the bucket
    # $EDGEFARM_QUANTIZE_ON: the work pool whose worker runs quantize stages (a GPU host's); None: the matrix's
    # quantize_on, else this host. Needs an artifact store every worker reaches (s3://)
    quantize_on: str | None = None
    # where toolchain installs get their wheels ($EDGEFARM_TOOLCHAIN_INDEX, toolchains.mirror): auto, mirror, registry
    toolchain_index: Index = Index.AUTO
    host_slots: int = 2  # $EDGEFARM_HOST_SLOTS: host stages at once on this host (its cores and memory allow more)
    data_dir_from: str = "default"  # what named the data dir: "--data-dir", "$EDGEFARM_DATA_DIR" or "default"

    @classmethod
    def resolve(cls, *, db: str | None = None, data_dir: str | Path | None = None,
                inventory: str | Path | None = None, docs_dir: str | Path | None = None, create: bool = True,
                environ: Mapping[str, str] | None = None) -> Settings:
        """The flags given, else ``environ`` (default: this process's environment), else the defaults: data dir
        ``./.data``, database ``<data dir>/edgefarm.db``, the packaged inventory, docs ``<data dir>/docs``.
        ``db`` may be a flow parameter whose password is hidden (results.db.for_parameters). ``create``: make the
        data dir (commands that only read leave the disk as it is)."""
        env = os.environ if environ is None else environ
        if environ is None:  # this process's settings: its site directory, unless the command line set one
            from edgefarm.devices.site import configure_default

            configure_default(env.get(ENV_SITE_DIR) or None)
            from edgefarm.results.liveness import ENV_HEARTBEAT_S, configure_heartbeat

            configure_heartbeat(env.get(ENV_HEARTBEAT_S))
        root = Path(data_dir or env.get(ENV_DATA_DIR) or Path.cwd() / ".data").resolve()
        if create:
            root.mkdir(parents=True, exist_ok=True)
        configured_db = env.get(ENV_DB_URL) or None
        db_url = from_parameter(db, configured_db) or configured_db or default_url(root)
        inv = Path(inventory or env.get(INVENTORY_ENV) or PACKAGED_INVENTORY_DIR)
        docs = Path(docs_dir or env.get(ENV_DOCS_DIR) or root / "docs")
        return cls(db_url=db_url, data_dir=root, inventory_dir=inv.resolve(), docs_dir=docs.resolve(),
                   quantize_device=_quantize_device(env), max_unquantized_share=_max_unquantized_share(env),
                   fetch_engines=_flag(env, ENV_FETCH_ENGINES), serve_auth=env.get(ENV_SERVE_AUTH) or None,
                   artifacts=_artifacts(env), artifact_cache_gb=_artifact_cache_gb(env),
                   quantize_on=_quantize_on(env), toolchain_index=_toolchain_index(env),
                   host_slots=_host_slots(env),
                   data_dir_from="--data-dir" if data_dir else f"${ENV_DATA_DIR}" if env.get(ENV_DATA_DIR)
                   else "default")

    def existing_db_url(self) -> str:
        """The database URL for a command that only reads it. Where it is the embedded default (no --db, no
        $EDGEFARM_DB_URL) and there is no database there, a ConfigurationError that says where it looked, that the
        default data dir is ./.data relative to the current directory, and how to point at the farm's state; a URL
        given explicitly is left to the database layer (its own message names it)."""
        if self.db_url != default_url(self.data_dir) or (self.data_dir / "edgefarm.db").is_file():
            return self.db_url
        missing = (f"the farm's data dir {str(self.data_dir)!r} does not exist" if not self.data_dir.exists()
                   else f"there is no results database in the farm's data dir {str(self.data_dir)!r}")
        where = (f"the default, ./.data relative to the current directory ({str(Path.cwd())!r})"
                 if self.data_dir_from == "default" else f"what {self.data_dir_from} names")
        raise ConfigurationError(
            f"{missing}: looked there because it is {where}\n"
            f"cd to the checkout that ran the farm (where `make nightly` made .data), or pass --data-dir DIR or set "
            f"{ENV_DATA_DIR}=DIR, or name the database with --db URL or {ENV_DB_URL}")

    def registries(self) -> Registries:
        """The farm's registries (device types, toolchains, site directory: ``registries``), built once
        per process from the site directory these settings configured."""
        from edgefarm.registries import current

        return current()

    def artifact_store(self) -> Store:
        """The store these settings name, opened with this process's AWS_* (endpoint, region, credentials)."""
        return open_store(self.artifacts, self.data_dir, cache_gb=self.artifact_cache_gb, environ=os.environ)

    def toolchain_wheels(self) -> WheelSource:
        """Where toolchain installs get their wheels: the store's mirrors and/or the registry (the store is
        opened only when an install looks). Messages name a bucket by its URL and a directory store by its
        setting (no host path reaches a published skip reason)."""
        where = parse_artifacts_url(self.artifacts)
        shown = (where.url if isinstance(where, S3Location) else "the artifact store <data dir>/artifacts"
                 if where is None else f"the directory ${ENV_ARTIFACTS} names")
        return WheelSource(self.toolchain_index, shown, self.artifact_store, setting=ENV_TOOLCHAIN_INDEX)


def _artifacts(env: Mapping[str, str]) -> str | None:
    raw = (env.get(ENV_ARTIFACTS) or "").strip()
    parse_artifacts_url(raw)  # a bad URL fails here, before anything runs (shown with any secret hidden)
    return raw or None


def _quantize_on(env: Mapping[str, str]) -> str | None:
    raw = (env.get(ENV_QUANTIZE_ON) or "").strip()
    if not raw:
        return None
    try:
        return check_pool_name(raw)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{ENV_QUANTIZE_ON}: {exc}") from None


def _toolchain_index(env: Mapping[str, str]) -> Index:
    return Index(Index.parse(env.get(ENV_TOOLCHAIN_INDEX) or Index.AUTO.value, what=ENV_TOOLCHAIN_INDEX).value)


def _artifact_cache_gb(env: Mapping[str, str]) -> float:
    raw = env.get(ENV_ARTIFACT_CACHE_GB) or str(DEFAULT_CACHE_GB)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise ConfigurationError(f"bad {ENV_ARTIFACT_CACHE_GB} {raw!r}; valid: a size in GB >= 0 "
                                 f"(default {DEFAULT_CACHE_GB:g})")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "")
    if raw.strip().lower() not in BOOLEANS:
        raise ConfigurationError(f"bad {name} {raw!r}; valid: {', '.join(k for k in BOOLEANS if k)} (or unset)")
    return BOOLEANS[raw.strip().lower()]


def _quantize_device(env: Mapping[str, str]) -> str:
    value = env.get(ENV_QUANTIZE_DEVICE) or "cpu"
    if value not in QUANTIZE_DEVICES:
        raise ConfigurationError(f"bad {ENV_QUANTIZE_DEVICE} {value!r}; valid: {', '.join(QUANTIZE_DEVICES)}")
    return value


def _host_slots(env: Mapping[str, str]) -> int:
    raw = env.get(ENV_HOST_SLOTS) or "2"
    if not raw.strip().isdigit() or not 1 <= int(raw) <= MAX_HOST_SLOTS:
        raise ConfigurationError(f"bad {ENV_HOST_SLOTS} {raw!r}; valid: an integer from 1 to {MAX_HOST_SLOTS}")
    return int(raw)


def _max_unquantized_share(env: Mapping[str, str]) -> float:
    raw = env.get(ENV_MAX_UNQUANTIZED_SHARE) or "0"
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ConfigurationError(f"bad {ENV_MAX_UNQUANTIZED_SHARE} {raw!r}; valid: a fraction in [0, 1]")
    return value


def code_version() -> str:
    """The git commit of this checkout when there is one, else the edgellm version."""
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return f"edgellm-{__version__}"
    sha = out.stdout.strip()
    if out.returncode != 0 or not sha:
        return f"edgellm-{__version__}"
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    return f"{sha}{'-dirty' if dirty else ''}"


def configure_site(value: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Path | None:
    """The site directory of this process (``devices.site``): ``value`` (``edgefarm --site-dir``), else
    ``$EDGEFARM_SITE_DIR``, else none; checked, and set before any registry is built from it."""
    from edgefarm.devices.site import configure

    env = os.environ if environ is None else environ
    return configure(value if value is not None else env.get(ENV_SITE_DIR) or None)
