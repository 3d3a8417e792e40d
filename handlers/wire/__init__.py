"""The handler's side of the HTTP contract, as pure functions: requests to items and
results to bytes (:mod:`handlers.wire.contract`), and reduce calls
(:mod:`handlers.wire.reduce`). :mod:`processor.wire.contract` is the same contract from the
processor's side.

Pure: no I/O; may import the rest of :mod:`handlers`, never :mod:`processor` or
:mod:`watcher`.
"""
