"""The deployment files (deploy/): every manifest parses, and the fields that bind them
together agree: images, ports, probes, environment names, the Secret, the grace period
above the shutdown timeout, and the KEDA backlog query on a real PostgreSQL schema.

The images themselves are built and run in test_container.py.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path
from secrets import token_hex as secrets_token_hex
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
import yaml
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from processor import AsyncClient, NewItem
from processor.cli.common import app
from processor.console.item_page import check_api_url
from processor.health import HealthApp
from processor.http.routes import parse_routes
from processor.observe.logs import LOG_FORMATS
from processor.observe.tracing import exporter_names
from tests.conftest import POSTGRES_URL, require_postgres
from watcher.store.db.migrate import downgrade, upgrade
from watcher.store.db.urls import parse_database_url

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
COMPOSE = DEPLOY / "compose.yaml"
PROCESSOR_DOCKERFILE = ROOT / "Processor.Dockerfile"
HANDLER_DOCKERFILE = ROOT / "handlers" / "examples" / "Dockerfile"
PROCESSOR_IMAGE = "statefeed-processor"
HANDLER_IMAGE = "statefeed-resumes-handler"
DOCKER_STOP_TIMEOUT = 10  # seconds `docker stop` waits before SIGKILL, unless told
# Time a processor needs after its shutdown timeout: write the results, release the
# leases, close the database pool.
RELEASE_MARGIN = 5


# -- reading the files ------------------------------------------------------------------

def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    """The instructions of a Dockerfile's last stage, continuation lines joined."""
    text_ = re.sub(r"\\\n", " ", dockerfile.read_text())
    steps: list[tuple[str, str]] = []
    for line in text_.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        if keyword.upper() == "FROM":
            steps = []
        steps.append((keyword.upper(), rest.strip()))
    return steps


def dockerfile_env(dockerfile: Path) -> dict[str, str]:
    """The ENV values of the last stage."""
    env: dict[str, str] = {}
    for keyword, rest in final_stage(dockerfile):
        if keyword == "ENV":
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                env[name] = value
    return env


def dockerfile_one(dockerfile: Path, keyword: str) -> str:
    """The value of a last-stage instruction that appears once (EXPOSE, USER, ...)."""
    values = [rest for found, rest in final_stage(dockerfile) if found == keyword]
    assert len(values) == 1, f"{dockerfile.name}: {keyword} appears {len(values)} times"
    return values[0]


def kubernetes_documents() -> list[dict[str, Any]]:
    """Every object of every manifest under deploy/kubernetes (kustomization.yaml is
    kubectl's list of them, not an object)."""
    documents = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                document["__file__"] = path.name
                documents.append(document)
    return documents


def the(kind: str, name: str) -> dict[str, Any]:
    """The one Kubernetes object of ``kind`` named ``name``."""
    found = [doc for doc in kubernetes_documents()
             if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} objects named {name}"
    return found[0]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    """A container of a Deployment or a Job by name."""
    containers = workload["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if c["name"] == name]
    assert len(found) == 1, f"{workload['metadata']['name']}: no container {name}"
    return found[0]


def env_of(spec: dict[str, Any]) -> dict[str, Any]:
    """A container's env as name -> value (or valueFrom)."""
    return {entry["name"]: entry.get("value", entry.get("valueFrom"))
            for entry in spec.get("env", [])}


def image_name(reference: str) -> str:
    """``registry/name:tag`` -> ``name``."""
    return reference.rsplit("/", 1)[-1].split(":", 1)[0]


# The server roles: each is a verb of the one image, in Kubernetes and in Compose.
ROLES = {"run": ("Deployment", "statefeed-processor", "processor"),
         "api": ("Deployment", "statefeed-api", "api"),
         "console": ("Deployment", "statefeed-console", "console"),
         "migrate": ("Job", "statefeed-migrate", "migrate")}


def run_options(verb: str = "run") -> dict[str, str]:
    """A verb's environment variables (``processor run``'s by default) -> the option's
    parameter name."""
    command = typer.main.get_command(app).commands[verb]  # type: ignore[attr-defined]
    names = {param.envvar: param.name for param in command.params if param.envvar}
    if verb == "run":
        # Repeatable and read by the command itself, one header per line.
        names["PROCESSOR_HANDLER_HEADER"] = "handler_header"
        # Read from the environment only, never an option (processor/notify/policy.py).
        names["PROCESSOR_NOTIFY_SECRET"] = "notify_secret"
    # Every verb reads the database URL and the logging options.
    names.setdefault("PROCESSOR_DB_URL", "db_url")
    names.setdefault("PROCESSOR_LOG_LEVEL", "log_level")
    return names


def verb_of(args: list[str] | None) -> str:
    """The verb a container or a Compose service runs (the image's default: run)."""
    return args[0] if args else "run"


def seconds(value: str | int) -> float:
    """A Compose duration (``15s``, ``1m30s``) or a number, in seconds."""
    if isinstance(value, int | float):
        return float(value)
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", value):
        total += float(amount) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


def compose() -> dict[str, Any]:
    """The Compose file, anchors and merge keys resolved."""
    return yaml.safe_load(COMPOSE.read_text())


def processor_services() -> dict[str, dict[str, Any]]:
    """The Compose services that run `processor run`."""
    return {name: service for name, service in compose()["services"].items()
            if service.get("command") == ["run"]}


# -- the files parse and name real things -----------------------------------------------

def test_every_manifest_parses_and_names_its_kind() -> None:
    documents = kubernetes_documents()
    kinds = {(doc.get("kind"), doc.get("metadata", {}).get("name")) for doc in documents}
    assert {("Deployment", "statefeed-processor"), ("PodDisruptionBudget", "statefeed-processor"),
            ("ScaledObject", "statefeed-processor"), ("Secret", "statefeed-database"),
            ("Job", "statefeed-migrate"), ("Deployment", "statefeed-resumes-handler"),
            ("Service", "statefeed-resumes-handler")} <= kinds
    for doc in documents:
        assert doc.get("apiVersion") and doc["metadata"].get("labels"), doc["__file__"]
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (KUBERNETES / resource).is_file(), f"kustomization names missing {resource}"
    # The Secret is an example to replace, not something `apply -k` should overwrite.
    assert "secret.example.yaml" not in kustomization["resources"]


def test_environment_names_are_options_of_the_verb_they_run() -> None:
    used: dict[tuple[str, str], set[str]] = {}
    for doc in kubernetes_documents():
        if doc["kind"] in ("Deployment", "Job"):
            for spec in doc["spec"]["template"]["spec"]["containers"]:
                if image_name(spec["image"]) != PROCESSOR_IMAGE:
                    continue
                for name in env_of(spec):
                    used.setdefault((verb_of(spec.get("args")), name), set()).add(
                        doc["__file__"])
    for name, service in compose()["services"].items():
        if image_name(service.get("image", "")) != PROCESSOR_IMAGE:
            continue
        for variable in service.get("environment", {}):
            used.setdefault((verb_of(service.get("command")), variable), set()).add(
                f"compose.yaml:{name}")
    for variable in dockerfile_env(PROCESSOR_DOCKERFILE):
        used.setdefault(("run", variable), set()).add(PROCESSOR_DOCKERFILE.name)
    processor_names = {pair for pair in used if pair[1].startswith("PROCESSOR_")}
    assert processor_names, "the manifests set no PROCESSOR_ variable"
    unknown = {f"{verb}: {name}": sorted(used[verb, name]) for verb, name in processor_names
               if name not in run_options(verb)}
    assert not unknown, f"not options of the verb they are given to: {unknown}"


def test_images_match_their_dockerfiles() -> None:
    processor = the("Deployment", "statefeed-processor")
    migrate = the("Job", "statefeed-migrate")
    handler = the("Deployment", "statefeed-resumes-handler")
    assert image_name(container(processor, "processor")["image"]) == PROCESSOR_IMAGE
    assert image_name(container(migrate, "migrate")["image"]) == PROCESSOR_IMAGE
    assert container(processor, "processor")["image"] == container(migrate, "migrate")["image"]
    assert image_name(container(handler, "handler")["image"]) == HANDLER_IMAGE
    assert container(processor, "processor")["args"] == ["run"]
    assert container(migrate, "migrate")["args"] == ["migrate"]
    services = compose()["services"]
    for name, service in services.items():
        if "build" not in service:
            continue
        dockerfile = (COMPOSE.parent / service["build"]["context"]
                      / service["build"]["dockerfile"]).resolve()
        expected = {PROCESSOR_DOCKERFILE: PROCESSOR_IMAGE, HANDLER_DOCKERFILE: HANDLER_IMAGE}
        assert dockerfile in expected, f"compose {name} builds {dockerfile}"
        assert image_name(service["image"]) == expected[dockerfile], name
    # The images' own names, in their OCI labels.
    for dockerfile, name in ((PROCESSOR_DOCKERFILE, PROCESSOR_IMAGE),
                             (HANDLER_DOCKERFILE, HANDLER_IMAGE)):
        labels = dockerfile_one(dockerfile, "LABEL")
        assert f'org.opencontainers.image.title="{name}"' in labels


def test_ports_and_probes_reach_the_health_endpoints() -> None:
    deployment = the("Deployment", "statefeed-processor")
    spec = container(deployment, "processor")
    env = env_of(spec)
    ports = {port["name"]: port["containerPort"] for port in spec["ports"]}
    health_port = int(env["PROCESSOR_HEALTH_PORT"])
    assert ports["health"] == health_port
    assert dockerfile_one(PROCESSOR_DOCKERFILE, "EXPOSE") == str(health_port)
    assert dockerfile_env(PROCESSOR_DOCKERFILE)["PROCESSOR_HEALTH_PORT"] == str(health_port)
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == health_port
    readiness, liveness = spec["readinessProbe"]["httpGet"], spec["livenessProbe"]["httpGet"]
    assert (readiness["path"], liveness["path"]) == ("/readyz", "/healthz")
    assert readiness["port"] == liveness["port"] == "health"
    assert annotations["prometheus.io/path"] == "/metrics"
    # The processor's health app serves those paths (a 404 would fail every probe).
    statuses = asyncio.run(_health_statuses(["/readyz", "/healthz", "/metrics"]))
    assert statuses == {"/readyz": 200, "/healthz": 200, "/metrics": 200}
    # /readyz waits for its checks: the probe must wait longer than they may take.
    assert spec["readinessProbe"]["timeoutSeconds"] > 5


async def _health_statuses(paths: list[str]) -> dict[str, int]:
    async def ok() -> tuple[bool, str]:
        return True, "ok"
    health = HealthApp(checks={"database": ok}, metrics=lambda: b"")
    statuses: dict[str, int] = {}
    for path in paths:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        await health({"type": "http", "method": "GET", "path": path}, receive, send)
        statuses[path] = sent[0]["status"]
    return statuses


def test_the_handler_url_names_the_handler_service() -> None:
    service = the("Service", "statefeed-resumes-handler")
    handler = the("Deployment", "statefeed-resumes-handler")
    spec = container(handler, "handler")
    ports = {port["name"]: port["containerPort"] for port in spec["ports"]}
    service_port = service["spec"]["ports"][0]
    assert ports[service_port["targetPort"]] == int(env_of(spec)["UVICORN_PORT"])
    assert dockerfile_one(HANDLER_DOCKERFILE, "EXPOSE") == str(ports["http"])
    for key, value in service["spec"]["selector"].items():
        assert handler["spec"]["template"]["metadata"]["labels"][key] == value
    env = env_of(container(the("Deployment", "statefeed-processor"), "processor"))
    for variable in ("PROCESSOR_HANDLER_URL", "PROCESSOR_HANDLER_HEALTH_URL"):
        url = urlsplit(env[variable])
        assert (url.hostname, url.port) == (service["metadata"]["name"], service_port["port"])
    assert urlsplit(env["PROCESSOR_HANDLER_HEALTH_URL"]).path == "/healthz"
    # Compose: the processors call the handler service by its name and the image's port.
    for name, service_ in processor_services().items():
        url = urlsplit(service_["environment"]["PROCESSOR_HANDLER_URL"])
        assert url.hostname in compose()["services"], name
        assert url.port == ports["http"], name


def test_the_database_url_comes_from_the_secret() -> None:
    secret = the("Secret", "statefeed-database")
    for workload, name in ((the("Deployment", "statefeed-processor"), "processor"),
                           (the("Job", "statefeed-migrate"), "migrate")):
        reference = env_of(container(workload, name))["PROCESSOR_DB_URL"]["secretKeyRef"]
        assert reference["name"] == secret["metadata"]["name"]
        assert reference["key"] in secret["stringData"]
    url = secret["stringData"]["url"]
    assert parse_database_url(url).sync_url.get_backend_name() == "postgresql"


def test_grace_periods_exceed_the_shutdown_timeout() -> None:
    deployment = the("Deployment", "statefeed-processor")
    timeout = float(env_of(container(deployment, "processor"))["PROCESSOR_SHUTDOWN_TIMEOUT"])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= timeout + RELEASE_MARGIN, (grace, timeout)
    image_timeout = float(dockerfile_env(PROCESSOR_DOCKERFILE)["PROCESSOR_SHUTDOWN_TIMEOUT"])
    assert image_timeout + 1 < DOCKER_STOP_TIMEOUT, "the image's timeout must fit docker stop"
    assert dockerfile_one(PROCESSOR_DOCKERFILE, "STOPSIGNAL") == "SIGTERM"
    for name, service in processor_services().items():
        compose_timeout = float(service.get("environment", {}).get(
            "PROCESSOR_SHUTDOWN_TIMEOUT", image_timeout))
        assert seconds(service["stop_grace_period"]) >= compose_timeout + RELEASE_MARGIN, name


def test_security_contexts_match_the_image_user() -> None:
    uid = int(dockerfile_one(PROCESSOR_DOCKERFILE, "USER").split(":")[0])
    assert uid != 0
    for kind, name in (*((kind, name) for kind, name, _ in ROLES.values()),
                       ("Deployment", "statefeed-resumes-handler")):
        pod = the(kind, name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == uid
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for spec in pod["containers"]:
            assert spec["securityContext"]["allowPrivilegeEscalation"] is False
            assert spec["securityContext"]["readOnlyRootFilesystem"] is True
            assert spec["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_disruption_budget_and_scaler_target_the_processors() -> None:
    deployment = the("Deployment", "statefeed-processor")
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    budget = the("PodDisruptionBudget", "statefeed-processor")
    assert budget["spec"]["selector"]["matchLabels"] == selector
    assert budget["spec"]["maxUnavailable"] == 1
    scaled = the("ScaledObject", "statefeed-processor")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    # KEDA reads the connection string from the target container's own variable.
    assert trigger["metadata"]["connectionFromEnv"] in env_of(container(deployment, "processor"))
    assert 1 <= scaled["spec"]["minReplicaCount"] < scaled["spec"]["maxReplicaCount"]


def test_compose_runs_migrate_then_three_processors() -> None:
    services = compose()["services"]
    assert sorted(processor_services()) == ["processor-1", "processor-2", "processor-3"]
    assert services["migrate"]["command"] == ["migrate"]
    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    database = services["db"]["environment"]
    for name, service in processor_services().items():
        assert service["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        url = parse_database_url(service["environment"]["PROCESSOR_DB_URL"]).sync_url
        assert (url.host, url.username, url.password, url.database) == (
            "db", database["POSTGRES_USER"], database["POSTGRES_PASSWORD"],
            database["POSTGRES_DB"]), name


def test_a_compose_implementation_accepts_the_file() -> None:
    """Where a Compose implementation is installed (Debian's docker-compose, or the
    `docker compose` plugin), it validates the file: schema, merge keys, build paths."""
    candidates = []
    if shutil.which("docker-compose"):
        candidates.append(["docker-compose"])
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0:
        candidates.append(["docker", "compose"])
    if not candidates:
        pytest.skip("no Compose implementation is installed (docker-compose or the docker "
                    "compose plugin)")
    # The file refuses to start without real secrets: give it some, as deploy/.env would.
    secrets = {name: secrets_token_hex(16) for name in (
        "PROCESSOR_API_TOKEN", "PROCESSOR_CONSOLE_TOKEN", "PROCESSOR_NOTIFY_SECRET")}
    for command in candidates:
        done = subprocess.run([*command, "-f", str(COMPOSE), "config", "-q"],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, **secrets})
        assert done.returncode == 0, f"{' '.join(command)} config: {done.stderr}"
        unset = {key: value for key, value in os.environ.items() if key not in secrets}
        refused = subprocess.run([*command, "-f", str(COMPOSE), "config", "-q"],
                                 capture_output=True, text=True, timeout=60, env=unset)
        assert refused.returncode != 0 and "PROCESSOR_" in refused.stderr, (
            "Compose must refuse to start without real secrets")


# -- the KEDA query on a real schema ----------------------------------------------------

def keda_query(prefix: str) -> str:
    """The ScaledObject's query, with ``prefix`` before the table names."""
    (trigger,) = the("ScaledObject", "statefeed-processor")["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    return re.sub(r"\b(items|partitions)\b", lambda m: prefix + m.group(1), query)


@pytest.mark.postgres
async def test_the_keda_query_counts_processors_worth_running() -> None:
    """One processor per 200 waiting items, never more than the partitions that have
    waiting items; cancelled partitions, finished items and items waiting for a later
    gate are not backlog."""
    require_postgres()
    prefix = f"k{uuid.uuid4().hex[:10]}_"
    await asyncio.to_thread(upgrade, POSTGRES_URL, prefix)
    engine = create_async_engine(parse_database_url(POSTGRES_URL).async_url)
    try:
        async with AsyncClient(POSTGRES_URL, prefix) as client:
            async def processors_wanted() -> int:
                async with engine.connect() as conn:
                    return int((await conn.execute(text(keda_query(prefix)))).scalar_one())

            assert await processors_wanted() == 0
            # One big partition: 450 items, but one processor works it.
            await client.create_partition("big", [NewItem(f"i{n}", b"{}") for n in range(450)])
            assert await processors_wanted() == 1
            # Five small ones besides: 700 items -> 4 processors, 6 partitions.
            for number in range(5):
                await client.create_partition(
                    f"small{number}", [NewItem(f"i{n}", b"{}") for n in range(50)])
            assert await processors_wanted() == 4
            # A cancelled partition is not backlog.
            await client.cancel("big")
            assert await processors_wanted() == 2  # 250 items -> 2, in 5 partitions
            # Nor are finished items, nor items already waiting for the next gate.
            async with engine.begin() as conn:
                await conn.execute(text(
                    f"UPDATE {prefix}items SET status = 'complete' "
                    "WHERE partition_id IN ('small0', 'small1')"))
                await conn.execute(text(
                    f"UPDATE {prefix}items SET gate = 1 WHERE partition_id = 'small2'"))
            assert await processors_wanted() == 1  # 100 items in 2 partitions
    finally:
        await engine.dispose()
        await asyncio.to_thread(downgrade, POSTGRES_URL, prefix)


def test_the_pipelines_deployment_serves_two_pipelines_from_its_routes() -> None:
    """The optional pipelines manifest: its routes file parses, names two pipelines (one
    of them with a service per gate and two versions), routes ``resumes`` to the example
    handler's Service, and is mounted where ``PROCESSOR_ROUTES`` says."""
    routes_map = the("ConfigMap", "statefeed-routes")
    routes = parse_routes(routes_map["data"]["routes.toml"], source="routes.toml")
    assert sorted(routes.pipelines) == ["invoices", "resumes"]
    handler = the("Service", "statefeed-resumes-handler")
    resumes = urlsplit(routes.resolve("resumes", None, 3).url)  # type: ignore[union-attr]
    assert (resumes.hostname, resumes.port) == (handler["metadata"]["name"],
                                                handler["spec"]["ports"][0]["port"])
    ocr, v1, v2 = (routes.resolve("invoices", version, gate)
                   for version, gate in ((None, 0), ("v1", 1), ("v2", 1)))
    assert ocr is not None and v1 is not None and v2 is not None
    assert len({ocr.url, v1.url, v2.url}) == 3
    workload = the("Deployment", "statefeed-processor-pipelines")
    spec = container(workload, "processor")
    env = env_of(spec)
    assert "PROCESSOR_HANDLER_URL" not in env
    mounts = {mount["name"]: mount["mountPath"] for mount in spec["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in workload["spec"]["template"]["spec"]["volumes"]}
    assert str(Path(env["PROCESSOR_ROUTES"]).parent) == mounts["routes"]
    assert volumes["routes"]["configMap"]["name"] == routes_map["metadata"]["name"]
    assert Path(env["PROCESSOR_ROUTES"]).name in routes_map["data"]


# -- secrets, notifications, the console's API URL, logs and traces ----------------------

# Environment variables that carry a credential: never a literal in a manifest.
SECRET_BEARING = re.compile(r"TOKEN|SECRET|PASSWORD|_DB_URL$")
# Compose's "required" interpolation: `${NAME:?message}` refuses to start without NAME.
COMPOSE_REQUIRED = re.compile(r"^\$\{(?P<name>[A-Z0-9_]+):\?[^}]+\}$")


def processor_workloads() -> list[tuple[str, dict[str, Any]]]:
    """Every Kubernetes container of the processor image, as (verb, container)."""
    found = []
    for doc in kubernetes_documents():
        if doc["kind"] in ("Deployment", "Job"):
            for spec in doc["spec"]["template"]["spec"]["containers"]:
                if image_name(spec["image"]) == PROCESSOR_IMAGE:
                    found.append((verb_of(spec.get("args")), spec))
    return found


def compose_processor_services() -> dict[str, dict[str, Any]]:
    """The Compose services of the processor image (every role)."""
    return {name: service for name, service in compose()["services"].items()
            if image_name(service.get("image", "")) == PROCESSOR_IMAGE}


def test_every_secret_bearing_variable_comes_from_a_secret() -> None:
    """In Kubernetes a token, secret or database URL is a secretKeyRef to a Secret that
    secret.example.yaml shows; in Compose the tokens and the signing secret have no
    fallback (``${NAME:?...}``), and no example value is left anywhere."""
    examples = {doc["metadata"]["name"]: doc for doc in kubernetes_documents()
                if doc["kind"] == "Secret"}
    for verb, spec in processor_workloads():
        for entry in spec.get("env", []):
            if not SECRET_BEARING.search(entry["name"]):
                continue
            assert "value" not in entry, (verb, entry["name"], "a literal")
            reference = entry["valueFrom"]["secretKeyRef"]
            assert reference["key"] in examples[reference["name"]]["stringData"], (verb, entry)
    text_ = COMPOSE.read_text()
    assert "change-me" not in text_, "Compose must not fall back to a known token"
    for name, service in compose_processor_services().items():
        for variable, value in service.get("environment", {}).items():
            if SECRET_BEARING.search(variable) and variable != "PROCESSOR_DB_URL":
                required = COMPOSE_REQUIRED.match(str(value))
                assert required and required["name"] == variable, (name, variable, value)


def test_every_processor_signs_its_notifications() -> None:
    """``processor run`` (each Deployment, each Compose processor) gets
    PROCESSOR_NOTIFY_SECRET: without it a processor delivers no notification."""
    runs = [spec for verb, spec in processor_workloads() if verb == "run"]
    assert len(runs) >= 2  # the processors and the pipelines Deployment
    for spec in runs:
        reference = env_of(spec)["PROCESSOR_NOTIFY_SECRET"]["secretKeyRef"]
        assert reference == {"name": "statefeed-notify", "key": "secret"}
    for name, service in processor_services().items():
        assert "PROCESSOR_NOTIFY_SECRET" in service["environment"], name
    documented = (ROOT / "docs" / "how-to" / "deploy.md").read_text()
    assert "PROCESSOR_NOTIFY_SECRET" in documented and "statefeed-notify" in documented


def test_the_console_knows_the_apis_address() -> None:
    """The console's completion URLs start with the API's address: in Kubernetes its
    Service (name and port), in Compose the port published on the host."""
    env = env_of(container(the("Deployment", "statefeed-console"), "console"))
    url = urlsplit(check_api_url(env["PROCESSOR_CONSOLE_API_URL"]) or "")
    service = the("Service", "statefeed-api")
    assert (url.hostname, url.port) == (service["metadata"]["name"],
                                        service["spec"]["ports"][0]["port"])
    services = compose()["services"]
    composed = check_api_url(services["console"]["environment"]["PROCESSOR_CONSOLE_API_URL"])
    (published,) = services["api"]["ports"]
    host, port, _ = published.rsplit(":", 2)
    assert composed == f"http://{host}:{port}"


def test_logs_are_json_and_traces_can_be_exported() -> None:
    """Every server role logs JSON lines (``migrate``, a one-shot, has no log options);
    the roles that trace (run and api) carry the OTEL_* exporter settings, with values
    the service accepts."""
    assert "json" in LOG_FORMATS
    roles: list[tuple[str, str, dict[str, Any]]] = [
        (verb, spec["name"], env_of(spec)) for verb, spec in processor_workloads()]
    roles += [(verb_of(service.get("command")), name, service.get("environment", {}))
              for name, service in compose_processor_services().items()]
    assert {verb for verb, _, _ in roles} == {"run", "api", "console", "migrate"}
    for verb, name, env in roles:
        if verb == "migrate":
            continue
        assert env.get("PROCESSOR_LOG_FORMAT") == "json", (verb, name)
        if verb in ("run", "api"):
            for variable in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                             "OTEL_SERVICE_NAME"):
                assert variable in env, (verb, name, variable)
            exporter = re.sub(r"^\$\{[A-Z_]+:-(.*)\}$", r"\1", env["OTEL_TRACES_EXPORTER"])
            assert exporter_names({"OTEL_TRACES_EXPORTER": exporter}) in ([], [
                "otlp_proto_http"]), (name, exporter)


def test_keda_is_a_stated_prerequisite_with_an_alternative() -> None:
    """The ScaledObject needs KEDA: its manifest, the kustomization and the deploy page
    say so, and a CPU HorizontalPodAutoscaler of the same Deployment (not applied by
    default) is the alternative."""
    for path in (KUBERNETES / "keda-scaledobject.yaml", KUBERNETES / "kustomization.yaml",
                 KUBERNETES / "processor.yaml"):
        assert re.search(r"KEDA", path.read_text()) and "processor-hpa.yaml" in \
            path.read_text(), path.name
    documented = (ROOT / "docs" / "how-to" / "deploy.md").read_text()
    assert "prerequisite" in documented.lower() and "processor-hpa.yaml" in documented
    hpa = the("HorizontalPodAutoscaler", "statefeed-processor")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "statefeed-processor"
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    assert "processor-hpa.yaml" not in kustomization["resources"], "one autoscaler, not two"
