"""Rank 0 floods stdout (up to 200 MB, 64 KiB per write); rank 1, after 0.5 s, reports a step and an Xid line.

Both then wait to be stopped (at most 600 s).  With FAULT=0, rank 1 only reports a step.
"""
import os
import sys
import time

block = (b"x" * 63 + b"\n") * 1024
if os.environ["RANK"] == "0":
    for _ in range(200_000_000 // len(block)):
        sys.stdout.buffer.write(block)
else:
    time.sleep(0.5)
    print("step 3 loss 1.0", flush=True)
    if os.environ.get("FAULT", "1") == "1":
        print("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.", file=sys.stderr,
              flush=True)
time.sleep(600)
