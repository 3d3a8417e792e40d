"""The notifications' metrics: events waiting and given up (read from the outbox every
few seconds by the delivery loop), and attempts by how they ended. Labels come from a
fixed set; no event, partition or URL is ever a label."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

OUTCOMES = frozenset({"delivered", "pending", "dead", "lost", "refused"})


class NotifyMetrics:
    """``statefeed_notifications{state}`` (pending, due, dead) and
    ``statefeed_notification_attempts_total{outcome}``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Gauge("statefeed_notifications",
                            "Notification events in the outbox by state: pending (due now "
                            "or later), due (pending and due now), dead (given up)",
                            ["state"], registry=registry)
        self.attempts = Counter("statefeed_notification_attempts_total",
                                "Notification attempts this processor made, by what they "
                                "left the event as: delivered, pending (to retry), dead, "
                                "lost (another processor had claimed it), refused (left "
                                "unspent to a processor with --notify-allow-private)",
                                ["outcome"], registry=registry)

    def counts(self, counts: dict[str, int]) -> None:
        """Set the gauges from the outbox's counts (``notifications_counts``)."""
        for state in ("pending", "due", "dead"):
            self.events.labels(state).set(counts.get(state, 0))

    def attempted(self, outcome: str) -> None:
        """Count one attempt that ended as ``outcome``."""
        self.attempts.labels(outcome if outcome in OUTCOMES else "lost").inc()
