"""The processor that routes each call by pipeline: ``processor run --routes FILE``.

:class:`RoutedHttpProcessor` holds one HTTP processor per service the routes name
(:class:`~processor.http.processor.HttpProcessor`, or the batching one for a route with
a ``batch_size``), each with its own session (headers, timeouts) and its own outage
tracking, over one :class:`~processor.http.transports.SharedPool` of connections. Each
item, batch and reduce call goes to the service its partition's pipeline, version and
gate route to (:meth:`~processor.http.routes.Routes.resolve`), looked up once per place
and kept: a call costs one dictionary lookup more than with one handler.

For the engine it names the service of each place (:meth:`service_of`: the URL without
secrets) and probes one service (:meth:`probe_service`), so an outage or a
``Retry-After`` holds only the calls to that service (:mod:`watcher.flow.limits`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from types import TracebackType

from processor.http.batch import BatchingHttpProcessor
from processor.http.config import HttpProcessorConfig, default_health_url, service_name
from processor.http.processor import HttpProcessor
from processor.http.routes import Routes, Service
from processor.http.transports import SharedPool
from processor.observe.tracing import CallSpans, resolve
from watcher.protocol import (
    HandlerUnavailableError,
    ReduceCall,
    ReduceResult,
    Result,
    WorkItem,
)

log = logging.getLogger(__name__)

# The service a place with no route is held under: its calls fail unanswered (and spend
# no attempt) until the lease keeper hands the partition over.
NO_ROUTE = "no-route"

Inner = HttpProcessor | BatchingHttpProcessor
Place = tuple[str, str | None, int]


class RoutedHttpProcessor:
    """Dispatches each call to the service its partition's place routes to.

    ``base`` holds the settings every service shares (connect timeout, pool size,
    response limit, TLS, transport); each service's URL, health, reduce and batch URLs,
    request timeout and headers are its route's (its headers over the base ones).

    Raises:
        ConfigError: (on construction) a service's settings are invalid (the routes
            file was checked already), or a CA bundle cannot be loaded.
    """

    def __init__(self, routes: Routes, base: HttpProcessorConfig, *,
                 call_tracer: CallSpans | str | None = "auto") -> None:
        batching = any(service.batch_size for service in routes.services())
        self.call_tracer = resolve(call_tracer, client=not batching)
        self._base = base
        # One pool of connections for every service, as one handler would have: ten
        # routes to one server reuse the same keep-alive connections.
        self.pool = SharedPool(base.max_connections)
        self.services: dict[Service, Inner] = {}
        self.reload(routes)

    def reload(self, routes: Routes) -> list[Inner]:
        """Route by ``routes`` from now on (a routes file reloaded): the services they
        still name keep their processors (pools, outage tracking), new ones get theirs,
        and every place is resolved again at its next call. Calls in flight go on.
        Returns the processors of the services no route names any more: close them once
        their calls in flight are done (``request_timeout`` bounds them).

        Raises:
            ConfigError: a new service's settings are invalid (nothing changed).
        """
        services = routes.services()
        made = {service: self.services.get(service) or self._inner(service, self._base)
                for service in services}
        retired = [inner for service, inner in self.services.items() if service not in made]
        self.routes, self.services = routes, made
        self.names = {service: service_name(service.url) for service in services}
        self._by_name = {self.names[service]: inner for service, inner in made.items()}
        self._places: dict[Place, tuple[Inner, str] | None] = {}
        return retired

    def _inner(self, service: Service, base: HttpProcessorConfig) -> Inner:
        headers = {name: value for name, value in base.headers.items()
                   if name.lower() not in {own.lower() for own, _ in service.headers}}
        config = replace(
            base, handler_url=service.url, headers={**headers, **dict(service.headers)},
            request_timeout=service.timeout or base.request_timeout,
            health_url=service.health_url or default_health_url(service.url),
            health_optional=service.health_url is None, reduce_url=service.reduce_url)
        if service.batch_size:
            return BatchingHttpProcessor(config, batch_size=service.batch_size,
                                         batch_url=service.batch_url,
                                         call_tracer=self.call_tracer, pool=self.pool)
        return HttpProcessor(config, call_tracer=self.call_tracer, pool=self.pool)

    def __repr__(self) -> str:
        return (f"RoutedHttpProcessor(pipelines={sorted(self.routes.pipelines)!r}, "
                f"services={sorted(self._by_name)!r})")

    async def __aenter__(self) -> RoutedHttpProcessor:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    def _route(self, pipeline: str, version: str | None, gate: int) -> tuple[Inner, str] | None:
        """The processor and service name of a place, resolved once and kept."""
        place = (pipeline, version, gate)
        try:
            return self._places[place]
        except KeyError:
            service = self.routes.resolve(pipeline, version, gate)
            found = None if service is None else (self.services[service], self.names[service])
            self._places[place] = found
            return found

    def service_of(self, pipeline: str, version: str | None, gate: int) -> str:
        """The service (its URL without secrets) a place's calls go to; :data:`NO_ROUTE`
        when none does."""
        found = self._route(pipeline, version, gate)
        return NO_ROUTE if found is None else found[1]

    def _no_route(self, pipeline: str, version: str | None, gate: int) -> Exception:
        return HandlerUnavailableError(
            f"this processor has no route for gate {gate} of pipeline {pipeline!r}"
            + ("" if version is None else f" version {version!r}")
            + "; it hands the partition over to a processor whose routes have one")

    async def process(self, item: WorkItem) -> Result:
        """Call the service of ``item``'s place (as :meth:`HttpProcessor.process`).

        Raises:
            RetryableError, NonRetryableError: as the service's processor raises them;
                :class:`~watcher.protocol.HandlerUnavailableError` when no route serves
                the place (no attempt is spent).
        """
        found = self._places.get((item.pipeline, item.pipeline_version, item.gate))
        if found is None:
            found = self._route(item.pipeline, item.pipeline_version, item.gate)
            if found is None:
                raise self._no_route(item.pipeline, item.pipeline_version, item.gate)
        return await found[0].process(item)

    async def reduce(self, call: ReduceCall) -> ReduceResult:
        """POST a reduce call to its place's service's reduce URL.

        Raises:
            RetryableError, NonRetryableError: as :meth:`process`.
        """
        found = self._route(call.pipeline, call.pipeline_version, call.gate)
        if found is None:
            raise self._no_route(call.pipeline, call.pipeline_version, call.gate)
        return await found[0].reduce(call)

    async def probe_service(self, name: str) -> bool:
        """Whether the service ``name`` answers (:meth:`HandlerEndpoint.probe`): the
        engine asks it while it holds that service's calls. Never raises."""
        inner = self._by_name.get(name)
        return False if inner is None else await inner.probe_handler()

    async def check_health(self) -> tuple[bool, str]:
        """Every service's health check, at once. Readiness is per service: the processor
        is ready while some service is healthy (its calls go on; those to a service down
        are held, :mod:`watcher.flow.handler_hold`), and the detail names each service
        that is not. Never raises."""
        results = await asyncio.gather(*(inner.check_health()
                                         for inner in self._by_name.values()))
        unhealthy = [f"{name}: {detail}" for name, (healthy, detail)
                     in zip(self._by_name, results, strict=True) if not healthy]
        healthy = len(results) - len(unhealthy)
        detail = f"{healthy} of {len(results)} services healthy"
        return healthy > 0, detail + "".join(f"; {line}" for line in unhealthy)

    def start(self) -> None:
        """Build every service's HTTP client now (see :meth:`HttpProcessor.start`)."""
        for inner in self._by_name.values():
            inner.start()

    async def aclose(self) -> None:
        """Close every service's connections. Safe to call more than once."""
        for inner in self.services.values():
            await inner.aclose()
        await self.pool.aclose()
