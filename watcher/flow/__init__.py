"""Flow control: the limits a partition's calls pass through at one processor, fleet-wide
rate limits and the hold a handler's ``Retry-After`` asks for, and per-key in-flight
limits (a processor's key pools and the limiter that keeps their grants).

May import :mod:`watcher.store`, :mod:`watcher.rules`, :mod:`watcher.schedules` and the
shared top-level modules; never :mod:`watcher.dispatch` or :mod:`watcher.leasing`.
"""
