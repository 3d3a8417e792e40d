"""The developer's verbs: ``processor replay`` (send an item's call to a handler again,
such as one under a debugger) and ``processor dev`` (a throwaway database, the user's
handler app with reload, a processor, the ingest API and the console in one command).

Part of :mod:`processor.cli`: may import what the CLI may (the whole service and the
engine); nothing imports it but :mod:`processor.cli`.
"""
