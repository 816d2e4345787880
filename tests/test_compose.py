"""infra/docker-compose.yml starts a farm that works: every worker serves a pool infra/prefect.yaml deploys to, each
with its own data volume (no shared disk: the artifact store is the bundled MinIO bucket), no secret written in, ports
on loopback only; `docker compose config` accepts it (where Compose v2 is installed: scripts/install-compose.sh); and
infra/README.md's compose commands name only services and profiles the file has."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "infra" / "docker-compose.yml"
PREFECT_YAML = REPO / "infra" / "prefect.yaml"
README = REPO / "infra" / "README.md"
DATA_DIR = "/var/lib/edgefarm"  # EDGEFARM_DATA_DIR in the workers
# A secret in the file is only ever a required variable: compose refuses to start without it.
REQUIRED = re.compile(r"\$\{([A-Z][A-Z0-9_]*):\?[^}]+\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))  # merge keys (<<: *worker) resolved


def _services() -> dict[str, dict]:
    return _compose()["services"]


def _workers() -> dict[str, str]:
    """Service name -> the pool its `prefect worker start --pool POOL` serves."""
    workers = {}
    for name, service in _services().items():
        command = service.get("command") or []
        if command[:3] == ["prefect", "worker", "start"]:
            workers[name] = command[command.index("--pool") + 1]
    return workers


def _deployed_pools() -> set[str]:
    return {d["work_pool"]["name"] for d in yaml.safe_load(PREFECT_YAML.read_text(encoding="utf-8"))["deployments"]}


def _strings(node: object) -> list[str]:
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return [node] if isinstance(node, str) else []


def _required_variables() -> set[str]:
    return {name for text in _strings(_compose()) for name in REQUIRED.findall(text)}


def _default(value: str) -> str:
    """What compose substitutes for `${VAR:-default}` / `${VAR-default}` when VAR is unset."""
    return re.sub(r"\$\{[A-Z0-9_]+:?-([^}]*)\}", r"\1", value)


def test_every_service_has_an_image_or_a_build() -> None:
    services = _services()
    assert {"postgres", "prefect-server", "minio", "minio-init", "migrate", "register"} <= set(services)
    for name, service in services.items():
        assert service.get("image") or service.get("build"), f"service {name} has neither image nor build"
        if "image" in service and not service.get("build"):
            assert ":" in service["image"] and not service["image"].endswith(":latest"), \
                f"service {name}: pin its image's tag ({service['image']})"
    assert re.fullmatch(r"minio/minio:RELEASE\.[0-9TZ-]+", services["minio"]["image"]), services["minio"]["image"]


def test_the_worker_image_never_holds_the_inventory() -> None:
    # the inventory (and the SSH keys it names) is mounted read-only at run time, never copied into the image
    mounts = {m for name in _workers() for m in _services()[name]["volumes"]}
    assert "./inventory:/etc/edgefarm/inventory:ro" in mounts
    ignored = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert "infra/inventory" in ignored and ".data" in ignored, ignored
    assert "COPY . ." in (REPO / "infra" / "worker.Dockerfile").read_text(encoding="utf-8")


def test_every_worker_serves_a_deployed_pool_and_every_pool_has_a_worker() -> None:
    workers, pools, services = _workers(), _deployed_pools(), _services()
    assert set(workers.values()) <= pools, f"workers of pools infra/prefect.yaml never deploys to: " \
                                           f"{sorted(set(workers.values()) - pools)} (deployed: {sorted(pools)})"
    assert pools <= set(workers.values()), \
        f"pools with deployments but no worker: {sorted(pools - set(workers.values()))}"
    # `up` starts the orchestrator and the local x86-cpu worker; a hardware pool's worker only with its profile
    for name, pool in workers.items():
        profiles = services[name].get("profiles")
        if pool in ("orchestrator", "x86-cpu"):
            assert not profiles, f"{name} must start with a plain `up`, not only with profiles {profiles}"
        else:
            assert profiles == [pool], f"{name} (pool {pool}) must run only with `--profile {pool}`, has {profiles}"


def test_every_worker_has_its_own_data_volume_and_no_volume_is_shared_writable() -> None:
    compose, workers = _compose(), _workers()
    writers: dict[str, list[str]] = {}
    for name, service in compose["services"].items():
        for mount in service.get("volumes") or []:
            source, _target, *mode = mount.split(":")
            if mode != ["ro"]:
                writers.setdefault(source, []).append(name)
    shared = {source: names for source, names in writers.items() if len(names) > 1}
    assert not shared, f"mounted read-write by more than one service (the workers share no disk): {shared}"
    for name in workers:
        data = [m.split(":")[0] for m in compose["services"][name].get("volumes") or [] if m.split(":")[1] == DATA_DIR]
        assert len(data) == 1 and data[0] in compose["volumes"], f"{name} needs its own named volume at {DATA_DIR}"


def test_workers_use_the_bundled_bucket_once_it_exists() -> None:
    services, workers = _services(), _workers()
    assert workers
    for name in workers:
        env, depends = services[name]["environment"], services[name]["depends_on"]
        assert _default(env["EDGEFARM_ARTIFACTS"]).startswith("s3://"), f"{name}: {env['EDGEFARM_ARTIFACTS']}"
        assert _default(env["AWS_ENDPOINT_URL"]) == "http://minio:9000", f"{name}: {env['AWS_ENDPOINT_URL']}"
        assert env["AWS_REGION"] and env["AWS_ACCESS_KEY_ID"] and env["AWS_SECRET_ACCESS_KEY"]
        for one_shot in ("minio-init", "migrate"):
            assert depends.get(one_shot, {}).get("condition") == "service_completed_successfully", \
                f"{name} must wait for {one_shot} to finish"
    init = services["minio-init"]
    assert init["depends_on"]["minio"]["condition"] == "service_healthy" and services["minio"].get("healthcheck")
    # the farm's key in minio-init is the one the workers use, and its bucket is EDGEFARM_ARTIFACTS's
    env = services["worker-orchestrator"]["environment"]
    assert (init["environment"]["FARM_ARTIFACTS"], init["environment"]["FARM_KEY_ID"],
            init["environment"]["FARM_SECRET"]) == (env["EDGEFARM_ARTIFACTS"], env["AWS_ACCESS_KEY_ID"],
                                                    env["AWS_SECRET_ACCESS_KEY"])


def test_no_secret_is_written_in_the_file() -> None:
    for name, service in _services().items():
        environment = service.get("environment") or {}
        assert isinstance(environment, dict), f"{name}: write environment as a mapping"
        for key, value in environment.items():
            value = str(value)
            if SECRET_NAME.search(key):
                assert REQUIRED.fullmatch(value), f"{name}: {key} must be ${{VAR:?...}} (from the shell), not {value!r}"
            for password in re.findall(r"://[^:/@\s]+:([^@\s]+)@", value):
                assert REQUIRED.fullmatch(password), f"{name}: {key} carries a written password {password!r}"
    assert {"EDGEFARM_DB_PASSWORD", "MINIO_ROOT_PASSWORD", "AWS_SECRET_ACCESS_KEY"} <= _required_variables()


def test_published_ports_are_on_loopback_only() -> None:
    published = {name: service["ports"] for name, service in _services().items() if service.get("ports")}
    assert "minio" in published and "prefect-server" in published
    for name, ports in published.items():
        for port in ports:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port!r} beyond this host's loopback"


def _script(service: str) -> str:
    command = _services()[service]["command"]
    assert _services()[service]["entrypoint"][:2] == ["/bin/sh", "-ec"] and len(command) == 1
    return command[0].replace("$$", "$")  # compose's escape of a literal $


def test_one_shot_scripts_run_and_grant_what_the_store_needs(tmp_path: Path) -> None:
    for service in ("minio-init", "register"):
        check = subprocess.run(["sh", "-n", "-c", _script(service)], capture_output=True, text=True)
        assert check.returncode == 0, f"{service}'s script: {check.stderr}"
    # minio-init with mc stubbed: the bucket it makes and the policy it gives the farm's user
    env = _services()["minio-init"]["environment"]
    script = _script("minio-init").replace("/tmp/farm-policy.json", str(tmp_path / "policy.json"))
    stub = 'mc() { echo "mc $*"; }\n'
    run = subprocess.run(["sh", "-ec", stub + script], capture_output=True, text=True, timeout=30,
                         env={"PATH": os.environ["PATH"], "FARM_ARTIFACTS": _default(env["FARM_ARTIFACTS"]),
                              "FARM_KEY_ID": "farm", "FARM_SECRET": "secret12", "MINIO_ROOT_USER": "admin",
                              "MINIO_ROOT_PASSWORD": "admin123"})
    assert run.returncode == 0, run.stderr
    bucket = _default(env["FARM_ARTIFACTS"]).removeprefix("s3://").split("/")[0]
    assert f"mc mb --ignore-existing farm/{bucket}" in run.stdout.splitlines()
    policy = json.loads((tmp_path / "policy.json").read_text())
    granted = {action for statement in policy["Statement"] for action in statement["Action"]}
    resources = {resource for statement in policy["Statement"] for resource in statement["Resource"]}
    assert resources == {f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"}
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("## The artifact store in a bucket"):]
    needed = set(re.findall(r"`(s3:\w+)`", section[:section.index("\n2. ")]))
    assert len(needed) >= 6 and needed <= granted, f"the farm's user lacks {sorted(needed - granted)}"


def _compose_command() -> list[str] | None:
    """Compose v2: the docker CLI's plugin, a `docker-compose` v2 on PATH, or the plugin binary alone."""
    candidates = [["docker", "compose"], ["docker-compose"]]
    candidates += [[str(p)] for p in (Path("/usr/local/lib/docker/cli-plugins/docker-compose"),
                                      Path.home() / ".docker/cli-plugins/docker-compose") if p.is_file()]
    for command in candidates:
        try:
            version = subprocess.run([*command, "version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if version.returncode == 0 and re.search(r"version v?2\.", version.stdout):
            return command
    return None


def _config(compose: list[str], env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    profiles = [arg for profile in sorted({p for s in _services().values() for p in s.get("profiles", [])})
                for arg in ("--profile", profile)]
    return subprocess.run([*compose, "-f", str(COMPOSE), *profiles, "config", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=REPO)


def test_docker_compose_config_accepts_the_file() -> None:
    compose = _compose_command()
    if compose is None and os.environ.get("CI"):  # .ci/run installs it: missing there is a broken CI, not a skip
        pytest.fail("Docker Compose v2 is not installed in CI: .ci/run's `bash scripts/install-compose.sh` failed")
    if compose is None:
        pytest.skip("Docker Compose v2 is not installed (no `docker compose`, `docker-compose` v2 or CLI plugin): "
                    "`bash scripts/install-compose.sh` installs it; the structural tests above still ran")
    required = _required_variables()
    base = {k: v for k, v in os.environ.items() if k not in required and not k.startswith(("COMPOSE_", "AWS_"))}
    dummies = {name: f"dummy-{name.lower()}" for name in required}
    result = _config(compose, {**base, **dummies}, "--format", "json")
    assert result.returncode == 0, result.stderr
    normalized = json.loads(result.stdout)
    assert set(normalized["services"]) == set(_services()), sorted(normalized["services"])
    for name, pool in _workers().items():
        env = normalized["services"][name]["environment"]
        assert env["EDGEFARM_ARTIFACTS"].startswith("s3://") and env["AWS_ENDPOINT_URL"] == "http://minio:9000"
        assert env["AWS_SECRET_ACCESS_KEY"] == dummies["AWS_SECRET_ACCESS_KEY"], name
        command = normalized["services"][name]["command"]
        assert command[command.index("--pool") + 1] == pool, (name, command)
    for service in normalized["services"].values():
        for port in service.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", port
    # without any one secret, compose refuses, naming it
    for name in sorted(required):
        refused = _config(compose, {**base, **{k: v for k, v in dummies.items() if k != name}}, "--quiet")
        assert refused.returncode != 0 and name in refused.stderr, (name, refused.stderr)


def _compose_commands(markdown: str) -> list[list[str]]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("docker compose "):
                commands.append(shlex.split(line)[2:])
    return commands


# compose options and subcommand options that take a value (the next word is not a service)
_VALUED = {"-f", "--file", "-p", "--project-name", "--profile", "--env-file", "--project-directory", "-e", "--env",
           "-u", "--user", "-w", "--workdir", "--index", "--scale", "-t", "--timeout", "--wait-timeout", "--pull",
           "--name", "--entrypoint", "-l", "--label"}
_NO_SERVICE_AFTER = {"exec", "run"}  # the first word is the service, the rest its command


def _services_named(args: list[str]) -> tuple[list[str], list[str], list[str], str]:
    """(files, profiles, services, subcommand) of `docker compose ARGS`."""
    files, profiles, services, subcommand, i = [], [], [], "", 0
    while i < len(args):
        arg = args[i]
        if arg in _VALUED:
            (files if arg in ("-f", "--file") else profiles if arg == "--profile" else []).append(args[i + 1])
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        if not subcommand:
            subcommand = arg
        else:
            services.append(arg)
            if subcommand in _NO_SERVICE_AFTER:
                break
        i += 1
    return files, profiles, services, subcommand


def test_readme_compose_commands_name_only_what_the_file_has() -> None:
    text = README.read_text(encoding="utf-8")
    commands = _compose_commands(text)
    services = _services()
    known_profiles = {p for s in services.values() for p in s.get("profiles", [])}
    assert len(commands) >= 3, commands
    seen = set()
    for args in commands:
        files, profiles, named, subcommand = _services_named(args)
        command = f"`docker compose {shlex.join(args)}`"
        assert files == ["infra/docker-compose.yml"], f"{command}: name the file, -f infra/docker-compose.yml"
        assert set(profiles) <= known_profiles, \
            f"{command}: unknown profile {sorted(set(profiles) - known_profiles)} (has {sorted(known_profiles)})"
        unknown = [name for name in named if name not in services]
        assert not unknown, f"{command} names {unknown}, not services of " \
                            f"infra/docker-compose.yml ({sorted(services)})"
        seen.add(subcommand)
    assert {"up", "exec"} <= seen, seen  # the README starts the farm and reaches into a worker


def test_the_readme_parser_reads_services_and_profiles() -> None:
    md = "```bash\ndocker compose -f infra/docker-compose.yml --profile orin up -d worker-orin  # note\n" \
         "docker compose -f infra/docker-compose.yml exec -u root worker-x86-cpu \\\n    prefect version\n```\n"
    assert [_services_named(args) for args in _compose_commands(md)] == [
        (["infra/docker-compose.yml"], ["orin"], ["worker-orin"], "up"),
        (["infra/docker-compose.yml"], [], ["worker-x86-cpu"], "exec")]
