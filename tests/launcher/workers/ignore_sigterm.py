"""Rank 0 crashes; every other rank ignores SIGTERM and must be SIGKILLed after the grace period."""
import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("step 0", flush=True)
if os.environ["RANK"] == "0":
    time.sleep(0.3)
    print("RuntimeError: CUDA error: an illegal memory access was encountered", file=sys.stderr, flush=True)
    sys.exit(1)
time.sleep(3600)
