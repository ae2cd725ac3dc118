"""Rank 1 prints a real Xid line and dies with a CUDA error; the others wait in a fake collective."""
import os
import sys
import time

rank = int(os.environ["RANK"])
for step in range(3):
    print(f"step {step} loss 1.0", flush=True)
    time.sleep(0.05)
if rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
    print(xid, file=sys.stderr, flush=True)
    print("RuntimeError: CUDA error: unspecified launch failure", file=sys.stderr, flush=True)
    sys.exit(1)
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    time.sleep(60)
print("done", flush=True)
