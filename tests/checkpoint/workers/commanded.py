"""A Checkpointer in its own process, driven line by line over stdin: a writer, a reader or a rival.

Usage: ``commanded.py DIR SHM``.  Commands (one a line; each answered with one
line, ``ok …`` or ``error <ExceptionClass>: <message>``): ``reserve SCALE``
(reserve the buffer for ``make_state(0, SCALE)`` and wait for it), ``save N
[SCALE]`` (snapshot ``make_state(N, SCALE)`` and persist it), ``memory N
[SCALE]`` (the same, memory only), ``load`` (answers ``ok <step or None>``),
``close``.  Any exception is reported, never fatal, so
the test sees what the training loop would have seen.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from tests.checkpoint.states import make_state

from kcover.checkpoint import Checkpointer


def run(checkpointer: Checkpointer, command: str, argument: str) -> str:
    numbers = [int(word) for word in argument.split()]
    if command == "reserve":
        checkpointer.reserve(make_state(0, numbers[0]))
        time.sleep(1)  # the reservation runs on a background thread
        return "ok"
    if command in ("save", "memory"):
        state = make_state(numbers[0], *numbers[1:])
        saved = checkpointer.save(numbers[0], state, persist=command == "save")
        checkpointer.wait()
        return f"ok {saved} {checkpointer.last_error}"
    if command == "load":
        restored = checkpointer.load_latest()
        return f"ok {None if restored is None else restored.step}"
    checkpointer.close()
    return "ok"


def main() -> None:
    torch.set_num_threads(1)
    checkpointer = Checkpointer(sys.argv[1], shared_memory=sys.argv[2], rank=0, world_size=1)
    print("ready", flush=True)
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        try:
            answer = run(checkpointer, command, argument)
        except Exception as exc:  # reported to the test: it is what the training loop would have got
            answer = f"error {type(exc).__name__}: {exc}"
        print(answer, flush=True)


if __name__ == "__main__":
    main()
