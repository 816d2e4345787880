"""The test PostgreSQL cluster's own promises: a database a superuser's session holds (the autovacuum worker a freshly
loaded database attracts; the test role may not end it) is dropped once that session ends, not refused (CI failed
once on test_bench_db's teardown with "must be a member of ... pg_signal_backend")."""

from __future__ import annotations

import threading
import time

from sqlalchemy import create_engine

from tests.fixtures.postgres import PostgresServer, _as_postgres, _pg_bin


def test_a_database_a_superuser_session_holds_is_dropped_once_it_ends(postgres: PostgresServer) -> None:
    name = postgres.create_database().rsplit("/", 1)[1]
    held = threading.Thread(target=_as_postgres, args=(
        str(_pg_bin() / "psql"), "-h", postgres.socket_dir, "-p", str(postgres.port), "-U", "postgres", "-d", name,
        "-c", "select pg_sleep(3)"))
    held.start()
    admin = create_engine(postgres.admin_url, isolation_level="AUTOCOMMIT")
    sessions = f"select count(*) from pg_stat_activity where datname = '{name}'"
    try:
        deadline = time.monotonic() + 60
        with admin.connect() as conn:
            while not conn.exec_driver_sql(sessions).scalar():
                assert time.monotonic() < deadline, "the superuser's session never started"
                time.sleep(0.05)
        postgres.drop_database(name)  # refused at once without waiting for the session
        with admin.connect() as conn:
            assert not conn.exec_driver_sql(f"select 1 from pg_database where datname = '{name}'").scalar()
    finally:
        held.join()
        admin.dispose()
