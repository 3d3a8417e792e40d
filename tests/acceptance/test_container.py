"""The images, built and run for real: Processor.Dockerfile and the example handler's
handlers/examples/Dockerfile, as they are in the repository, on a Docker engine, against
the test PostgreSQL with the handler on loopback.

Containers use the host's network (`--network host`), so that they reach the test
database and the handlers the test serves on 127.0.0.1. Their FROM image,
debian:bookworm-slim, comes from the engine: where no registry can be reached,
`.ci/container.sh base` makes it from Debian's own packages.

Where no engine answers (DOCKER_HOST, or the default socket) the module skips, saying
how to start one; with CI set it fails instead: `.ci/run` starts one.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets as secrets_module
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from handlers.examples.samples import sample_resumes
from processor import AsyncClient, NewItem
from tests.acceptance.harness.cluster import Cluster
from tests.acceptance.harness.handler import RecordingHandler
from tests.conftest import POSTGRES_URL, require_postgres
from tests.support.engine import wait_until
from tests.support.servers import free_port
from watcher.store.db.migrate import downgrade

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "debian:bookworm-slim"
PROCESSOR_TAG = "statefeed-processor:test"
HANDLER_TAG = "statefeed-resumes-handler:test"
PROCESSOR_UID = 10001
# The processor image measured 213 MB: Debian slim (75-82 MB), Python (40 MB), the
# virtual environment (92 MB). Past this, something grew that should not have.
MAX_PROCESSOR_MB = 250
MAX_HANDLER_MB = 150
LEASE_SECONDS = 30
# `docker stop` (SIGTERM, then the graceful stop) with short in-flight calls ends before
# the image's shutdown timeout (8 s) would: the leases are released at once, not when
# the timeout ran out (a stop past docker's own 10 s would be a SIGKILL, exit 137).
STOP_SECONDS = 8.0
# Another processor takes the released partition over well before the 30 s lease could
# have expired: a third of it leaves a loaded machine its margin.
TAKEOVER_SECONDS = LEASE_SECONDS / 3
# Health checks every second for the test (the image's own interval is 30 s); failures
# in the start period do not count, so a slow start is not "unhealthy".
HEALTH_OPTIONS = ("--health-interval", "1s", "--health-timeout", "20s",
                  "--health-start-period", "60s", "--health-retries", "3")
HEALTHY_TIMEOUT = 90
BUILD_TIMEOUT = 900
REPORT: list[str] = []
BUILD_LOCK = Path(tempfile.gettempdir()) / "statefeed-image-build.lock"

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(900)]


# -- the engine and the images -----------------------------------------------------------

def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the docker client with its output captured; the classic builder, since the
    client may have no buildx plugin.

    Raises:
        subprocess.TimeoutExpired: it ran longer than ``timeout`` seconds.
    """
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "DOCKER_BUILDKIT": "0"}, stdin=subprocess.DEVNULL)


async def adocker(*args: str, timeout: float = 120  # noqa: ASYNC109
                  ) -> subprocess.CompletedProcess[str]:
    """:func:`docker` off the event loop."""
    return await asyncio.to_thread(docker, *args, timeout=timeout)


def _engine_problem() -> str | None:
    """Why the container tests cannot run here, or ``None``."""
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    where = os.environ.get("DOCKER_HOST", "the default socket")
    try:
        version = docker("version", "--format", "{{.Server.Version}}", timeout=20)
    except subprocess.TimeoutExpired:
        return f"the container engine at {where} did not answer within 20 s"
    if version.returncode != 0:
        reason = (version.stderr.strip().splitlines() or ["no answer"])[-1]
        return f"no container engine answers at {where} ({reason})"
    if docker("image", "inspect", BASE_IMAGE, timeout=20).returncode != 0:
        return (f"the base image {BASE_IMAGE} is not in the engine at {where}, and no "
                "registry can be reached to pull it: make it with `.ci/container.sh base`")
    return None


@pytest.fixture(scope="module")
def engine() -> None:
    """Skip (or fail, with CI set) unless an engine answers and has the base image."""
    problem = _engine_problem()
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{problem}; CI must run the container tests (.ci/run starts the engine)",
                    pytrace=False)
    pytest.skip(f"{problem}. To run these tests: .ci/container.sh install; "
                'eval "$(.ci/container.sh start /tmp/statefeed-docker)"; .ci/container.sh base')


@dataclass(frozen=True)
class Image:
    """A built image: its tag, size and how long the build took."""

    tag: str
    size: int
    seconds: float
    build_args: tuple[str, ...] = ()

    @property
    def megabytes(self) -> float:
        """The size in MB (10^6 bytes, as `docker images` shows it)."""
        return self.size / 1e6

    def config(self) -> dict[str, Any]:
        """The image's configuration (user, labels, health check, entry point...)."""
        return json.loads(docker("image", "inspect", self.tag).stdout)[0]["Config"]


def _revision() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def build(dockerfile: str, tag: str, *build_args: str) -> Image:
    """Build ``dockerfile`` (a path from the repository root) as ``tag``, from the
    repository as it is.

    Raises:
        AssertionError: the build failed (with the end of its output).
    """
    arguments = [part for value in build_args for part in ("--build-arg", value)]
    # The test processes (pytest-xdist workers) build one at a time: the first builds,
    # the others then find every step in the engine's cache.
    with BUILD_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        done = docker("build", "--network", "host", "-f", dockerfile, "-t", tag, *arguments,
                      str(ROOT), timeout=BUILD_TIMEOUT)
        seconds = time.monotonic() - started
    assert done.returncode == 0, (f"docker build -f {dockerfile} failed:\n"
                                  f"{(done.stdout + done.stderr)[-4000:]}")
    size = int(docker("image", "inspect", "--format", "{{.Size}}", tag).stdout)
    image = Image(tag, size, seconds, build_args)
    cached = done.stdout.count("Using cache")
    REPORT.append(f"{tag}: {image.megabytes:.0f} MB, built in {seconds:.1f} s "
                  f"({cached} steps from the cache)")
    return image


@pytest.fixture(scope="module")
def processor_image(engine: None) -> Image:
    """Processor.Dockerfile, built."""
    return build("Processor.Dockerfile", PROCESSOR_TAG, f"REVISION={_revision()}")


@pytest.fixture(scope="module")
def handler_image(processor_image: Image) -> Image:
    """handlers/examples/Dockerfile, built after the processor's (it reuses its first
    layers)."""
    return build("handlers/examples/Dockerfile", HANDLER_TAG)


# -- containers ------------------------------------------------------------------------

@dataclass
class Container:
    """A running container, known by name."""

    name: str

    def inspect(self) -> dict[str, Any]:
        """``docker inspect``."""
        return json.loads(docker("inspect", self.name).stdout)[0]

    def logs(self) -> str:
        """Everything the container wrote, stdout then stderr."""
        done = docker("logs", self.name)
        return done.stdout + done.stderr

    def health(self) -> tuple[str, str]:
        """The health status and the last check's output."""
        health = self.inspect()["State"].get("Health") or {}
        log = health.get("Log") or [{}]
        return health.get("Status", "none"), str(log[-1].get("Output", "")).strip()

    async def wait_healthy(self, timeout: float = HEALTHY_TIMEOUT) -> str:  # noqa: ASYNC109
        """Wait until Docker reports the container healthy; return the check's output.

        Raises:
            AssertionError: it was not healthy in time (with its log and the check's).
        """
        async def healthy() -> str | None:
            state = (await asyncio.to_thread(self.inspect))["State"]
            if not state["Running"]:
                raise AssertionError(f"{self.name} exited ({state['ExitCode']}):\n"
                                     f"{self.logs()[-3000:]}")
            status, output = await asyncio.to_thread(self.health)
            return (output or "(the check printed nothing)") if status == "healthy" else None
        try:
            return await wait_until(healthy, timeout=timeout, interval=0.5,
                                    message=f"{self.name} to be healthy")
        except AssertionError as error:
            status, output = self.health()
            raise AssertionError(f"{error}: {status}, last check: {output!r}\n"
                                 f"{self.logs()[-3000:]}") from None


@dataclass
class Containers:
    """Starts containers on the host's network; removes them all at the end."""

    names: list[str] = field(default_factory=list)

    async def run(self, image: Image, *args: str, name: str, env: dict[str, str] | None = None,
                  options: tuple[str, ...] = ()) -> Container:
        """``docker run -d`` ``image`` with ``args``, fast health checks and ``options``.

        Raises:
            AssertionError: docker did not start it.
        """
        full_name = f"sft-{name}-{uuid.uuid4().hex[:6]}"
        environment = [part for key, value in (env or {}).items()
                       for part in ("-e", f"{key}={value}")]
        self.names.append(full_name)
        done = await adocker("run", "-d", "--name", full_name, "--network", "host",
                             *HEALTH_OPTIONS, *environment, *options, image.tag, *args)
        assert done.returncode == 0, f"docker run {image.tag} failed: {done.stderr}"
        return Container(full_name)

    def remove_all(self) -> None:
        """``docker rm -f`` every container started here."""
        if self.names:
            docker("rm", "-f", *self.names, timeout=60)


@pytest.fixture
def containers(engine: None) -> Iterator[Containers]:
    """Containers for one test, removed after it."""
    started = Containers()
    yield started
    started.remove_all()


def processor_args(cluster: Cluster, owner: str, handler_url: str, *extra: str) -> list[str]:
    """``processor run`` arguments for a container on ``cluster``'s tables."""
    return ["run", "--owner-id", owner, "--handler-url", handler_url, "--db-url", POSTGRES_URL,
            "--table-prefix", cluster.prefix, "--poll-interval", "0.1",
            "--lease-duration", str(LEASE_SECONDS), *extra]


# -- the tests -------------------------------------------------------------------------

def test_the_image_is_slim_labelled_and_runs_as_a_user(
        processor_image: Image, handler_image: Image, capsys: pytest.CaptureFixture[str]
        ) -> None:
    config = processor_image.config()
    assert config["User"] == f"{PROCESSOR_UID}:{PROCESSOR_UID}"
    assert config["Entrypoint"] == ["processor"] and config["Cmd"] == ["run"]
    assert config["StopSignal"] == "SIGTERM"
    assert config["Healthcheck"]["Test"] == ["CMD", "processor", "healthcheck"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "statefeed-processor"
    assert f"REVISION={labels['org.opencontainers.image.revision']}" in processor_image.build_args
    assert labels["org.opencontainers.image.version"]
    env = dict(entry.split("=", 1) for entry in config["Env"])
    # docker stop waits 10 s before SIGKILL: the graceful stop fits inside.
    assert float(env["PROCESSOR_SHUTDOWN_TIMEOUT"]) < 10
    probe = ("id -u; for tool in gcc cc c++ make pip pip3 apt-get; do "
             "command -v $tool >/dev/null && echo has-$tool; done; python3 -c "
             "'import sys, psycopg, aiomysql, sqlite3; print(*sys.version_info[:2])'")
    inside = docker("run", "--rm", "--network", "host", "--entrypoint", "sh",
                    processor_image.tag, "-c", probe)
    assert inside.returncode == 0, inside.stderr
    uid, *found, version = inside.stdout.split("\n")[:-1]
    assert int(uid) == PROCESSOR_UID
    # No compiler and no pip in the runtime; apt stays (it is Debian's base image).
    assert found == ["has-apt-get"], found
    assert version == "3 11"
    handler = handler_image.config()
    assert handler["User"] == f"{PROCESSOR_UID}:{PROCESSOR_UID}"
    assert handler["Healthcheck"]["Test"][0] == "CMD"
    with capsys.disabled():
        print("\ncontainer images: " + "; ".join(REPORT))
    assert processor_image.megabytes < MAX_PROCESSOR_MB, REPORT
    assert handler_image.megabytes < MAX_HANDLER_MB, REPORT


async def test_healthy_by_flag_and_by_env_and_docker_stop_hands_over(
        processor_image: Image, containers: Containers, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Processor a (health port and a non-default host by flag, read-only file system)
    works a partition; b (health port by environment) waits. `docker stop a` exits 0 in
    seconds, a releases its lease, and b takes the partition at once and completes it."""
    require_postgres()
    # a's calls are slow, so it is still working the partition when it is stopped.
    handler = RecordingHandler(gates=1, passes=1,
                               delay=lambda call: 0.2 if call.caller == "a" else 0.0)
    async with Cluster(tmp_path, handler, name="ctr") as cluster:
        (partition_id,) = await cluster.create(1, 300)
        port_a, port_b = free_port(), free_port()
        # 127.0.0.2 is loopback but not 127.0.0.1: a check that assumed the default
        # host (as a check of PROCESSOR_HEALTH_PORT alone did) would not find it.
        a = await containers.run(
            processor_image, *processor_args(cluster, "a", f"{cluster.base_url}/p/a",
                                             "--concurrency", "2", "--health-port",
                                             str(port_a), "--health-host", "127.0.0.2"),
            name="a", options=("--read-only",))
        await wait_until(lambda: handler.calls_by("a"), timeout=HEALTHY_TIMEOUT,
                         message="a dispatching")
        b = await containers.run(
            processor_image, *processor_args(cluster, "b", f"{cluster.base_url}/p/b"),
            name="b", env={"PROCESSOR_HEALTH_PORT": str(port_b)})
        checked_a, checked_b = await asyncio.gather(a.wait_healthy(), b.wait_healthy())
        assert checked_a == f"http://127.0.0.2:{port_a}/healthz answered HTTP 200"
        assert checked_b == f"http://127.0.0.1:{port_b}/healthz answered HTTP 200"
        # The check fails where nothing answers, with exit status 1 (2 is Docker's).
        closed = await adocker("exec", a.name, "processor", "healthcheck", "--health-port",
                               str(free_port()))
        assert closed.returncode == 1 and "did not answer" in closed.stderr, closed
        assert await cluster.live_owners() == {"a": [partition_id]}
        done_by_a = len(handler.calls_by("a"))
        assert done_by_a < 300, "a finished before it could be stopped"

        started = time.monotonic()
        stopped = await adocker("stop", a.name, timeout=60)
        stop_seconds = time.monotonic() - started
        assert stopped.returncode == 0, stopped.stderr
        state = (await asyncio.to_thread(a.inspect))["State"]
        log_a = a.logs()
        assert state["ExitCode"] == 0 and not state["OOMKilled"], log_a[-3000:]
        assert "action=leases_released owner=a count=1" in log_a, log_a[-3000:]
        assert "Traceback" not in log_a
        assert stop_seconds < STOP_SECONDS, f"docker stop took {stop_seconds:.1f} s"

        async def taken_over() -> bool:
            info = (await cluster.partitions())[partition_id]
            return info.owner == "b" or info.status == "complete"
        await wait_until(taken_over, timeout=TAKEOVER_SECONDS, interval=0.05,
                         message="b taking the partition over")
        takeover_seconds = time.monotonic() - started
        infos = await cluster.wait_settled([partition_id], timeout=60)
        assert infos[partition_id].status == "complete"
        items = await cluster.items([partition_id])
        assert {item.status for item in items} == {"complete"} and len(items) == 300
        assert handler.calls_by("b"), "b did the rest"
        assert "Traceback" not in b.logs()
    with capsys.disabled():
        print(f"\ndocker stop: {stop_seconds:.1f} s, exit 0; b took over "
              f"{takeover_seconds:.1f} s after the stop began ({done_by_a} of 300 items "
              "done by a)")


@pytest.mark.parametrize(("args", "env", "fragment"), [
    (["run"], {}, "--handler-url is required"),
    (["run"], {"PROCESSOR_HANDLER_URL": "http://127.0.0.1:9/", "PROCESSOR_HEALTH_PORT": "70000",
               "PROCESSOR_DB_URL": "sqlite:////tmp/processor.db"}, "health port"),
    # No database named: refused (run needs its database named), not a SQLite file made
    # inside the container, lost with it.
    (["run", "--migrate"], {"PROCESSOR_HANDLER_URL": "http://127.0.0.1:9/"},
     "--db-url is required"),
    (["run", "--handler-url", "http://127.0.0.1:9/", "--db-url", "nonsense"], {}, "malformed"),
])
def test_configuration_errors_exit_2_with_one_line(
        processor_image: Image, args: list[str], env: dict[str, str], fragment: str) -> None:
    environment = [part for key, value in env.items() for part in ("-e", f"{key}={value}")]
    done = docker("run", "--rm", "--network", "host", *environment, processor_image.tag, *args)
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("processor: error:") and fragment in lines[0], lines


async def test_the_example_handler_image_ranks_resumes(
        processor_image: Image, handler_image: Image, containers: Containers,
        tmp_path: Path) -> None:
    """Both images together: the resume handler container, and a processor container
    that completes an opening through it (gate 0 per resume, gate 1 a reduce)."""
    require_postgres()
    async with Cluster(tmp_path, None, name="crs") as cluster:
        handler_port, health_port = free_port(), free_port()
        handler = await containers.run(
            handler_image, name="handler",
            env={"UVICORN_PORT": str(handler_port), "UVICORN_HOST": "127.0.0.1"},
            options=("--read-only",))
        documents = sample_resumes(12, seed=7, unreadable=1)
        await cluster.client.create_partition(
            "opening", [NewItem(f"resume-{n:02}", document)
                        for n, document in enumerate(documents)],
            reduce_gates=[1], on_item_failure="continue")
        handler_url = f"http://127.0.0.1:{handler_port}"
        ranker = await containers.run(
            processor_image, *processor_args(cluster, "ranker", f"{handler_url}/",
                                             "--handler-health-url", f"{handler_url}/healthz"),
            name="ranker", env={"PROCESSOR_HEALTH_PORT": str(health_port)},
            options=("--read-only",))
        await handler.wait_healthy()
        info = await cluster.client.wait("opening", timeout=90)
        assert info.status == "complete", ranker.logs()[-3000:]
        ranking = info.result_json()
        assert ranking["ranked"] == 11 and ranking["failed_count"] == 1, ranking
        # Ready means the database and the handler answer: the check with --ready says so.
        ready = await adocker("exec", ranker.name, "processor", "healthcheck", "--ready")
        assert ready.returncode == 0, ready
        assert ready.stdout.strip() == f"http://127.0.0.1:{health_port}/readyz answered HTTP 200"
        user = await adocker("exec", handler.name, "id", "-u")
        assert int(user.stdout) == PROCESSOR_UID


def compose_command() -> list[str] | None:
    """The Compose implementation installed: the docker compose plugin, or Debian's
    docker-compose; ``None`` if neither."""
    if docker("compose", "version", timeout=30).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def compose_override(prefix: str, handler_port: int, health_ports: list[int],
                     images: dict[str, str]) -> dict[str, Any]:
    """What deploy/compose.yaml needs changed to run here: the host's network, the test
    database and table prefix instead of the `db` service, the test's images, free
    ports, and health checks every second."""
    database = {"PROCESSOR_DB_URL": POSTGRES_URL, "PROCESSOR_TABLE_PREFIX": prefix}
    handler_url = f"http://127.0.0.1:{handler_port}"
    fast_health = {"interval": "1s", "start_period": "60s", "timeout": "20s"}
    services: dict[str, Any] = {
        "migrate": {"network_mode": "host", "image": images["processor"],
                    "environment": database},
        "handler": {"network_mode": "host", "image": images["handler"],
                    "healthcheck": fast_health,
                    "environment": {"UVICORN_HOST": "127.0.0.1",
                                    "UVICORN_PORT": str(handler_port)}},
    }
    for number, port in enumerate(health_ports, start=1):
        services[f"processor-{number}"] = {
            "network_mode": "host", "image": images["processor"], "healthcheck": fast_health,
            "environment": {**database, "PROCESSOR_HANDLER_URL": f"{handler_url}/",
                            "PROCESSOR_HANDLER_HEALTH_URL": f"{handler_url}/healthz",
                            "PROCESSOR_HEALTH_PORT": str(port),
                            "PROCESSOR_POLL_INTERVAL": "0.1"}}
    return {"services": services}


async def test_the_compose_file_runs_migrate_the_handler_and_three_processors(
        processor_image: Image, handler_image: Image, tmp_path: Path) -> None:
    """deploy/compose.yaml as it is, with an override file for this machine (see
    :func:`compose_override`; its `db` service is not started, as no registry can be
    reached for the PostgreSQL image): migrate runs once, three processors and the
    handler become healthy, the openings complete, and `stop` exits every processor 0."""
    require_postgres()
    command = compose_command()
    if command is None:
        message = "no Compose implementation is installed (the docker compose plugin, or " \
                  "Debian's docker-compose)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run this test (.ci/run installs docker-compose)",
                        pytrace=False)
        pytest.skip(message)
    import yaml  # the test extra's; only this test needs it

    prefix = f"cmp{uuid.uuid4().hex[:8]}_"
    project = f"sft{uuid.uuid4().hex[:8]}"
    override = tmp_path / "compose.override.yaml"
    handler_port = free_port()
    health_ports = [free_port() for _ in range(3)]
    override.write_text(yaml.safe_dump(compose_override(
        prefix, handler_port, health_ports,
        {"processor": processor_image.tag, "handler": handler_image.tag})))
    compose = [*command, "-p", project, "-f", str(ROOT / "deploy" / "compose.yaml"),
               "-f", str(override)]

    # The file has no default for its tokens and signing secret (Compose refuses to
    # start without them): this run's own.
    secrets = {name: secrets_module.token_hex(24) for name in (
        "PROCESSOR_API_TOKEN", "PROCESSOR_CONSOLE_TOKEN", "PROCESSOR_NOTIFY_SECRET")}

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*compose, *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL,
                              env={**os.environ, **secrets, "DOCKER_BUILDKIT": "0"})

    try:
        migrated = await asyncio.to_thread(run, "run", "--rm", "--no-deps", "migrate")
        assert migrated.returncode == 0, migrated.stderr
        assert "statefeed's tables in" in migrated.stdout
        # --no-deps: the services' own order (db, then migrate) is what was just done.
        up = await asyncio.to_thread(run, "up", "-d", "--no-build", "--no-deps", "handler",
                                     "processor-1", "processor-2", "processor-3")
        assert up.returncode == 0, up.stderr
        names = [f"{project}{separator}{service}{separator}1"
                 for service in ("processor-1", "processor-2", "processor-3", "handler")
                 for separator in ("_", "-")]
        running = [name for name in names if docker("inspect", name).returncode == 0]
        assert len(running) == 4, (running, run("ps").stdout)
        outputs = await asyncio.gather(*(Container(name).wait_healthy() for name in running))
        for port in health_ports:
            assert f"http://127.0.0.1:{port}/healthz answered HTTP 200" in outputs
        async with AsyncClient(POSTGRES_URL, prefix) as client:
            openings = [f"opening-{n}" for n in range(6)]
            for number, opening in enumerate(openings):
                await client.create_partition(
                    opening, [NewItem(f"resume-{m:02}", document) for m, document
                              in enumerate(sample_resumes(8, seed=number))],
                    reduce_gates=[1])
            for opening in openings:
                info = await client.wait(opening, timeout=90)
                assert info.status == "complete", info
                assert info.result_json()["ranked"] == 8
        stopped = await asyncio.to_thread(run, "stop")
        assert stopped.returncode == 0, stopped.stderr
        for name in running:
            state = Container(name).inspect()["State"]
            assert not state["Running"] and state["ExitCode"] == 0, (name, state)
    finally:
        await asyncio.to_thread(run, "down", "-v", "--remove-orphans", "--timeout", "5")
        await asyncio.to_thread(downgrade, POSTGRES_URL, prefix)
