"""A worker that writes its pid (and its children's) to $PID_DIR, then sleeps; CHILDREN=1 also forks a child
in its own group and a setsid'ed daemon, both sleeping."""
import os
import subprocess
import sys
import time
from pathlib import Path

here = os.path.abspath(__file__)
if len(sys.argv) > 1 and sys.argv[1] == "child":
    time.sleep(3600)
    sys.exit(0)
pids = [os.getpid()]
if os.environ.get("CHILDREN") == "1":
    pids.append(subprocess.Popen([sys.executable, here, "child"]).pid)
    pids.append(subprocess.Popen([sys.executable, here, "child"], start_new_session=True).pid)
folder = Path(os.environ["PID_DIR"])
(folder / f"rank{os.environ['RANK']}.tmp").write_text(" ".join(map(str, pids)))
(folder / f"rank{os.environ['RANK']}.tmp").rename(folder / f"rank{os.environ['RANK']}.pids")
print("step 0", flush=True)
time.sleep(3600)
