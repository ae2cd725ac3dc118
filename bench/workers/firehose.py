"""Benchmark worker: writes MEGABYTES of training-log lines as fast as it can, LINES_PER_WRITE lines per write.

Records how long its own writing took (first write to last flush) in ``BENCH_OUT/rank<R>.seconds``, so the
benchmark compares the writer's time under ``kcover run`` with its time into a plain pipe.
"""
import os
import sys
import time
from pathlib import Path

total = float(os.environ.get("MEGABYTES", "50")) * 1e6
per_write = int(os.environ.get("LINES_PER_WRITE", "1"))
line = "[2024-05-01 10:00:00,123] [INFO] [trainer.py:612] iteration {i}/250000 | lm loss: 2.114E+00 | grad norm: 0.4\n"
write = sys.stdout.write
began = time.perf_counter()
written = 0
i = 0
while written < total:
    text = "".join(line.format(i=i + k) for k in range(per_write))
    write(text)
    written += len(text)
    i += per_write
sys.stdout.flush()
seconds = time.perf_counter() - began
Path(os.environ["BENCH_OUT"], f"rank{os.environ.get('RANK', '0')}.seconds").write_text(f"{seconds}\n")
