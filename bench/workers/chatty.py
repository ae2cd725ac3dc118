"""Benchmark worker: logs LINES_PER_SECOND lines per second for SECONDS seconds, then exits 0."""
import os
import sys
import time

rate = float(os.environ.get("LINES_PER_SECOND", "1250"))
seconds = float(os.environ.get("SECONDS_TO_RUN", "10"))
line = "[2024-05-01 10:00:00,123] [INFO] [trainer.py:612] iteration {i}/250000 | lm loss: 2.114E+00 | grad norm: 0.4\n"
began = time.monotonic()
i = 0
batch = max(1, int(rate / 100))
while time.monotonic() - began < seconds:
    sys.stdout.write("".join(line.format(i=i + k) for k in range(batch)))
    sys.stdout.flush()
    i += batch
    target = began + i / rate
    delay = target - time.monotonic()
    if delay > 0:
        time.sleep(delay)
