"""``python -m processor.cli``: the ``processor`` command."""

from processor.cli import main

main()
