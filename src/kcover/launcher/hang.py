"""Noticing the absence of progress: a hang detector with a learned timeout.

A job is hung when no rank has reported a new step for the timeout.  With
``--hang-timeout`` the timeout is fixed.  Otherwise it is learned: the slowest
interval between steps seen so far × :data:`SAFETY_FACTOR`, never below
:data:`FLOOR_SECONDS`.  Before the first step (loading data, compiling) the
startup allowance applies instead.  The detector is reset for each attempt, so
a restart never inherits an old deadline (a hang detector that re-fired after
every restart once killed a job every 30 minutes).  No clock reads: callers pass
``now``.
"""

from __future__ import annotations

from collections import deque

FLOOR_SECONDS = 60.0
SAFETY_FACTOR = 5.0
STARTUP_SECONDS = 900.0


class HangDetector:
    def __init__(
        self,
        now: float,
        fixed_timeout: float | None = None,
        startup_timeout: float = STARTUP_SECONDS,
        floor: float = FLOOR_SECONDS,
        factor: float = SAFETY_FACTOR,
    ) -> None:
        self.fixed = fixed_timeout
        self.startup = max(startup_timeout, fixed_timeout or 0.0)
        self.floor = floor
        self.factor = factor
        self.started = now
        self.last_progress: float | None = None
        self.step: int | None = None
        self._intervals: deque[float] = deque(maxlen=50)

    def observe(self, step: int, now: float) -> bool:
        """Record a step report; True when it is new progress for the job."""
        if self.step is not None and step <= self.step:
            return False
        if self.last_progress is not None:
            self._intervals.append(now - self.last_progress)
        self.step = step
        self.last_progress = now
        return True

    @property
    def timeout(self) -> float:
        """The current timeout: fixed, or learned from observed step intervals."""
        if self.fixed is not None:
            return self.fixed
        slowest = max(self._intervals, default=0.0)
        return max(self.floor, self.factor * slowest)

    def deadline(self) -> float:
        if self.last_progress is None:
            return self.started + self.startup
        return self.last_progress + self.timeout

    def is_hung(self, now: float) -> bool:
        return now >= self.deadline()

    def describe(self, now: float) -> str:
        """The evidence line for a hang, in words the catalog recognises."""
        since = self.last_progress if self.last_progress is not None else self.started
        where = f"last step {self.step}" if self.step is not None else "no step reported yet"
        return f"No training progress for {now - since:.0f} s ({where}; timeout {self.timeout:.0f} s)"
