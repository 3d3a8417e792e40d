"""The processor service: one watcher dispatching to an HTTP handler, with health
endpoints and backlog gauges, background retention when asked for, database waits at
start-up, and graceful shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn
from sqlalchemy.exc import SQLAlchemyError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from processor.embedded import EmbeddedServer
from processor.embedded_http import http_options
from processor.health import HealthApp
from processor.http.batch import BatchingHttpProcessor
from processor.http.config import HttpProcessorConfig
from processor.http.processor import HttpProcessor
from processor.http.routed import RoutedHttpProcessor
from processor.http.routes import Routes, parse_routes
from processor.notify.deliverer import Deliverer
from processor.notify.metrics import NotifyMetrics
from processor.notify.policy import NotifyConfig
from processor.observe.metrics import (
    BACKLOG_CAP,
    DEFAULT_BACKLOG_INTERVAL,
    BacklogGauges,
    PrometheusHooks,
)
from processor.observe.metrics_flow import FLOW_READ_CAP
from processor.observe.metrics_pipelines import Places
from processor.observe.redact import redact_url
from watcher.config import DEFAULT_DB_TIMEOUT, WatcherConfig
from watcher.dispatch.backoff import last_error, sleep_until
from watcher.errors import ConfigError, DatabaseError
from watcher.reports import Backlog, FlowControlInfo
from watcher.retention import Retention, RetentionConfig
from watcher.rules.checks import check_seconds, check_whole_number
from watcher.rules.served.places import unserved
from watcher.schedule_ticker import Ticker
from watcher.store import Store, missing_tables, not_migrated, sqlite_file_missing
from watcher.store.db.urls import DatabaseURL
from watcher.text import first_line, shorten
from watcher.watcher import Watcher

log = logging.getLogger(__name__)

# Waits between tries while the database is unreachable at start-up: doubling
# from the first up to the longest.
DB_WAIT_FIRST = 0.5
DB_WAIT_MAX = 30.0
DB_ERROR_DETAIL_CHARS = 300
MAX_PORT = 65535


@dataclass(frozen=True)
class ServiceConfig:
    """Everything ``processor run`` needs, validated by the CLI before it starts.

    ``batch_size`` 0 sends one item per request; ``health_port`` 0 turns the
    health endpoints off (and with them the backlog gauges, read every
    ``backlog_interval`` seconds at most); ``retention`` turns background
    retention on. The CLI holds the defaults (``processor.cli.common``).

    Raises:
        ConfigError: ``batch_size``, ``health_port`` or ``backlog_interval`` is out of range.
    """

    db_url: DatabaseURL
    watcher: WatcherConfig
    http: HttpProcessorConfig
    batch_size: int
    health_port: int
    health_host: str
    table_prefix: str = ""
    batch_url: str | None = None
    migrate: bool = False
    exit_on_db_error: bool = False
    retention: RetentionConfig | None = None
    backlog_interval: float = DEFAULT_BACKLOG_INTERVAL
    db_timeout: float = DEFAULT_DB_TIMEOUT
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    # Each pipeline's gates to their services (--routes), and the file they were read
    # from (SIGHUP reads it again); None: every call to ``http``.
    routes: Routes | None = None
    routes_path: str | None = None

    def __post_init__(self) -> None:
        check_whole_number("handler batch size", self.batch_size, minimum=0)
        check_whole_number("health port", self.health_port, minimum=0, maximum=MAX_PORT)
        check_seconds("backlog interval", self.backlog_interval)
        check_seconds("database timeout (--db-timeout)", self.db_timeout)


def describe_db_error(error: BaseException, url: DatabaseURL) -> str:
    """One line about a database failure, with every secret of the URL scrubbed."""
    # Scrubbed before it is shortened, so that no part of a secret is left.
    detail = url.scrub(first_line(error, 4 * DB_ERROR_DETAIL_CHARS))
    detail = shorten(detail, DB_ERROR_DETAIL_CHARS)
    return f"database {url.redacted()} is unavailable: {detail}"


def _freeze_startup_objects() -> None:
    """Exempt what start-up made (modules, SQLAlchemy metadata, the HTTP stack) from
    the garbage collector's full passes.

    The dispatch loop allocates fast enough to set off full collections often,
    and each one would walk these many long-lived objects again, a cost paid
    per item. Freezing them is the standard remedy for long-running services
    (``gc.freeze``); nothing allocated later is affected.
    """
    gc.collect()
    gc.freeze()


class ProcessorService:
    """Runs until asked to stop; :meth:`run` returns the process exit code."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.hooks = PrometheusHooks()
        self.store = Store.open(config.db_url, config.table_prefix,
                                db_timeout=config.db_timeout)
        self.http: HttpProcessor | BatchingHttpProcessor | RoutedHttpProcessor = (
            RoutedHttpProcessor(config.routes, config.http) if config.routes is not None
            else BatchingHttpProcessor(config.http, batch_size=config.batch_size,
                                       batch_url=config.batch_url)
            if config.batch_size else HttpProcessor(config.http))
        self.watcher = Watcher(self.store, self.http, config.watcher, self.hooks)
        self.retention = (
            Retention(self.store, config.watcher.owner_id, config.retention,
                      on_purged=self.hooks.retention_purged)
            if config.retention is not None else None)
        # Every processor ticks the schedules; their writes make each tick happen once.
        self.ticker = Ticker(self.store, config.watcher.owner_id)
        # Every processor sends the outbox's due events; their claims share them out.
        self.deliverer = Deliverer(self.store, config.watcher.owner_id, config.notify,
                                   NotifyMetrics(self.hooks.registry))
        self.backlog = BacklogGauges(self.hooks, self._read_backlog,
                                     interval=config.backlog_interval,
                                     read_flow=self._read_flow, read_places=self._read_places)
        self._stop = asyncio.Event()
        self._reloads: set[asyncio.Task[bool]] = set()  # SIGHUP's, under way

    def startup_line(self) -> str:
        """What this processor runs with, for its first log line: the database and the
        handler with their passwords (and a URL's query values) masked, and the
        concurrency."""
        config = self.config
        http = config.http
        fields = [
            "action=starting", f"owner={config.watcher.owner_id}",
            f"database={config.db_url.redacted()}",
            f"table_prefix={config.table_prefix or '-'}",
            (f"handler={redact_url(http.handler_url)}" if config.routes is None else
             f"pipelines={','.join(sorted(config.routes.pipelines))} "
             f"services={len(config.routes.services())}"),
            f"concurrency={config.watcher.concurrency}",
            f"batch_size={config.batch_size}",
            f"transport={http.transport}",
            f"migrate={'yes' if config.migrate else 'no'}",
        ]
        if config.watcher.notify_default is not None:
            fields.append(f"notify_default={redact_url(config.watcher.notify_default)}")
        return " ".join(fields)

    async def _read_backlog(self) -> Backlog:
        return await self.store.backlog_read(BACKLOG_CAP)

    async def _read_flow(self) -> list[FlowControlInfo]:
        return await self.store.flow_controls_list(limit=FLOW_READ_CAP, set_only=True)

    async def _read_places(self) -> Places:
        places = await self.store.partitions_open_places()
        live = await self.store.processors_live()
        return places, unserved(places, [processor.serves for processor in live])

    def request_stop(self) -> None:
        """Ask the service to shut down gracefully (what SIGTERM does)."""
        if not self._stop.is_set():
            log.info("action=shutdown_requested owner=%s", self.config.watcher.owner_id)
        self._stop.set()

    def request_reload(self) -> None:
        """SIGHUP: read the routes file again (:meth:`reload_routes`)."""
        task = asyncio.get_running_loop().create_task(self.reload_routes(), name="reload")
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def reload_routes(self) -> bool:
        """Read the routes file again and route by it from now on, without dropping a call
        in flight: the services it still names keep theirs, those it no longer names are
        closed once their calls are done, and the watcher leases by the new routes (held
        partitions it no longer serves are handed over). A file that cannot be read or
        is invalid changes nothing: each error is one ERROR line. Returns whether the
        routes changed. Never raises."""
        path, http = self.config.routes_path, self.http
        if path is None or not isinstance(http, RoutedHttpProcessor):
            log.info("action=routes_reload_ignored reason=no_routes_file")
            return False
        try:
            text = await asyncio.to_thread(Path(path).read_text, encoding="utf-8")
            routes = parse_routes(text, source=path)
            retired = http.reload(routes)
        except (OSError, UnicodeDecodeError, ConfigError) as error:
            for line in getattr(error, "errors", None) or [str(error)]:
                log.error("action=routes_refused error=%s (the routes in use stay)", line)
            return False
        self.watcher.serve(routes.served())
        log.info("action=routes_reloaded pipelines=%s services=%d retired=%d",
                 ",".join(sorted(routes.pipelines)), len(http.services), len(retired))
        if retired:
            await asyncio.sleep(self.config.http.request_timeout + 1.0)
            for inner in retired:
                await inner.aclose()
        return True

    async def _check_database(self) -> tuple[bool, str]:
        """Ready while the database answers in time: no kind of round trip is timing
        out (:meth:`Store.problem`), and a trivial query answers."""
        problem = self.store.problem()
        if problem is not None:
            return False, problem
        try:
            await self.store.ping()
            return True, "ok"
        except SQLAlchemyError as error:
            return False, type(error).__name__

    def _health_app(self) -> HealthApp:
        checks = {"database": self._check_database}
        if self.config.http.health_url:
            checks["handler"] = self.http.check_health
        return HealthApp(checks=checks, metrics=self.hooks.render,
                         before_metrics=self.backlog.fresh)

    async def _wait_for_database(self) -> bool:
        """Wait until the database answers and the tables exist. False: stop was requested.

        Tries again with doubling waits, logging once when the first try fails
        and once when the database answers; a stop cuts a wait short.

        Raises:
            DatabaseError: the database is unreachable and ``exit_on_db_error`` is set,
                or the tables are missing (a SQLite file that does not exist is reported,
                not created), unless ``migrate`` is set.
        """
        if not self.config.migrate and sqlite_file_missing(self.config.db_url):
            # Connecting would create an empty file (a typo in the path, say).
            raise not_migrated(self.config.db_url, self.config.table_prefix,
                               self._table_names())
        retrying = AsyncRetrying(
            retry=retry_if_exception_type((SQLAlchemyError, OSError)),
            wait=wait_exponential(multiplier=DB_WAIT_FIRST, max=DB_WAIT_MAX),
            sleep=sleep_until(self._stop), before_sleep=self._database_waiting)
        async for attempt in retrying:
            with attempt:
                if self._stop.is_set():
                    return False
                missing = await self._missing_tables()
        if attempt.retry_state.attempt_number > 1:
            log.info("action=database_available")
        if missing and self.config.migrate:
            # Imported here: Alembic (and Mako) add a fifth to a start-up that does not
            # migrate, and a start's time is the time to a processor's first lease.
            from watcher.store.db.migrate import upgrade

            await asyncio.to_thread(upgrade, self.config.db_url, self.config.table_prefix)
            log.info("action=migrated tables=%s", ",".join(missing))
        elif missing:
            raise not_migrated(self.config.db_url, self.config.table_prefix, missing)
        return True

    def _table_names(self) -> list[str]:
        tables = self.store.tables
        return [tables.partitions.name, tables.items.name, tables.leaders.name]

    async def _missing_tables(self) -> list[str]:
        """The statefeed tables the database lacks.

        Raises:
            DatabaseError: the database is unreachable and ``exit_on_db_error`` is set.
            SQLAlchemyError | OSError: it is unreachable (to wait and try again).
        """
        try:
            return await missing_tables(self.store)
        except (SQLAlchemyError, OSError) as error:
            if self.config.exit_on_db_error:
                raise DatabaseError(describe_db_error(error, self.config.db_url)) from None
            raise

    def _database_waiting(self, state: RetryCallState) -> None:
        """Log the first failed try: the service waits for the database."""
        error = last_error(state)
        if state.attempt_number == 1 and error is not None:
            log.warning("action=database_wait %s; retrying with backoff",
                        describe_db_error(error, self.config.db_url))

    def _bind_health(self) -> socket.socket:
        """Bind the health port here, so a port in use is a clear error, not an exit.

        Raises:
            ConfigError: the port cannot be bound.
        """
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.config.health_host, self.config.health_port))
        except OSError as error:
            sock.close()
            raise ConfigError(
                f"cannot serve health checks on {self.config.health_host}:"
                f"{self.config.health_port} ({error.strerror}); pick another port with "
                "--health-port, or 0 to turn them off") from None
        sock.set_inheritable(True)
        return sock

    def _start_duties(self) -> list[asyncio.Task[None]]:
        """Start what runs beside the watcher: the schedules' ticker, the notifications'
        delivery loop, retention (when
        configured) and the backlog gauges (when the metrics are served)."""
        duties = [asyncio.create_task(self.ticker.run(), name="ticker"),
                  asyncio.create_task(self.deliverer.run(), name="notifications")]
        if self.retention is not None:
            duties.append(asyncio.create_task(self.retention.run(), name="retention"))
        if self.config.health_port:
            duties.append(asyncio.create_task(self.backlog.run(), name="backlog"))
        return duties

    async def _stop_duties(self, duties: list[asyncio.Task[None]]) -> None:
        """Stop them: retention ends after its batch in progress and gives up its lease."""
        self.ticker.stop()
        self.deliverer.stop()
        if self.retention is not None:
            self.retention.stop()
        self.backlog.stop()
        for task, outcome in zip(duties, await asyncio.gather(*duties, return_exceptions=True),
                                 strict=True):
            if isinstance(outcome, BaseException):
                log.error("action=duty_failed duty=%s error=%r", task.get_name(), outcome,
                          exc_info=outcome)

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT or :meth:`request_stop`; returns the exit code.
        SIGHUP reloads the routes meanwhile, and is ignored from then on.

        Raises:
            DatabaseError: see :meth:`_wait_for_database`.
        """
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self.request_stop)
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        log.info(self.startup_line())
        health = None
        health_task = None
        if self.config.health_port:
            health = EmbeddedServer(uvicorn.Config(
                self._health_app(), host=self.config.health_host, port=self.config.health_port,
                log_config=None, log_level="warning", access_log=False, lifespan="off",
                **http_options()))
            health_task = asyncio.create_task(
                health.serve(sockets=[self._bind_health()]), name="health")
        try:
            if not await self._wait_for_database():
                return 0
            self.http.start()
            _freeze_startup_objects()
            watcher_task = asyncio.create_task(self.watcher.run(), name="watcher")
            duties = self._start_duties()
            stop_task = asyncio.create_task(self._stop.wait())
            await asyncio.wait({watcher_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            await self._stop_duties(duties)
            await self.watcher.stop()
            await watcher_task
            stop_task.cancel()
            return 0
        finally:
            if health is not None and health_task is not None:
                health.should_exit = True
                await asyncio.wait({health_task}, timeout=5)
            await self.http.aclose()
            await self.store.close()
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signum)
            # A reload asked for while the process ends has nothing left to reload, and
            # SIGHUP's default action would end it with no exit code of its own.
            with contextlib.suppress(ValueError):  # not the main thread: not ours to set
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
