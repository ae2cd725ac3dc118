"""A duty-cycle throttle: make one worker run ``factor`` times slower, from outside, with SIGSTOP/SIGCONT.

``--inject slow@rank3:factor=1.3`` plays a straggler (a throttled GPU, a
degraded link, a noisy neighbour) without touching the training script: a
thread stops the worker's process group for ``1 - 1/factor`` of every
:data:`PERIOD` and lets it run for the rest, so its work takes ``factor`` times
as long.

A stopped process must never outlive the throttle: :meth:`Throttle.stop`
ends the thread first (so it cannot stop the group again), then sends SIGCONT;
the attempt calls it before it stops its workers, on every exit path
(success, failure, hang, interrupt, an exception in kcover).  Should kcover be
killed outright, the kernel's SIGKILL (``PR_SET_PDEATHSIG``) and the guardian's
reach stopped processes too.  A group that is gone (the rank died while
throttled) ends the thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

PERIOD = 0.02
"""Seconds of one stop + run cycle: short against a training step, long against the signals' latency."""


class Throttle:
    """Slows the process group ``pgid`` by ``factor`` until :meth:`stop`."""

    def __init__(self, pgid: int, factor: float, period: float = PERIOD) -> None:
        self.pgid = pgid
        self.factor = factor
        self.stopped_share = 1.0 - 1.0 / factor
        self.period = period
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._cycle, name=f"kcover-throttle-{pgid}", daemon=True)

    def start(self) -> Throttle:
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """End the cycle and leave the group running (SIGCONT); idempotent, safe when the group is gone."""
        self._done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        self._signal(signal.SIGCONT)

    def _cycle(self) -> None:
        halt = self.period * self.stopped_share
        while not self._done.is_set():
            if not self._signal(signal.SIGSTOP):
                return
            self._done.wait(halt)
            if not self._signal(signal.SIGCONT):
                return
            self._done.wait(self.period - halt)

    def _signal(self, sig: int) -> bool:
        """Send ``sig`` to the group; False when it is gone."""
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:  # the pgid was reused by someone else's processes: stop touching it
            self._done.set()
            return False
        return True


def stop_all(throttles: list[Throttle]) -> None:
    """Stop every throttle (see :meth:`Throttle.stop`), whatever one of them raises."""
    while throttles:
        with contextlib.suppress(Exception):
            throttles.pop().stop()
