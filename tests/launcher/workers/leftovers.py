"""A worker that leaves a background child (like `sleep 4242 &`) and a double-forked setsid daemon, then exits 0.

Their pids go to $PID_DIR/rank<R>.pids once both are running."""
import os
import subprocess
import sys
import time
from pathlib import Path

background = subprocess.Popen(["sleep", "4242"])
read_end, write_end = os.pipe()
if os.fork() == 0:
    os.setsid()
    daemon = os.fork()
    if daemon == 0:
        os.execvp("sleep", ["sleep", "4243"])
    os.write(write_end, str(daemon).encode())
    os._exit(0)
os.close(write_end)
daemon_pid = os.read(read_end, 64).decode()
os.wait()
folder = Path(os.environ["PID_DIR"])
(folder / f"rank{os.environ['RANK']}.tmp").write_text(f"{background.pid} {daemon_pid}")
(folder / f"rank{os.environ['RANK']}.tmp").rename(folder / f"rank{os.environ['RANK']}.pids")
print("step 0", flush=True)
time.sleep(0.2)
sys.exit(0)
