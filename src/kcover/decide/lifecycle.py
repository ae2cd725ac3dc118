"""The recovery lifecycle of one job as an explicit state machine.

A job moves through ``starting → running → stopping → backoff → starting …``
until it ends ``succeeded``, ``failed`` or ``interrupted``.  Every move is
checked against :data:`ALLOWED`; an illegal one raises
:class:`IllegalTransitionError` instead of silently corrupting the run, so a bug in
a supervisor shows up at once rather than as a restart loop.
"""

from __future__ import annotations

from enum import StrEnum


class JobPhase(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


FINAL = frozenset({JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.INTERRUPTED})

ALLOWED: dict[JobPhase, frozenset[JobPhase]] = {
    JobPhase.STARTING: frozenset({JobPhase.RUNNING, JobPhase.STOPPING, JobPhase.FAILED}),
    JobPhase.RUNNING: frozenset({JobPhase.STOPPING, JobPhase.SUCCEEDED}),
    JobPhase.STOPPING: frozenset({JobPhase.BACKOFF, JobPhase.FAILED, JobPhase.INTERRUPTED}),
    JobPhase.BACKOFF: frozenset({JobPhase.STARTING, JobPhase.INTERRUPTED}),
    JobPhase.SUCCEEDED: frozenset(),
    JobPhase.FAILED: frozenset(),
    JobPhase.INTERRUPTED: frozenset(),
}


class IllegalTransitionError(RuntimeError):
    """A move the lifecycle does not allow (a bug in the caller, never a user error)."""


class Lifecycle:
    """The current phase of a job and the times it entered each phase."""

    def __init__(self, now: float) -> None:
        self.phase = JobPhase.STARTING
        self.history: list[tuple[JobPhase, float]] = [(JobPhase.STARTING, now)]

    def move(self, to: JobPhase, now: float) -> None:
        if to not in ALLOWED[self.phase]:
            raise IllegalTransitionError(f"cannot go from {self.phase} to {to}")
        self.phase = to
        self.history.append((to, now))

    @property
    def finished(self) -> bool:
        return self.phase in FINAL
