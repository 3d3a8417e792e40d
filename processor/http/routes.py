"""The routes file: which handler service each pipeline's gates go to. Pure: no I/O but
the caller's text, and every error a line of its own naming the line it is on.

A routes file is TOML (docs/reference/routes.md is its reference)::

    [[pipeline]]
    name = "invoices"
    current = "v2"             # the version a partition that names none keeps

    [[pipeline.route]]         # no version: every version of the pipeline
    gate = 0                   # or "*": every gate without a route of its own
    url = "http://ocr:8000/process"

    [[pipeline.route]]
    version = "v2"             # this version only; before the routes without one
    gate = 1
    url = "http://classifier-v2:8000/process"
    reduce_url = "http://rank:8000/reduce"
    timeout = 60               # request timeout, seconds
    batch_size = 16            # items per request, to batch_url (<url>/batch)
    headers = { Authorization = "Bearer ..." }

A place (pipeline, version, gate) goes to the first of: the version's route for the
gate, the version's ``*`` route, the pipeline's route for the gate, its ``*`` route.
A partition with no version takes the pipeline's ``current`` one.
:meth:`Routes.resolve` finds it; :meth:`Routes.served` is what the processor serves.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, overload

from processor.http.config import check_header, check_url
from processor.observe.redact import redact_url
from watcher.errors import ConfigError
from watcher.models import MAX_GATE
from watcher.pipelines import ServedPipelines, ServedRoute
from watcher.records import DEFAULT_PIPELINE
from watcher.rules.checks import check_seconds, check_whole_number
from watcher.rules.ids import pipeline_name_problem

EVERY_GATE = "*"
PIPELINE_KEYS = frozenset({"name", "current", "route"})
ROUTE_KEYS = frozenset({"version", "gate", "url", "batch_url", "reduce_url", "health_url",
                        "timeout", "headers", "batch_size"})
_PIPELINE_HEADER = re.compile(r"^\s*\[\[\s*pipeline\s*\]\]")
_ROUTE_HEADER = re.compile(r"^\s*\[\[\s*pipeline\s*\.\s*route\s*\]\]")


class RoutesError(ConfigError):
    """A routes file that cannot be used: :attr:`errors` holds one line per error, each
    naming the file and the line where it can."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = tuple(errors)
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True)
class Service:
    """One handler service, as a route names it: where and how to call it. Routes that
    name the same settings share one service (one connection pool, one outage hold)."""

    url: str
    batch_url: str | None = None
    reduce_url: str | None = None
    health_url: str | None = None
    timeout: float | None = None  # None: the processor's --request-timeout
    headers: tuple[tuple[str, str], ...] = ()
    batch_size: int = 0  # 0: one item per request

    def __repr__(self) -> str:  # never a header value, a password or a query value
        return (f"Service(url={redact_url(self.url)!r}, "
                f"headers={[name for name, _ in self.headers]!r})")


@dataclass(frozen=True)
class GateRoutes:
    """The routes of one pipeline (or one of its versions): per gate, and for every gate."""

    gates: Mapping[int, Service] = field(default_factory=dict)
    every: Service | None = None

    def at(self, gate: int) -> Service | None:
        return self.gates.get(gate, self.every)

    def served(self, pipeline: str, version: str | None, null_version: bool) -> ServedRoute:
        return ServedRoute(pipeline, version, null_version,
                           None if self.every is not None else frozenset(self.gates))


@dataclass(frozen=True)
class PipelineRoutes:
    """One pipeline's routes: those for every version, and those of each version."""

    name: str
    current: str | None = None
    unversioned: GateRoutes | None = None
    versions: Mapping[str, GateRoutes] = field(default_factory=dict)


@dataclass(frozen=True)
class Routes:
    """Every pipeline a processor serves (validated: :func:`parse_routes`)."""

    pipelines: Mapping[str, PipelineRoutes]

    def __post_init__(self) -> None:
        object.__setattr__(self, "pipelines", MappingProxyType(dict(self.pipelines)))

    def resolve(self, pipeline: str, version: str | None, gate: int) -> Service | None:
        """The service a place's calls go to (see the module's docstring); ``None``
        when this processor has no route there."""
        routes = self.pipelines.get(pipeline)
        if routes is None:
            return None
        version = routes.current if version is None else version
        versioned = None if version is None else routes.versions.get(version)
        found = None if versioned is None else versioned.at(gate)
        if found is None and routes.unversioned is not None:
            found = routes.unversioned.at(gate)
        return found

    def services(self) -> list[Service]:
        """Every service some route names, once each, in the file's order."""
        found: dict[Service, None] = {}
        for routes in self.pipelines.values():
            for table in (routes.unversioned, *routes.versions.values()):
                if table is not None:
                    found.update(dict.fromkeys(table.gates.values()))
                    if table.every is not None:
                        found[table.every] = None
        return list(found)

    def served(self) -> ServedPipelines:
        """The places these routes serve, for the lease reads (:mod:`watcher.pipelines`)."""
        tables: list[ServedRoute] = []
        current: dict[str, str] = {}
        for name, routes in self.pipelines.items():
            if routes.current is not None:
                current[name] = routes.current
            if routes.unversioned is not None:
                tables.append(routes.unversioned.served(name, None, True))
            for version, table in routes.versions.items():
                tables.append(table.served(name, version, version == routes.current))
        return ServedPipelines(tuple(tables), current)


def single_route(url: str) -> Routes:
    """``--handler-url`` as routes: the ``default`` pipeline, every gate to ``url``."""
    return Routes({DEFAULT_PIPELINE: PipelineRoutes(
        DEFAULT_PIPELINE, unversioned=GateRoutes(every=Service(url)))})


def parse_routes(text: str, source: str = "routes file") -> Routes:
    """The routes of a TOML routes file's ``text`` (``source`` names it in errors).

    Raises:
        RoutesError: the text is not TOML, or names an unknown key, a pipeline twice, a
            route without a URL, a URL that is not http(s), a bad name, gate, timeout,
            header or batch size, or a current version with no route. Every error found
            is a line of its own, with the line number where it can be told.
    """
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise RoutesError([f"{source}: not valid TOML: {error}"]) from None
    lines = _Lines(text, source)
    errors: list[str] = []
    for key in sorted(set(document) - {"pipeline"}):
        errors.append(f"{lines.key(key)}: unknown key {key!r}; a routes file holds "
                      "[[pipeline]] tables")
    entries = document.get("pipeline", [])
    if not isinstance(entries, list) or not entries:
        errors.append(f"{source}: no [[pipeline]] table; name at least one pipeline")
        raise RoutesError(errors)
    pipelines: dict[str, PipelineRoutes] = {}
    named: set[object] = set()
    for index, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name in named:
            errors.append(f"{lines.pipeline(index)}: pipeline {name!r} is given twice; "
                          "give each pipeline one [[pipeline]] table")
            continue
        named.add(name)
        found = _pipeline(entry, index, lines, errors)
        if found is not None:
            pipelines[found.name] = found
    if errors:
        raise RoutesError(errors)
    return Routes(pipelines)


def _pipeline(entry: Any, index: int, lines: _Lines, errors: list[str]) -> PipelineRoutes | None:
    where = lines.pipeline(index)
    if not isinstance(entry, dict):
        errors.append(f"{where}: a pipeline must be a [[pipeline]] table")
        return None
    for key in sorted(set(entry) - PIPELINE_KEYS):
        errors.append(f"{lines.key(key, where)}: unknown key {key!r} in a pipeline; use "
                      f"{', '.join(sorted(PIPELINE_KEYS))}")
    name = entry.get("name")
    problem = pipeline_name_problem("pipeline name", name)
    if problem is not None or not isinstance(name, str):
        errors.append(f"{where}: {problem}")
        return None
    current = entry.get("current")
    if current is not None and (problem := pipeline_name_problem("current", current)):
        errors.append(f"{where}: pipeline {name!r}: {problem}")
        current = None
    tables: dict[str | None, dict[str | int, Service]] = {}
    routes = entry.get("route", [])
    if not isinstance(routes, list) or not routes:
        errors.append(f"{where}: pipeline {name!r} has no [[pipeline.route]]; give each "
                      "gate (or \"*\") a url")
        return None
    for number, route in enumerate(routes):
        _route(route, lines.route(index, number), name, tables, errors, lines)
    if current is not None and current not in tables and None not in tables:
        errors.append(f"{where}: pipeline {name!r}: current version {current!r} has no "
                      "route; add routes with version = " + repr(current))
    return PipelineRoutes(name, current, _gates(tables.get(None)),
                          {version: _gates(table) for version, table in tables.items()
                           if version is not None and table})


def _route(route: Any, where: str, pipeline: str,
           tables: dict[str | None, dict[str | int, Service]], errors: list[str],
           lines: _Lines) -> None:
    if not isinstance(route, dict):
        errors.append(f"{where}: a route must be a [[pipeline.route]] table")
        return
    said = f"{where}: pipeline {pipeline!r}"
    for key in sorted(set(route) - ROUTE_KEYS):
        errors.append(f"{lines.key(key, where)}: pipeline {pipeline!r}: unknown key {key!r} "
                      f"in a route; use "
                      f"{', '.join(sorted(ROUTE_KEYS))}")
    version = route.get("version")
    if version is not None and (problem := pipeline_name_problem("version", version)):
        errors.append(f"{said}: {problem}")
        return
    gate = route.get("gate")
    if gate != EVERY_GATE and (isinstance(gate, bool) or not isinstance(gate, int)
                               or not 0 <= gate <= MAX_GATE):
        errors.append(f"{said}: gate must be a whole number from 0 to {MAX_GATE} or "
                      f"\"{EVERY_GATE}\" (every gate), got {gate!r}")
        return
    said += f" gate {gate}" + ("" if version is None else f" version {version!r}")
    service = _service(route, said, errors)
    if service is None:
        return
    table = tables.setdefault(version, {})
    if gate in table:
        errors.append(f"{said}: a second route for this gate; give each gate one route")
        return
    table[gate] = service


def _service(route: dict[str, Any], said: str, errors: list[str]) -> Service | None:
    if "url" not in route:
        errors.append(f"{said}: the route has no url; give the handler's URL, such as "
                      "url = \"http://ocr:8000/process\"")
        return None
    try:
        urls = {name: None if route.get(name) is None else check_url(name, route[name])
                for name in ("url", "batch_url", "reduce_url", "health_url")}
        timeout = route.get("timeout")
        if timeout is not None:
            timeout = check_seconds("timeout", timeout)
        batch_size = check_whole_number("batch_size", route.get("batch_size", 0), minimum=0)
        headers = route.get("headers", {})
        if not isinstance(headers, dict):
            raise ConfigError("headers must be a table of header name to value")
        for name, value in headers.items():
            check_header(name, value)
    except ConfigError as error:
        errors.append(f"{said}: {error}")
        return None
    assert urls["url"] is not None
    return Service(urls["url"], urls["batch_url"], urls["reduce_url"], urls["health_url"],
                   timeout, tuple(sorted(headers.items())), batch_size)


@overload
def _gates(table: dict[str | int, Service]) -> GateRoutes: ...
@overload
def _gates(table: None) -> None: ...
def _gates(table: dict[str | int, Service] | None) -> GateRoutes | None:
    if table is None:
        return None
    return GateRoutes({gate: service for gate, service in table.items()
                       if isinstance(gate, int)}, table.get(EVERY_GATE))


class _Lines:
    """Where each table of a routes file starts, for errors: ``file:line``."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self._pipelines: list[int] = []
        self._routes: list[list[int]] = []
        self._text = text.splitlines()
        for number, line in enumerate(self._text, start=1):
            if _PIPELINE_HEADER.match(line):
                self._pipelines.append(number)
                self._routes.append([])
            elif _ROUTE_HEADER.match(line) and self._routes:
                self._routes[-1].append(number)

    def pipeline(self, index: int) -> str:
        found = self._pipelines[index] if index < len(self._pipelines) else None
        return self.source if found is None else f"{self.source}:{found}"

    def route(self, pipeline: int, index: int) -> str:
        routes = self._routes[pipeline] if pipeline < len(self._routes) else []
        return (f"{self.source}:{routes[index]}" if index < len(routes)
                else self.pipeline(pipeline))

    def key(self, key: str, where: str | None = None) -> str:
        """Where ``key`` is set: in the table that starts at ``where`` (``file:line``, up
        to the next table), else anywhere; else ``where`` (or the file)."""
        start = 1
        if where is not None and where.startswith(f"{self.source}:"):
            start = int(where.rpartition(":")[2]) + 1
        pattern = re.compile(rf"^\s*\[*\s*\"?{re.escape(key)}\"?\s*[\].=]")
        for number, line in enumerate(self._text[start - 1:], start=start):
            if where is not None and line.lstrip().startswith("["):
                break
            if pattern.match(line):
                return f"{self.source}:{number}"
        return where or self.source
