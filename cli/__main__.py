"""``python -m cli``: the ``edgefarm`` command."""

from cli import main

main()
