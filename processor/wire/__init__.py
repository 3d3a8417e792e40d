"""The processor's side of the HTTP handler contract, as pure functions and values:
requests to a handler, its replies read into results or errors, and reduce calls.
:mod:`handlers.wire.contract` is the same contract from the handler's side.

Pure: no I/O. May import :mod:`watcher` (its protocol and rules) only.
"""
