"""Each worker forks a child and a setsid'ed grandchild that sleep forever; then rank 0 crashes."""
import os
import subprocess
import sys
import time

here = os.path.abspath(__file__)
if len(sys.argv) > 1 and sys.argv[1] == "sleeper":
    time.sleep(3600)
    sys.exit(0)
subprocess.Popen([sys.executable, here, "sleeper"])
subprocess.Popen([sys.executable, here, "sleeper"], start_new_session=True)
print("step 0", flush=True)
time.sleep(0.5)
if os.environ["RANK"] == "0":
    sys.exit(3)
time.sleep(3600)
