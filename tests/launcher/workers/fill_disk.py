"""Writes enough output to fill a small state dir, then reports progress, then (optionally) a GPU fault.

FILL_BYTES: how much to print first (default 3 MB); PID_DIR: where to leave ``rank<R>.pid``;
THEN: ``exit`` (exit 0 after ``step 7``) or ``xid`` (rank 0 prints an Xid line, every rank then waits).
"""
import os
import sys
import time
from pathlib import Path

rank = int(os.environ["RANK"])
Path(os.environ["PID_DIR"], f"rank{rank}.pid").write_text(str(os.getpid()))
line = "x" * 99 + "\n"
for _ in range(int(os.environ.get("FILL_BYTES", "3000000")) // len(line)):
    sys.stdout.write(line)
sys.stdout.flush()
print("step 7 loss 1.0", flush=True)
if os.environ.get("THEN", "exit") == "xid":
    if rank == 0:
        xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
        print(xid, file=sys.stderr, flush=True)
    time.sleep(120)
