"""``python -m kcover`` runs the command line, same as the ``kcover`` script."""

from kcover.cli.main import main

main()
