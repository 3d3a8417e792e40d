# The statefeed processor container.
#
#   docker build -f Processor.Dockerfile -t statefeed-processor .
#   docker run --rm -e PROCESSOR_DB_URL=postgresql://user:pass@db:5432/app \
#       -e PROCESSOR_HANDLER_URL=http://handler:8000/ statefeed-processor
#
# Every `processor run` option is also an environment variable PROCESSOR_<OPTION>.
# One image for every server role: `processor run` (the default), `processor api`,
# `processor console` and `processor migrate`.
# Two stages: `build` makes the wheels and the virtual environment; the runtime stage is
# Debian's slim image with Debian's Python 3.11 and that environment, and no compiler,
# pip or build tool. It speaks PostgreSQL, MariaDB/MySQL and SQLite, and traces with
# OpenTelemetry when the OTEL_* variables ask (the otel extra); for SQL Server add its
# driver (about 50 MB):
#
#   docker build -f Processor.Dockerfile --build-arg EXTRAS=mysql,otel,mssql -t statefeed-processor .

# handlers/examples/Dockerfile starts both of its stages with the same steps, so that
# building both images makes these layers once.
FROM debian:bookworm-slim AS build

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/statefeed
WORKDIR /src

# The dependencies first, from pyproject.toml alone, so that a change to the code
# rebuilds only the small layers below.
# EXTRAS: the optional parts, as named in pyproject.toml (mysql, otel, mssql).
ARG EXTRAS=mysql,otel
COPY pyproject.toml ./
RUN python3 -c 'import os, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
names = os.environ["EXTRAS"].replace(",", " ").split(); \
extras = [r for name in names for r in p["optional-dependencies"][name]]; \
print("\n".join(p["dependencies"] + extras))' >requirements.txt \
    && /opt/statefeed/bin/pip wheel --wheel-dir /wheels -r requirements.txt \
    && /opt/statefeed/bin/pip install --no-index --find-links /wheels -r requirements.txt

COPY README.md alembic.ini ./
COPY watcher ./watcher
COPY processor ./processor
COPY handlers ./handlers
# statefeed itself as a wheel, then the tools that only building needed leave the
# environment (its console script `processor` stays).
RUN /opt/statefeed/bin/pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/statefeed/bin/pip install --no-deps --no-index /wheels/statefeed-*.whl \
    && /opt/statefeed/bin/pip uninstall -y -q pip setuptools \
    && /opt/statefeed/bin/processor --help >/dev/null


FROM debian:bookworm-slim

# Python and the CA certificates (the handler's TLS is verified against them), from
# Debian: the virtual environment below links to this /usr/bin/python3.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/statefeed \
       --create-home --shell /usr/sbin/nologin statefeed

COPY --from=build /opt/statefeed /opt/statefeed

# PROCESSOR_SHUTDOWN_TIMEOUT: on SIGTERM, in-flight handler calls get this long before
# the leases are released. 8 s fits in `docker stop`'s 10 s; an orchestrator that waits
# longer (Kubernetes' terminationGracePeriodSeconds) can raise it, staying below its wait.
ENV PATH=/opt/statefeed/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PROCESSOR_SHUTDOWN_TIMEOUT=8 \
    PROCESSOR_HEALTH_PORT=8080

# A numeric user, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /var/lib/statefeed
EXPOSE 8080
# `processor run` is PID 1 and handles SIGTERM itself: it stops leasing, gives in-flight
# calls up to the shutdown timeout, writes their results, releases its leases, exits 0.
STOPSIGNAL SIGTERM
# `processor healthcheck` reads the health port and host that `processor run` was
# started with (flag or PROCESSOR_HEALTH_PORT/HOST) and exits 0 or 1.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD ["processor", "healthcheck"]

ENTRYPOINT ["processor"]
CMD ["run"]

# The labels come last, so that a new REVISION (`--build-arg REVISION=$(git rev-parse HEAD)`)
# rebuilds nothing else.
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="statefeed-processor" \
      org.opencontainers.image.description="statefeed processor: leases partitions from SQL and drives their items through an HTTP handler, gate by gate" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim"
