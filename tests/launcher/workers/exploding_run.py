"""``kcover run``'s supervisor with a reporter that raises (argv: the event kind, the state dir, the worker).

Run as its own process by ``test_supervision_errors.py``: the supervisor makes its
process a subreaper and stops every child it adopted, which in pytest's process would
be the session's test cluster.  Prints the run's ``--json`` document and the pids of
the workers still alive after the run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psutil

from kcover.launcher.reporting import run_document
from kcover.launcher.spec import RunSpec
from kcover.launcher.supervisor import Supervisor


class ExplodingReporter:
    """Raises on the first event of kind ``on`` (``progress`` for a progress report)."""

    def __init__(self, on: str) -> None:
        self.on = on

    def event(self, kind: str, text: str) -> None:
        if kind == self.on:
            raise RuntimeError(f"reporter exploded on {kind}")

    def progress(self, rank: int, step: int) -> None:
        self.event("progress", str(step))


def live_workers(worker: str) -> list[int]:
    """Workers still running: as kcover made this process a subreaper, even escaped ones are its descendants."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if process.status() != psutil.STATUS_ZOMBIE and worker in " ".join(process.cmdline()):
                found.append(process.pid)
        except psutil.Error:
            continue
    return found


def main() -> None:
    on, state_dir, worker = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    spec = RunSpec(command=(sys.executable, worker), nproc_per_node=2, state_dir=state_dir, grace_period=1.0,
                   echo=False)
    result = Supervisor(spec, reporter=ExplodingReporter(on)).run()
    print(json.dumps({"status": result.status, "reason": result.reason, "exit_code": result.exit_code,
                      "document": run_document(result), "alive": live_workers(Path(worker).name)}))


if __name__ == "__main__":
    main()
