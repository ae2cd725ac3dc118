"""A worker that double-forks $COUNT short-lived children (orphans adopted by kcover), writes
$PID_DIR/forked, then waits for $PID_DIR/done (unless $NO_WAIT) and exits $EXIT_CODE (0)."""
import os
import sys
import time
from pathlib import Path

folder = Path(os.environ["PID_DIR"])
for _ in range(int(os.environ.get("COUNT", "300"))):
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(0.05)
            os._exit(0)
        os._exit(0)
    os.wait()
print("step 0", flush=True)
(folder / "forked").write_text("")
deadline = time.monotonic() + 120
while not os.environ.get("NO_WAIT") and not (folder / "done").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
