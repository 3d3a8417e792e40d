"""The smallest handler: complete every item and keep its bytes.

Run it with ``uvicorn handlers.examples.echo:app`` and point a processor at
``http://127.0.0.1:8000/``.
"""

from __future__ import annotations

import handlers


async def echo(item: handlers.Item) -> handlers.Result:
    """Complete ``item``; ``data`` is left unset, so the stored bytes stay as they are.

    ``async`` because it never blocks: it runs on the event loop without a
    thread hop. Raises nothing.
    """
    return handlers.Result(done=True)


app = handlers.app(echo)

if __name__ == "__main__":
    handlers.serve(app)
