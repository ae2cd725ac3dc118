"""Reports a step every 50 ms until stopped (at most STEPS_SECONDS, default 60 s); leaves its pid in PID_DIR if set."""
import os
import time
from pathlib import Path

if "PID_DIR" in os.environ:
    Path(os.environ["PID_DIR"], f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
began = time.monotonic()
step = 0
while time.monotonic() - began < float(os.environ.get("STEPS_SECONDS", "60")):
    print(f"rank {os.environ['RANK']} step {step}", flush=True)
    step += 1
    time.sleep(0.05)
