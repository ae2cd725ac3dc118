"""The ``kcover`` command line: one module per command, assembled in :mod:`kcover.cli.main`."""
