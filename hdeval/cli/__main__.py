"""``python -m hdeval.cli``: the same as the ``hdeval`` command."""

from hdeval.cli import main

main()
