"""``processor console``: a web console for one statefeed database.

It shows every partition's progress gate by gate, who holds which lease, what
failed and why, and retries, cancels or deletes partitions with the client
operations the CLI uses, one at a time or ticked in the list. :mod:`processor.console.app`
is the web application (its settings: :mod:`processor.console.settings`),
:mod:`processor.console.security` who may use it, :mod:`processor.console.views` what
the pages show (pure), and :mod:`processor.console.server` serves it with uvicorn.

May import :mod:`watcher`, :mod:`handlers`, the service's shared top-level modules and
the folders below it (:mod:`processor.wire`, :mod:`~processor.observe`,
:mod:`~processor.notify`, :mod:`~processor.feed`, :mod:`~processor.client`,
:mod:`~processor.http`); never :mod:`processor.api` or :mod:`processor.cli`, which
import it.
"""
