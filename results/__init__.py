"""Results database: runs, per-stage results, metrics, artifact refs, device health, toolchains, device leases.

- ``db``: URLs (the default ``<data dir>/edgefarm.db``; flows/settings.py resolves which), engines, sessions.
- ``models``: the typed ORM schema; ``migrate`` + ``migrations/``: Alembic, shipped in the package.
- ``recorder.Recorder``: the write API (idempotent); ``queries``: latest/passing/history/regressions.
- ``leases``: a device's parallel-job slots, held in the database (``edgefarm db ...`` lives in cli/).
"""
