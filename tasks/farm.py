"""What every task needs, opened once per process: the results database, the artifact store, the registries
(``registries``: device types, toolchains, site directory) and the inventory checked against them.

A ``FarmContext`` is the small, serializable value flows pass to tasks; ``Farm.get(ctx)`` turns it into handles.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from edgefarm.artifacts.location import DEFAULT_CACHE_GB, open_store
from edgefarm.artifacts.store import Store
from edgefarm.devices.inventory import Inventory, load_inventory
from edgefarm.registries import Registries, current
from edgefarm.results.db import Engine, from_parameter, make_engine
from edgefarm.results.recorder import Recorder


@dataclass(frozen=True)
class FarmContext:
    run_id: int
    db_url: str  # password hidden (results.db.for_parameters): tasks' parameters are stored by Prefect
    data_dir: str
    inventory_dir: str
    host_slots: int = 2  # stages that run on the orchestrating host (quantize, export, reference) at once
    quantize_device: str = "cpu"  # the quantizer's --device on the orchestrating host
    max_unquantized_share: float = 0.0  # a quantized checkpoint leaving more of its linears in float fails
    fetch_engines: bool = False  # also copy every built engine's bytes into the store (they stay on the device)
    artifacts: str = ""  # the store's URL (artifacts.location; "" = <data dir>/artifacts): names no credential
    artifact_cache_gb: float = DEFAULT_CACHE_GB  # the bound of this worker's cache of a bucket
    quantize_on: str = ""  # the work pool quantize stages are sent to (tasks.dispatch); "": run them here
    revision: str = ""  # the run's code revision (flows.revision): a worker a stage is sent to must run it
    source_digest: str = ""

    @property
    def host_work_dir(self) -> Path:
        return Path(self.data_dir) / "host"

    @property
    def scratch_dir(self) -> Path:
        """Temporary work of stages on this host: each entry is marked in use by its owner
        (``artifacts.inuse.held_dir``), so gc and the next run remove exactly what dead runs left."""
        return self.host_work_dir / "scratch"


def pool_options(url: str) -> dict[str, int]:
    """The run's connection pool: every stage thread (a lab's platforms run hundreds at once), its lease's
    heartbeat and its record may want a connection together. SQLite's are cheap (one file; writers queue on its
    lock anyway): one for each. PostgreSQL's count against the server's max_connections: a bounded pool, queued for."""
    if url.startswith("sqlite"):
        return {"pool_size": 16, "max_overflow": 1024, "pool_timeout": 120}
    return {"pool_size": 10, "max_overflow": 30, "pool_timeout": 120}


@dataclass
class Farm:
    ctx: FarmContext
    engine: Engine
    store: Store
    recorder: Recorder
    registries: Registries
    inventory: Inventory
    host_slots: threading.BoundedSemaphore
    bad_devices: set[str] = field(default_factory=set)  # devices that failed (infrastructure) in this run
    # device id -> its environment (the agent's env); "<device>\0<toolchain>" -> what the toolchain's probe read
    backend_versions: dict[str, dict[str, object]] = field(default_factory=dict)
    touched_devices: set[str] = field(default_factory=set)  # devices whose cache entries this run marked in use
    lock: threading.Lock = field(default_factory=threading.Lock)
    # device id -> slots this run's own leases hold now (tasks.device_exec): a device this run already fills is not
    # asked of the database again, and a slot it frees wakes the stages waiting for one (``slots_freed``)
    held_slots: dict[str, int] = field(default_factory=dict)
    slots_freed: threading.Condition = field(default_factory=threading.Condition)
    # under ``slots_freed`` too: device id -> this run's stages waiting for that device alone (pinned to the engine it
    # holds), and -> stages free to run anywhere (builds) this run placed on it; such a stage prefers devices with
    # fewer of both (``tasks.device_exec.preferred``), so builds and the pinned runs after them spread over a platform
    pinned_waiting: Counter[str] = field(default_factory=Counter)
    placed: Counter[str] = field(default_factory=Counter)

    _instances: ClassVar[dict[FarmContext, Farm]] = {}
    _guard: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def get(cls, ctx: FarmContext) -> Farm:
        with cls._guard:
            farm = cls._instances.get(ctx)
            if farm is None:
                url = from_parameter(ctx.db_url) or ctx.db_url
                engine = make_engine(url, **pool_options(url))
                # the bucket's endpoint and credentials: this process's AWS_* (never a parameter)
                store = open_store(ctx.artifacts or None, ctx.data_dir, cache_gb=ctx.artifact_cache_gb,
                                   environ=os.environ)
                registries = current()
                farm = cls(ctx=ctx, engine=engine, store=store, recorder=Recorder(engine), registries=registries,
                           inventory=load_inventory(ctx.inventory_dir, data_dir=ctx.data_dir, registries=registries),
                           host_slots=threading.BoundedSemaphore(ctx.host_slots))
                cls._instances[ctx] = farm
            return farm

    @classmethod
    def close(cls, ctx: FarmContext) -> None:
        with cls._guard:
            farm = cls._instances.pop(ctx, None)
        if farm is not None:
            farm.store.close()  # what the run put is kept from now on only if its results refer to it
            farm.engine.dispose()
