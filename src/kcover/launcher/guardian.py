"""The guardian of one ``kcover run``: when the launcher dies, nothing it started survives it.

``PR_SET_PDEATHSIG`` takes each worker along when the launcher is killed
(``kill -9``), but not the workers' own children, and a child that double-forks
or calls ``setsid`` is out of reach of any signal we could arm.  So the launcher
starts this small process first, in a session of its own, reading a pipe whose
only writer is the launcher, which never writes.  When the launcher ends,
normally or by SIGKILL, the kernel closes that pipe; the guardian reads
end-of-file and SIGKILLs every process whose environment carries the launcher's
mark (``KCOVER_LAUNCHER=<pid>:<start time>``, given to each worker and inherited
by whatever it starts), round after round until none is left, then exits.  A
process that wipes its environment escapes it.

It runs as a script (``python -I guardian.py MARK``) and imports only the
standard library, so that it starts in milliseconds and never loads kcover.
"""

from __future__ import annotations

import os
import signal
import sys
import time

MARK_VARIABLE = b"KCOVER_LAUNCHER"
ROUNDS = 200
PAUSE = 0.01


def marked(mark: bytes) -> list[int]:
    """Pids of live processes whose environment holds ``KCOVER_LAUNCHER=<mark>``."""
    wanted = b"\0" + MARK_VARIABLE + b"=" + mark + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid() and wanted in _environment(name):
            found.append(int(name))
    return found


def _environment(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return b"\0" + environ.read()
    except OSError:
        return b""


def sweep(mark: bytes) -> int:
    """SIGKILL every marked process, again until a round finds none; returns how many were signalled."""
    killed = 0
    for _ in range(ROUNDS):
        pids = marked(mark)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                continue
        time.sleep(PAUSE)
    return killed


def wait_for_end_of_file(fd: int) -> None:
    """Block until every writer of ``fd`` is gone (the launcher never writes)."""
    while os.read(fd, 4096):
        continue


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: guardian.py PID:START", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    wait_for_end_of_file(sys.stdin.fileno())
    sweep(argv[1].encode())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
