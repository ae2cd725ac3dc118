"""Benchmark worker: records when it started; rank 3 fails in the first attempt(s), recording when.

Attempt number comes from TORCHELASTIC_RESTART_COUNT (set by torchrun and by kcover alike).
FAIL_ATTEMPTS=N makes rank 3 fail in the first N attempts; the fault line carries nothing
kcover-specific, and the times go to $BENCH_DIR.
"""
import os
import sys
import time

started = time.time()
rank = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
out = os.environ["BENCH_DIR"]
with open(f"{out}/start-{attempt}-{rank}", "w") as f:
    f.write(repr(started))
if rank == 3 and attempt < int(os.environ.get("FAIL_ATTEMPTS", "1")):
    time.sleep(0.3)
    with open(f"{out}/fail-{attempt}", "w") as f:
        f.write(repr(time.time()))
    print("RuntimeError: CUDA error: an illegal memory access was encountered", file=sys.stderr, flush=True)
    sys.exit(1)
if attempt < int(os.environ.get("FAIL_ATTEMPTS", "1")):
    time.sleep(30)
