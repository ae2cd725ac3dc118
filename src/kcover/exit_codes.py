"""kcover's own exit codes: what the ``kcover`` command tells the shell that ran it.

Part of the contract (scripts and CI branch on them), so defined once and never
renumbered.  Not to be confused with the exit statuses of *workers* that kcover
reads as evidence of a fault (:mod:`kcover.classify.exit_codes`).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    SUCCESS = 0
    """The command did what was asked; no fatal fault (``explain``), the job succeeded (``run``)."""
    FAILED = 1
    """A fatal fault was found, the job failed, a check failed, or a history could not be read."""
    USAGE = 2
    """A user mistake: a bad option or value, a bad catalog, a missing file; nothing was started."""
    OUTPUT_ERROR = 74
    """``EX_IOERR``: the results could not be written to stdout."""
    INTERRUPTED = 130
    """128 + SIGINT: kcover (or the job it ran) was interrupted."""
    CLOSED_PIPE = 141
    """128 + SIGPIPE: stdout was closed by the reader (quietly, as a tool killed by SIGPIPE)."""
