# The statefeed processor container.
#
#   docker build -f Processor.Dockerfile -t statefeed-processor .
#   docker run --rm -e PROCESSOR_DB_URL=postgresql://user:pass@db:5432/app \
#       -e PROCESSOR_HANDLER_URL=http://handler:8000/ statefeed-processor
#
# Every `processor run` option is also an environment variable PROCESSOR_<OPTION>.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY watcher ./watcher
COPY processor ./processor
COPY handlers ./handlers

# The PostgreSQL driver (psycopg with its binary wheel) is a base dependency;
# the SQL Server driver comes with the mssql extra.
RUN pip install ".[mssql]"

RUN useradd --create-home --uid 10001 statefeed
USER statefeed

EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PROCESSOR_HEALTH_PORT', '8080'), timeout=2)"

ENTRYPOINT ["processor"]
CMD ["run"]
