"""Rank 1 dies of an error no catalog rule names (a bare ``Exception``); the other ranks keep training."""
import os
import time

rank = int(os.environ["RANK"])
for step in range(3):
    print(f"rank {rank} step {step} loss 2.0", flush=True)
if rank == 1:
    raise Exception("dataset shard 17 is unreadable")
time.sleep(60)
