"""Run emergency actions on SIGTERM, even while the main thread is stuck in C code.

When the supervisor (``kcover run``, or the kubelet deleting a pod) stops a job
it sends SIGTERM, waits a grace period, then SIGKILLs.  A worker that lost a
peer usually sits inside a collective — C++ code that holds the main thread
for minutes — so a plain Python signal handler would never run in time.

A process has one SIGTERM handler and one signal wakeup fd, and may have several
Checkpointers, so one :class:`_Dispatcher` per process owns both: a Python
handler *and* a wakeup fd, whose pipe the interpreter's C-level handler writes
the signal number to the moment the signal arrives, so that a watcher thread
reacts at once.  Each Checkpointer registers a :class:`SigtermGuard` with it;
on SIGTERM every registered guard's action (the Checkpointer's "persist the
newest snapshot") runs exactly once, each on its own thread, in whichever of
the two paths gets there first.  Afterwards the process ends the way it would
have: the previous Python handler is called, or, for the default disposition,
the signal is re-raised — and when that does not end it (the process is PID 1
of a container, for which the kernel ignores a default-disposition signal), or
the main thread cannot even get there (still stuck), the process exits with
status 143 (128 + SIGTERM).
The handler and the wakeup fd are installed with the first guard and given
back, if still ours, with the last.

While the main thread is inside :meth:`SigtermGuard.deferred` (holding a
snapshot lock), a SIGTERM handled there is postponed until it lets go — the
actions need that lock; the watcher simply waits for it.  If another library
already owns the wakeup fd (asyncio does), only the main-thread handler is
used, and a warning says so; a second or third Checkpointer is no reason for one.
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
    """One emergency action, run at most once on SIGTERM while the guard is installed."""

    def __init__(self, action: Callable[[], None], exit_after: float = 1.0) -> None:
        self._action = action
        self.exit_after = exit_after
        self._run_lock = threading.Lock()
        self._done = threading.Event()
        self._started = False

    def install(self) -> bool:
        """Register with the process's SIGTERM handler; returns False (and does nothing) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("kcover checkpoint: not in the main thread, no emergency save on SIGTERM")
            return False
        _dispatcher.add(self)
        return True

    def uninstall(self) -> None:
        """Unregister (from any thread); the last guard gives the handler and wakeup fd back."""
        _dispatcher.remove(self)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Postpone a SIGTERM handled by the main thread until the block ends (no-op in other threads)."""
        with _dispatcher.deferred():
            yield

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


class _Dispatcher:
    """The process's one SIGTERM handler, wakeup fd and watcher, shared by every installed guard."""

    def __init__(self) -> None:
        self._guards: list[SigtermGuard] = []
        self._guards_lock = threading.Lock()
        self._installed = False
        self._previous: _Handler = None
        self._pipe: tuple[int, int] | None = None
        self._main_entered = threading.Event()
        self._deferring = 0  # nesting depth of deferred() in the main thread
        self._pending: tuple[int, FrameType | None] | None = None

    def add(self, guard: SigtermGuard) -> None:
        """In the main thread: register ``guard``, installing the handler and wakeup fd with the first."""
        with self._guards_lock:
            self._guards.append(guard)
        if not self._installed:
            self._install()
        elif self._pipe is not None:
            self._check_wakeup_fd()

    def remove(self, guard: SigtermGuard) -> None:
        with self._guards_lock:
            if guard in self._guards:
                self._guards.remove(guard)
            last = not self._guards
        if last and self._installed and threading.current_thread() is threading.main_thread():
            self._uninstall()

    def _install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        self._installed = True
        self._main_entered.clear()
        read, write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if old != -1:
            signal.set_wakeup_fd(old)
            os.close(read)
            os.close(write)
            _warn_taken()
            return
        self._pipe = (read, write)
        os.set_blocking(read, True)
        threading.Thread(target=self._watch, args=(read,), name="kcover-sigterm", daemon=True).start()

    def _check_wakeup_fd(self) -> None:
        """Another library may have taken the wakeup fd since we installed ours: then say so, and leave it."""
        assert self._pipe is not None
        ours = self._pipe[1]
        old = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)
        if old != ours:
            signal.set_wakeup_fd(old)
            _warn_taken()

    def _uninstall(self) -> None:
        if signal.getsignal(signal.SIGTERM) == self._on_signal:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
        if self._pipe is not None:
            ours = self._pipe[1]
            old = signal.set_wakeup_fd(-1)
            if old != ours:  # someone else's since: leave it to them
                signal.set_wakeup_fd(old)
            os.close(ours)  # the watcher sees EOF and ends; it closes the read end
            self._pipe = None
        self._installed = False

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
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

    def _run_all(self) -> None:
        """Every registered guard's action, in parallel (each persist waits for its own disk), once each."""
        with self._guards_lock:
            guards = list(self._guards)
        threads = []
        for guard in guards[1:]:
            thread = threading.Thread(target=guard.run_once, name="kcover-emergency", daemon=True)
            try:
                thread.start()
                threads.append(thread)
            except RuntimeError:  # no new threads at interpreter shutdown: run it here
                guard.run_once()
        if guards:
            guards[0].run_once()
        for thread in threads:
            thread.join()

    def _exit_after(self) -> float:
        with self._guards_lock:
            return max((guard.exit_after for guard in self._guards), default=1.0)

    def _watch(self, read: int) -> None:
        if not _wait_for_sigterm(read):
            return
        self._run_all()
        if self._main_entered.wait(self._exit_after()):
            return
        if self._previous in (signal.SIG_DFL, None):
            log.warning("kcover checkpoint: main thread busy in native code; exiting after the emergency save")
            _exit_as_sigterm()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._main_entered.set()
        if self._deferring:
            self._pending = (signum, frame)
            return
        self._run_all()
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            if os.getpid() == 1:
                # The init of a PID namespace (a container's command): the kernel drops a signal left at its
                # default for it.  End as SIGTERM ends anyone else, or the pod lingers until the kubelet's
                # SIGKILL at the end of the grace period.
                _exit_as_sigterm()


def _exit_as_sigterm() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + signal.SIGTERM)


def _wait_for_sigterm(read: int) -> bool:
    """Read the wakeup pipe until SIGTERM shows up (True) or it is closed (False); closes ``read``."""
    try:
        while True:
            try:
                data = os.read(read, 64)
            except InterruptedError:
                continue
            if not data:
                return False
            if signal.SIGTERM in data:
                return True
    except OSError:
        return False
    finally:
        os.close(read)


def _warn_taken() -> None:
    log.warning("kcover checkpoint: the signal wakeup fd is taken (asyncio?); the emergency save on "
                "SIGTERM runs only when the main thread is free")


_dispatcher = _Dispatcher()
