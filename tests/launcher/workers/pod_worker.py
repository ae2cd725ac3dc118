"""A worker for ``kcover pod``'s tests: says its generation and port, reports steps, does what files say.

In ``POD_TEST_DIR``: it writes ``pid-<rank>-<generation>``; rank 0 kills itself
with SIGKILL when ``fail-<generation>`` exists; every rank exits 0 when ``finish``
exists; with ``FLOOD`` set, rank 0 first writes junk and 100,000 timings of random steps to the
progress pipe.  Every step it reports its compute time (rank r: 0.01 × (r + 1) s), every 20th a
complete checkpoint.  SIGTERM is answered after ``TERM_SECONDS`` (an emergency checkpoint's time), with
exit 143.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from kcover import sdk

folder = Path(os.environ["POD_TEST_DIR"])
generation, rank = os.environ["KCOVER_GENERATION"], os.environ["RANK"]
(folder / f"pid-{rank}-{generation}").write_text(str(os.getpid()))


def on_term(_signum: int, _frame: FrameType | None) -> None:
    time.sleep(float(os.environ.get("TERM_SECONDS", "0")))
    print(f"worker rank={rank} saved on SIGTERM", flush=True)
    sys.exit(143)


signal.signal(signal.SIGTERM, on_term)
# said once SIGTERM is answered: a test that waits for this line may stop the worker at once
print(f"worker rank={rank} generation={generation} port={os.environ['MASTER_PORT']} "
      f"world={os.environ['WORLD_SIZE']}", flush=True)
if rank == "0" and os.environ.get("FLOOD"):  # a hostile script: junk and timings of random steps on the pipe
    fd, junk = int(os.environ["KCOVER_PROGRESS_FD"]), random.Random(3)
    os.write(fd, b"x" * (1 << 20) + b"\n" + b"time 1 nan\ntime -5 0.1\ntime 7 -1\nckpt\n\n\n")
    for _ in range(20):
        os.write(fd, b"".join(b"time %d 0.1\n" % junk.randrange(10**15) for _ in range(5000)))
    print("worker rank=0 flooded", flush=True)
step = 0
while True:
    step += 1
    sdk.progress(step)
    sdk.step_time(0.01 * (1 + int(rank)), step)  # rank 1 computes twice as long as rank 0
    if step % 20 == 0:
        sdk.checkpointed(step)
    if rank == "0" and (folder / f"fail-{generation}").exists():
        os.kill(os.getpid(), signal.SIGKILL)
    if (folder / "finish").exists():
        sys.exit(0)
    time.sleep(0.05)
