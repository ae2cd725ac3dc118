"""Worker processes: started as process groups, stopped with escalation, never left behind.

Each worker runs in its own session (so its process group holds it and every
child it forks), with the environment ``torchrun`` gives plus ``KCOVER_*``
variables, and kcover's step timer first on ``PYTHONPATH``
(:func:`with_auto_timing`).  :meth:`WorkerGroup.stop` sends SIGTERM to every group and every
known descendant, waits the grace period (workers may write an emergency
checkpoint), then SIGKILLs what is left; it runs after a successful attempt too,
so a background child or a daemon a worker left behind does not outlive it.
The launcher makes itself a child subreaper, so grandchildren that escape their
group by ``setsid`` are re-parented to it, found, killed and reaped: no orphan
or zombie survives — only in a process that became a subreaper
(:func:`become_subreaper`): in any other (a library user, a test) the other
children belong to someone else and are never stopped nor reaped here; a
stop in a pytest process once took the session's test cluster with it.
Adopted orphans that exit during the run are reaped at
every :meth:`WorkerGroup.poll`, never a worker itself (its ``Popen`` does
that): see :func:`reap_adopted`.

If the launcher itself dies (``kill -9``), each worker gets SIGKILL from the
kernel (``PR_SET_PDEATHSIG``, armed in the child before ``exec``; a worker whose
launcher died before that took effect kills itself), and every process that
carries the launcher's ``KCOVER_LAUNCHER`` mark is killed by the run's guardian
(:mod:`kcover.launcher.guardian`).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import psutil

from kcover.launcher import guardian

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
LAUNCHER_MARK = "KCOVER_LAUNCHER"
"""Environment variable naming the launcher (``pid:start time``) in every worker and its descendants."""

HELPERS: set[int] = set()
"""Children of the launcher that are neither workers nor adopted (the guardian): never killed nor reaped here."""


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


LIBC = _libc()


_ADOPTING = {"on": False}
"""Whether this process became a subreaper: only then are the workers' orphans among its children.  Until then
(a library user, a test process) every other child is someone else's, never stopped nor reaped here."""


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux); returns False where unsupported."""
    try:
        adopted = LIBC is not None and bool(LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except AttributeError:
        adopted = False
    _ADOPTING["on"] = _ADOPTING["on"] or adopted
    return adopted


AUTO_TIMING = Path(__file__).with_name("autotime")
"""The folder of kcover's ``sitecustomize`` (``autotime/sitecustomize.py``): DDP ranks time their own steps."""


def with_auto_timing(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with :data:`AUTO_TIMING` first on ``PYTHONPATH``, unless ``KCOVER_AUTO_TIMING=0`` turns it off."""
    if env.get("KCOVER_AUTO_TIMING", "1") == "0":
        return dict(env)
    path = env.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] == str(AUTO_TIMING):
        return dict(env)
    return {**env, "PYTHONPATH": f"{AUTO_TIMING}{os.pathsep}{path}" if path else str(AUTO_TIMING)}


def load_auto_timing(name: str = "kcover_autotime_loaded") -> ModuleType:
    """kcover's ``sitecustomize`` as a module of this process (for its tests and benchmark): loaded by path, its
    start-up effects (the import hook) run only when Python itself runs it as ``sitecustomize``."""
    spec = importlib.util.spec_from_file_location(name, AUTO_TIMING / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def launcher_mark() -> str:
    """This launcher's identity, ``pid:start time``: a reused pid never matches it."""
    return f"{os.getpid()}:{psutil.Process().create_time():.3f}"


def die_with_launcher() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when the launcher dies.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child ends, so it
    is armed only when forking from the main thread (whose end is the process's
    end); from another thread the guardian alone covers the launcher's death.  A
    launcher that died between ``fork`` and ``prctl`` is caught by the parent pid
    check: the child then kills itself before ``exec``.
    """
    if LIBC is None or threading.current_thread() is not threading.main_thread():
        return None
    prctl, launcher = LIBC.prctl, os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != launcher:
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


@dataclass
class Guardian:
    """The launcher's end of the guardian (:mod:`kcover.launcher.guardian`): release it when the run ends."""

    process: subprocess.Popen[bytes] | None

    def release(self) -> None:
        """Let the guardian sweep (nothing is left on a clean exit) and wait for it; idempotent."""
        if self.process is None:
            return
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:  # stuck: never leave it behind
            self.process.kill()
            self.process.wait()
        HELPERS.discard(self.process.pid)
        self.process = None


def start_guardian() -> Guardian:
    """Start the guardian of this launcher's processes; a no-op guardian where it cannot start."""
    try:
        process = subprocess.Popen([sys.executable, "-I", guardian.__file__, launcher_mark()],
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return Guardian(None)
    HELPERS.add(process.pid)
    return Guardian(process)


def torchrun_env(rank: int, local_rank: int, world: int, local_world: int, group_rank: int, master_addr: str,
                 master_port: int, restarts: int, max_restarts: int, run_id: str) -> dict[str, str]:
    """The variables ``torchrun`` gives each worker, so an unchanged torchrun script runs under kcover."""
    return {
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world), "GROUP_RANK": str(group_rank), "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world), "NODE_RANK": str(group_rank), "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port), "TORCHELASTIC_RESTART_COUNT": str(restarts),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts), "TORCHELASTIC_RUN_ID": run_id, "PYTHONUNBUFFERED": "1",
    }


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


def start_worker(spec: WorkerSpec, capture_output: bool = True, pass_fds: tuple[int, ...] = ()) -> Worker:
    """Start one worker in a new session, with a pipe for ``kcover.progress``; it dies with the launcher.

    Its stdout and stderr are pipes the launcher reads, or (``capture_output`` False: ``kcover pod``, whose
    own output is the container log) the launcher's own.  ``pass_fds`` are further descriptors it inherits
    (a warm worker's order pipe, :mod:`kcover.launcher.warm`).
    """
    progress_read, progress_write = os.pipe()
    pipe = os.fstat(progress_write)
    env = {**with_auto_timing(spec.env), "KCOVER_PROGRESS_FD": str(progress_write),
           "KCOVER_PROGRESS_PIPE": f"{pipe.st_dev}:{pipe.st_ino}", LAUNCHER_MARK: launcher_mark()}
    try:
        process = subprocess.Popen(
            list(spec.command),
            env=env,
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture_output else None,
            stderr=subprocess.PIPE if capture_output else None,
            start_new_session=True,
            pass_fds=(progress_write, *pass_fds),
            preexec_fn=die_with_launcher(),  # noqa: PLW1509 - armed from the main thread only, see there
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
        self.adopted: set[int] = set()
        """Orphans from the workers' trees that the launcher adopted, found when stopping."""

    def poll(self) -> list[Worker]:
        """Workers that exited since the last poll (their ``exit_code`` set); reaps adopted orphans too."""
        ended = []
        for worker in self.workers:
            if worker.exit_code is None:
                code = worker.process.poll()
                if code is not None:
                    worker.exit_code = code
                    worker.exited_at = time.monotonic()
                    ended.append(worker)
        reap_adopted(self._unreaped())
        return ended

    def _unreaped(self) -> set[int]:
        """Pids that someone else waits for: running workers (their ``Popen``) and the helpers."""
        return {w.pid for w in self.workers if w.process.returncode is None} | HELPERS

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
        for pid in self._all_descendants():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def stop(self, grace: float) -> float:
        """SIGTERM everything, wait up to ``grace`` seconds, then SIGKILL; returns seconds taken.

        Also after all workers exited by themselves: their process groups and
        the orphans the launcher adopted from them (background children,
        daemons) get the same treatment.
        """
        began = time.monotonic()
        self._remember_descendants()
        self._remember_adopted()
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
        reap_orphans(self._unreaped())
        return time.monotonic() - began

    def _remember_adopted(self) -> None:
        self.adopted.update(_descendants(self._unreaped()))

    def _all_descendants(self) -> set[int]:
        return {pid for worker in self.workers for pid in worker.descendants} | self.adopted

    def close(self) -> None:
        """Kill whatever still runs (an exit path that skipped :meth:`stop`), then close the pipes."""
        if self.running or _descendants(self._unreaped()):
            self.stop(0)
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


def _descendants(spare: Collection[int]) -> set[int]:
    """The launcher's live descendants outside ``spare`` and the helpers' own subtrees (none unless it adopts)."""
    if not _ADOPTING["on"]:
        return set()
    found = set()
    for child in psutil.Process().children():
        if child.pid in HELPERS:
            continue
        found.add(child.pid)
        with contextlib.suppress(psutil.Error):
            found.update(c.pid for c in child.children(recursive=True))
    return {pid for pid in found if pid not in spare and _alive((pid,))}


def reap_orphans(spare: Collection[int] = ()) -> None:
    """Kill and reap adopted descendants (we are their subreaper); never blocks.

    The helpers and their subtrees are left alone, and ``spare`` (processes whose
    ``Popen`` will wait for them) is killed but never reaped here.
    """
    for pid in _descendants(()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    reap_adopted(set(spare) | HELPERS)


def reap_adopted(spare: Collection[int]) -> int:
    """Reap every exited child of the launcher except ``spare``; returns how many; never blocks.

    A ``waitid(WNOWAIT)`` peek names a waitable child without reaping it: the
    common case (nothing exited) costs one system call.  Only when a spared
    child (a worker whose ``Popen`` has not polled yet) is first in line are the
    children listed and each other one tried in turn.
    """
    reaped = 0
    if not _ADOPTING["on"]:
        return reaped
    while (pid := _waitable_child()) is not None:
        if pid in spare:
            return reaped + sum(_reap(child) for child in _child_pids() if child not in spare)
        if not _reap(pid):
            break
        reaped += 1
    return reaped


def _waitable_child() -> int | None:
    try:
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    return None if info is None else info.si_pid


def _reap(pid: int) -> int:
    """1 if ``pid`` was an exited child and is now reaped, else 0."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 0
    return int(done == pid)


def _child_pids() -> list[int]:
    """Direct children of this process (every thread's), from ``/proc``."""
    try:
        return [child.pid for child in psutil.Process().children()]
    except psutil.Error:
        return []
