"""``python -m edgefarm.cli``: the ``edgefarm`` command."""

from edgefarm.cli import main

main()
