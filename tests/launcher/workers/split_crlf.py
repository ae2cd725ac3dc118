"""Windows line endings whose \\r and \\n reach kcover in two reads, then a user bug."""
import sys
import time

out = sys.stdout.buffer
for step in range(3):
    out.write(f"step {step} loss 2.0\r".encode())
    out.flush()
    time.sleep(0.2)  # kcover reads the \r alone
    out.write(b"\n")
    out.flush()
out.write(b"KeyError: 'labels'\r\n")
out.flush()
sys.exit(1)
