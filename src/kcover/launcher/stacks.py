"""Python stacks of hung workers, for the evidence of a hang.

When an attempt hangs, the supervisor saves where every running worker is stuck
(``<attempt dir>/stacks.txt``) before stopping them, using ``py-spy dump``
where it is installed (on ``PATH`` or beside the Python interpreter).  Without
py-spy nothing is captured and the hang is still reported.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from kcover.launcher.workers import WorkerGroup


def capture_stacks(group: WorkerGroup, path: Path) -> int:
    """Python stacks of every running worker via py-spy (if installed); returns how many."""
    beside = Path(sys.executable).parent / "py-spy"
    spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if spy is None:
        return 0
    captured = 0
    with path.open("w") as out:
        for worker in group.running:
            try:
                done = subprocess.run([spy, "dump", "--pid", str(worker.pid)], capture_output=True, text=True,
                                      timeout=15, check=False)
            except subprocess.TimeoutExpired:
                continue
            out.write(f"=== rank {worker.rank} ({worker.node}) pid {worker.pid}\n{done.stdout}{done.stderr}\n")
            captured += done.returncode == 0
    return captured
