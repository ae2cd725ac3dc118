"""Run an emergency action on SIGTERM, even while the main thread is stuck in C code.

When the supervisor (``kcover run``, or the kubelet deleting a pod) stops a job
it sends SIGTERM, waits a grace period, then SIGKILLs.  A worker that lost a
peer usually sits inside a collective — C++ code that holds the main thread
for minutes — so a plain Python signal handler would never run in time.

:class:`SigtermGuard` therefore installs a Python handler *and* a wakeup fd: the
interpreter's C-level handler writes the signal number to a pipe the moment the
signal arrives, and a watcher thread reacts at once.  The action (the
Checkpointer's "persist the newest snapshot") runs exactly once, in whichever
thread gets there first.  Afterwards the process ends the way it would have:
the previous Python handler is called, or, for the default disposition, the
signal is re-raised — and when the main thread cannot even get there (still
stuck), the watcher exits the process with status 143 (128 + SIGTERM).

While the main thread is inside :meth:`deferred` (holding the snapshot lock),
a SIGTERM handled there is postponed until it lets go — the action needs that
lock; the watcher simply waits for it.  If another library already owns the wakeup fd
(asyncio does), only the main-thread handler is used, and a warning says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

log = logging.getLogger("kcover.checkpoint")
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class SigtermGuard:
    def __init__(self, action: Callable[[], None], exit_after: float = 1.0) -> None:
        self._action = action
        self._exit_after = exit_after
        self._previous: _Handler = None
        self._installed = False
        self._pipe: tuple[int, int] | None = None
        self._run_lock = threading.Lock()
        self._done = threading.Event()
        self._started = False
        self._main_entered = threading.Event()
        self._deferring = 0  # nesting depth of deferred() in the main thread
        self._pending: tuple[int, FrameType | None] | None = None

    def install(self) -> bool:
        """Install the handler; returns False (and does nothing) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("kcover checkpoint: not in the main thread, no emergency save on SIGTERM")
            return False
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        self._installed = True
        read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if old != -1:
            signal.set_wakeup_fd(old)
            os.close(read)
            os.close(write)
            log.warning("kcover checkpoint: the signal wakeup fd is taken (asyncio?); the emergency save on "
                        "SIGTERM runs only when the main thread is free")
            return True
        self._pipe = (read, write)
        os.set_blocking(read, True)
        threading.Thread(target=self._watch, name="kcover-sigterm", daemon=True).start()
        return True

    def uninstall(self) -> None:
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._on_signal:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
        if self._pipe is not None:
            signal.set_wakeup_fd(-1)
            os.close(self._pipe[1])  # the watcher sees EOF and ends; it closes the read end
            self._pipe = None
        self._installed = False

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Postpone a SIGTERM handled by the main thread until the block ends (no-op in other threads)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1
            pending, self._pending = (self._pending, None) if self._deferring == 0 else (None, self._pending)
            if pending is not None:
                self._on_signal(*pending)

    def run_once(self) -> None:
        """Run the action (first caller) or wait for the run in progress to finish."""
        with self._run_lock:
            first = not self._started
            self._started = True
        if not first:
            self._done.wait()
            return
        try:
            self._action()
        except Exception:
            log.exception("kcover checkpoint: emergency save failed")
        finally:
            self._done.set()

    def _watch(self) -> None:
        assert self._pipe is not None
        read = self._pipe[0]
        try:
            while True:
                try:
                    data = os.read(read, 64)
                except InterruptedError:
                    continue
                if not data:
                    return
                if signal.SIGTERM in data:
                    break
        except OSError:
            return
        finally:
            os.close(read)
        self.run_once()
        if self._main_entered.wait(self._exit_after):
            return
        if self._previous in (signal.SIG_DFL, None):
            log.warning("kcover checkpoint: main thread busy in native code; exiting after the emergency save")
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(128 + signal.SIGTERM)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._main_entered.set()
        if self._deferring:
            self._pending = (signum, frame)
            return
        self.run_once()
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
