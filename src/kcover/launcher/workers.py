"""Worker processes: started as process groups, stopped with escalation, never left behind.

Each worker runs in its own session (so its process group holds it and every
child it forks), with the environment ``torchrun`` gives plus ``KCOVER_*``
variables.  :meth:`WorkerGroup.stop` sends SIGTERM to every group and every
known descendant, waits the grace period (workers may write an emergency
checkpoint), then SIGKILLs what is left.  The launcher makes itself a child
subreaper, so grandchildren that escape their group by ``setsid`` are re-parented
to it, found, killed and reaped: no orphan or zombie survives.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux); returns False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class WorkerSpec:
    """Everything needed to start one worker."""

    rank: int
    local_rank: int
    node: str
    group_rank: int
    command: Sequence[str]
    env: Mapping[str, str]
    cwd: Path | None = None


@dataclass
class Worker:
    """A running worker: its process and its output pipes."""

    spec: WorkerSpec
    process: subprocess.Popen[bytes]
    progress_read: int
    started: float
    exit_code: int | None = None
    exited_at: float | None = None
    descendants: set[int] = field(default_factory=set)

    @property
    def rank(self) -> int:
        return self.spec.rank

    @property
    def node(self) -> str:
        return self.spec.node

    @property
    def pid(self) -> int:
        return self.process.pid


class LaunchError(RuntimeError):
    """The command could not be started (not found, not executable)."""


def start_worker(spec: WorkerSpec) -> Worker:
    """Start one worker in a new session, with a pipe for ``kcover.progress``."""
    progress_read, progress_write = os.pipe()
    env = dict(spec.env)
    env["KCOVER_PROGRESS_FD"] = str(progress_write)
    try:
        process = subprocess.Popen(
            list(spec.command),
            env=env,
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(progress_write,),
        )
    except OSError as exc:
        os.close(progress_read)
        raise LaunchError(f"cannot start {spec.command[0]!r}: {exc.strerror or exc}") from None
    finally:
        os.close(progress_write)
    os.set_blocking(progress_read, False)
    return Worker(spec=spec, process=process, progress_read=progress_read, started=time.monotonic())


class WorkerGroup:
    """All workers of one attempt, stopped together."""

    def __init__(self, workers: Sequence[Worker]) -> None:
        self.workers = list(workers)

    def poll(self) -> list[Worker]:
        """Workers that exited since the last poll (their ``exit_code`` set)."""
        ended = []
        for worker in self.workers:
            if worker.exit_code is None:
                code = worker.process.poll()
                if code is not None:
                    worker.exit_code = code
                    worker.exited_at = time.monotonic()
                    ended.append(worker)
        return ended

    @property
    def running(self) -> list[Worker]:
        return [w for w in self.workers if w.exit_code is None]

    def _remember_descendants(self) -> None:
        for worker in self.running:
            with contextlib.suppress(psutil.Error):
                worker.descendants.update(c.pid for c in psutil.Process(worker.pid).children(recursive=True))

    def _signal_all(self, sig: int) -> None:
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.pid, sig)
            for pid in worker.descendants:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def stop(self, grace: float) -> float:
        """SIGTERM everything, wait up to ``grace`` seconds, then SIGKILL; returns seconds taken."""
        began = time.monotonic()
        self._remember_descendants()
        self._signal_all(signal.SIGCONT)
        self._signal_all(signal.SIGTERM)
        deadline = began + grace
        while time.monotonic() < deadline and (self.running or _alive(self._all_descendants())):
            self.poll()
            time.sleep(0.02)
        self._remember_descendants()
        self._signal_all(signal.SIGKILL)
        for worker in self.workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(timeout=5)
        self.poll()
        reap_orphans()
        return time.monotonic() - began

    def _all_descendants(self) -> set[int]:
        return {pid for worker in self.workers for pid in worker.descendants}

    def close(self) -> None:
        for worker in self.workers:
            for stream in (worker.process.stdout, worker.process.stderr):
                if stream is not None:
                    stream.close()
            with contextlib.suppress(OSError):
                os.close(worker.progress_read)


def _alive(pids: Iterable[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def reap_orphans() -> None:
    """Kill and reap adopted descendants (we are their subreaper); never blocks."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return

