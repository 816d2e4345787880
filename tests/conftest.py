"""Session-wide fixtures live in tests/fixtures/; each module there is one concern (checkpoints, services...)."""

pytest_plugins = [
    "tests.fixtures.checkpoints",
    "tests.fixtures.engines",
    "tests.fixtures.sshd",
    "tests.fixtures.postgres",
    "tests.fixtures.prefect",
    "tests.fixtures.farm",
    "tests.fixtures.toolchain",
    "tests.fixtures.browser",
    "tests.fixtures.toolchain_runs",
    "tests.fixtures.quantized",
    "tests.fixtures.board",
    "tests.fixtures.moto",
    "tests.fixtures.session_cost",
]
