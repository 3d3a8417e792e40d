"""What operators observe: log output, Prometheus metrics, the health endpoints and the
healthcheck verb, OpenTelemetry tracing, the flow-control reads the CLI and console
share, and redaction of secrets from every message.

May import :mod:`watcher` only (and optional libraries, imported where used).
"""
