"""SIGKILL a saving process at random moments, ROUNDS times; after each kill a new process must restore.

Usage: ``kill_loop.py DIR SHM_DIR ROUNDS SEED``.  This parent imports torch but
runs no torch op, so forking it is safe and cheap; each round forks a *saver*
(restores the newest checkpoint, as a restarted worker does, then saves step
after step, persisting each) and kills it with SIGKILL after a random delay,
then forks a *verifier* that restores twice — from shared memory when it is
newest, and from disk alone — and checks every value against the state of the
step it got.  Prints one JSON line: rounds, restores by source, failures.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.checkpoint.states import assert_state, make_state

from kcover.checkpoint import Checkpointer

SCALE = 64  # about 1 MB of tensors per save


def fork(child: object, *args: object) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = child(*args)  # type: ignore[operator]
        except BaseException as exc:
            print(f"child failed: {exc!r}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)
    return pid


def saver(directory: str, shm: str, ready: int, first: bool) -> int:
    import torch

    torch.set_num_threads(1)
    checkpointer = Checkpointer(directory, shared_memory=shm, emergency_save=False, keep_last=2)
    restored = checkpointer.load_latest()
    step = restored.step + 1 if restored is not None else 0
    restored = None
    os.write(ready, b"r")
    while True:
        checkpointer.save(step, make_state(step, SCALE))
        if first:
            checkpointer.close()
            return 0
        step += 1


def verifier(directory: str, shm: str, report: int) -> int:
    import torch

    torch.set_num_threads(1)
    sources = []
    for shared in (shm, None):
        checkpointer = Checkpointer(directory, shared_memory=shared, emergency_save=False, keep_last=2)
        restored = checkpointer.load_latest()
        assert restored is not None, "no checkpoint restored"
        assert_state(restored.state, make_state(restored.step, SCALE))
        sources.append(f"{restored.source}:{restored.step}")
        restored = None
        checkpointer.close()
    os.write(report, (" ".join(sources) + "\n").encode())
    return 0


def wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> None:
    directory, shm, rounds, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    ready_read, ready_write = os.pipe()
    report_read, report_write = os.pipe()
    assert wait(fork(saver, directory, shm, ready_write, True)) == 0  # step 0, persisted
    os.read(ready_read, 1)
    failures, sources, steps = [], {"memory": 0, "disk": 0}, []
    began = time.monotonic()
    for round_ in range(rounds):
        pid = fork(saver, directory, shm, ready_write, False)
        os.read(ready_read, 1)
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(pid, signal.SIGKILL)
        if wait(pid) != -signal.SIGKILL:
            failures.append(f"round {round_}: saver ended before the kill")
        if wait(fork(verifier, directory, shm, report_write)) != 0:
            failures.append(f"round {round_}: verification failed")
            continue
        line = b""
        while not line.endswith(b"\n"):
            line += os.read(report_read, 4096)
        first, second = line.decode().split()
        sources[first.split(":")[0]] += 1
        steps.append(int(first.split(":")[1]))
        if not second.startswith("disk:"):
            failures.append(f"round {round_}: disk-only restore came from {second}")
    print(json.dumps({"rounds": rounds, "sources": sources, "failures": failures, "steps": steps,
                      "seconds": round(time.monotonic() - began, 1)}), flush=True)


if __name__ == "__main__":
    main()
