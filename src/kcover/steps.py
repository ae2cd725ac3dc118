"""Training steps: reading step numbers from log text, and noticing when they stop coming.

Both the launcher (``kcover run``, reading its workers' pipes) and the node
agent (tailing container logs on Kubernetes) watch the same thing: the newest
step a job reports.  :func:`last_step` finds it in a block of log text
(``step 120``, ``iteration 120/5000``, ``global_step=120``); :class:`HangDetector`
says when none came for too long.  Neither reads a clock or does I/O: callers
pass ``now``.  This module sits low (it imports nothing of kcover), so the agent
needs no launcher and the launcher no agent.  (Not ``kcover.progress``: that is
the SDK's function on the package.)

A job is hung when no rank has reported a new step for the timeout.  With
``--hang-timeout`` the timeout is fixed.  Otherwise it is learned: the slowest
interval between steps seen so far × :data:`SAFETY_FACTOR`, never below
:data:`FLOOR_SECONDS`.  Before the first step (loading data, compiling) the
startup allowance applies instead.  The detector is reset for each attempt, so
a restart never inherits an old deadline (a hang detector that re-fired after
every restart once killed a job every 30 minutes).
"""

from __future__ import annotations

import re
from collections import deque

FLOOR_SECONDS = 60.0
SAFETY_FACTOR = 5.0
STARTUP_SECONDS = 900.0
STEP_WINDOW = 4096
"""Bytes at the end of a block searched for a step number."""
_STEP_AT = re.compile(rb"(?:step|iteration|iter)\s*[:=#]?\s*(\d+)")
_WORDS = (b"step", b"iter")


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


def last_step(block: bytes) -> int | None:
    """The last step number a block of log names (``step 12``, ``iteration 12/500``, ``global_step=12``).

    Searched backwards from the end of the block with ``rfind`` (the newest step
    is nearly always in the last line), so a busy log costs microseconds.
    """
    window = block[-STEP_WINDOW:].lower()
    end = len(window)
    while end > 0:
        position = max(window.rfind(word, 0, end) for word in _WORDS)
        if position < 0:
            return None
        before = window[position - 1 : position]
        if not before.isalnum() or window[max(0, position - 7) : position] == b"global_":
            match = _STEP_AT.match(window, position)
            if match:
                return int(match.group(1))
        end = position
    return None
