"""Writes 1 MB lines, then a CUDA OOM on rank 1 (in the first attempt only)."""
import os
import sys

for _ in range(3):
    sys.stdout.write("x" * 1_000_000 + "\n")
sys.stdout.flush()
print("step 1", flush=True)
if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.stderr.write("y" * 1_000_000 + " torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    sys.exit(1)
