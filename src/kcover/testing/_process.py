"""Child processes of the test cluster: start, watch, stop, show their logs.

Each control-plane program (etcd, kube-apiserver, ...) runs as one
:class:`Component`: a child process in its own session (so a Ctrl-C in the
terminal reaches only the Python parent, which then stops the children in
order), its stdout and stderr in one log file, and on Linux a parent-death
signal so that a killed parent does not leave orphans behind. ``stop`` escalates
SIGTERM -> wait -> SIGKILL. Ports come from :func:`kcover.ports.free_port`;
callers retry on another port when a program reports the address is taken.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["Component", "ComponentDiedError", "tail"]

_PR_SET_PDEATHSIG = 1


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec function that asks Linux to SIGKILL the child when we die."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    prctl = libc.prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return preexec


class ComponentDiedError(RuntimeError):
    """A component exited when it should be running; the message holds its last log lines."""

    def __init__(self, name: str, returncode: int | None, log_path: Path, lines: int = 40) -> None:
        self.name = name
        self.returncode = returncode
        self.log_path = log_path
        super().__init__(
            f"test-cluster component {name!r} exited with status {returncode}; "
            f"last lines of {log_path}:\n{tail(log_path, lines)}"
        )


class Component:
    """One program of the cluster, run as a child process with a log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str],
        cwd: Path,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def start(self) -> None:
        self.stopping = False
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent(),  # noqa: PLW1509 - needed for PDEATHSIG
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self) -> None:
        """Raise :class:`ComponentDiedError` if the process has exited (and was not being stopped)."""
        if self.proc is not None and not self.stopping and self.proc.poll() is not None:
            raise ComponentDiedError(self.name, self.proc.returncode, self.log_path)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; always reaps the child."""
        proc = self.proc
        if proc is None:
            return
        self.stopping = True
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            except ProcessLookupError:
                pass
        proc.wait()
