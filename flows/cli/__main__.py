"""``python -m flows.cli``: the ``edgefarm`` command."""

from flows.cli import main

main()
