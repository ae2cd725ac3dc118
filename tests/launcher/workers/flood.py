"""Writes FLOOD_BYTES (default 4 MiB) of 64-byte lines to stdout in one go, then sleeps until stopped."""
import os
import sys
import time

line = b"x" * 63 + b"\n"
sys.stdout.buffer.write(line * (int(os.environ.get("FLOOD_BYTES", str(4 << 20))) // len(line)))
sys.stdout.buffer.flush()
time.sleep(600)
