"""Every server role of the product is deployed (deploy/): ``processor run``, ``api``,
``console`` and the ``migrate`` Job, from the one image, in Kubernetes and in Compose,
with probes that reach what each serves without a token; and the image has every
extra a documented set-up needs."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml

from tests.acceptance.test_deploy import (
    KUBERNETES,
    PROCESSOR_DOCKERFILE,
    PROCESSOR_IMAGE,
    ROLES,
    compose,
    container,
    env_of,
    image_name,
    kubernetes_documents,
    the,
    verb_of,
)
from watcher.store.db.migrate import upgrade
from watcher.store.db.urls import parse_database_url


def test_every_server_role_is_deployed_with_health_checks() -> None:
    """``processor run``, ``api``, ``console`` and the ``migrate`` Job, each from the one
    image, in Kubernetes and in Compose; every server with probes that reach a path it
    answers without a token, on the port it listens on."""
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    in_kustomization = {doc["metadata"]["name"] for doc in kubernetes_documents()
                        if doc["__file__"] in kustomization["resources"]}
    services = compose()["services"]
    for verb, (kind, name, container_name) in ROLES.items():
        workload = the(kind, name)
        assert name in in_kustomization, name
        spec = container(workload, container_name)
        assert image_name(spec["image"]) == PROCESSOR_IMAGE
        assert verb_of(spec.get("args")) == verb
        assert any(verb_of(service.get("command")) == verb
                   and image_name(service.get("image", "")) == PROCESSOR_IMAGE
                   for service in services.values()), f"compose runs no {verb}"
    for verb, port, path in (("api", 8091, "/healthz"), ("console", 8090, "/login")):
        kind, name, container_name = ROLES[verb]
        spec = container(the(kind, name), container_name)
        env = env_of(spec)
        prefix = f"PROCESSOR_{verb.upper()}_"
        assert int(env[prefix + "PORT"]) == port
        assert env[prefix + "HOST"] == "0.0.0.0"
        # Beyond loopback the server refuses to start without its token.
        token = env[prefix + "TOKEN"]["secretKeyRef"]
        secrets = [doc for doc in yaml.safe_load_all(
            (KUBERNETES / "secret.example.yaml").read_text())
            if doc["metadata"]["name"] == token["name"]]
        assert len(secrets) == 1 and len(secrets[0]["stringData"][token["key"]]) >= 16
        ports = {entry["name"]: entry["containerPort"] for entry in spec["ports"]}
        for probe in ("readinessProbe", "livenessProbe"):
            assert spec[probe]["httpGet"] == {"path": path, "port": "http"}, (verb, probe)
        assert ports["http"] == port
        service = the("Service", name)
        assert service["spec"]["ports"][0]["targetPort"] == "http"
        for key, value in service["spec"]["selector"].items():
            assert the(kind, name)["spec"]["template"]["metadata"]["labels"][key] == value
        (composed,) = [one for one in services.values()
                       if verb_of(one.get("command")) == verb]
        assert composed["environment"][prefix + "PORT"] == str(port)
        assert composed["environment"][prefix + "HOST"] == "0.0.0.0"
        assert composed["ports"] == [f"127.0.0.1:{port}:{port}"]
        assert composed["healthcheck"]["test"] == [
            "CMD", "processor", "healthcheck", "--health-port", str(port), "--path", path]
        assert composed["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully")


async def test_the_probed_paths_answer_without_a_token(tmp_path: Path) -> None:
    """The API's /healthz and the console's /login answer 200 to a request without the
    token, bound as the manifests bind them, and the rest needs it."""
    from processor.api.server import ApiOptions, api_running
    from processor.console.server import ConsoleOptions, console_running

    raw = f"sqlite:///{tmp_path / 'probe.db'}"
    await asyncio.to_thread(upgrade, raw, "")
    db = parse_database_url(raw)
    token = "t" * 24
    async with api_running(ApiOptions(db, host="0.0.0.0", port=0, token=token)) as url, \
            httpx.AsyncClient() as http:
        base = url.replace("0.0.0.0", "127.0.0.1")
        assert (await http.get(base + "healthz")).status_code == 200
        assert (await http.get(base + "v1/fleet")).status_code == 401
        # The Compose health check: `processor healthcheck --health-port P --path /healthz`.
        port = str(urlsplit(base).port)
        for path, code in (("/healthz", 0), ("/v1/fleet", 1)):
            done = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "processor.cli", "healthcheck",
                                 "--health-port", port, "--path", path],
                capture_output=True, text=True, timeout=60)
            assert done.returncode == code, (path, done.stdout, done.stderr)
    async with console_running(ConsoleOptions(db_url=db, host="0.0.0.0", port=0,
                                              token=token)) as url, httpx.AsyncClient() as http:
        base = url.replace("0.0.0.0", "127.0.0.1")
        assert (await http.get(base + "login")).status_code == 200
        assert (await http.get(base)).status_code in (302, 303, 401)


def test_the_image_has_every_documented_extra() -> None:
    """The OTEL_* set-up (docs/how-to/trace.md) needs the otel extra in the image, and
    MariaDB/MySQL the mysql one."""
    build = re.sub(r"\\\n", " ", PROCESSOR_DOCKERFILE.read_text())
    (extras,) = re.findall(r"^ARG EXTRAS=(\S+)$", build, re.MULTILINE)
    assert {"otel", "mysql"} <= set(extras.split(","))
