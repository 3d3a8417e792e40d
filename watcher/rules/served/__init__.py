"""Pure decisions about the fleet as a whole: which places (pipeline, version, gate) the
live processors serve, and how a processor's row says what it serves.

Modules here take plain values and return plain values: no I/O, no clock reads. They
import :mod:`watcher.pipelines` and :mod:`watcher.reports` (values) and nothing else
of the engine.
"""
