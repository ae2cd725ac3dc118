"""A warm worker: a Python process that has imported the heavy modules and waits to become a rank.

``kcover pod`` starts one per rank ahead of the next generation
(:mod:`kcover.launcher.warm`): ``python zygote.py torch,torch._dynamo`` imports
those modules (a module this environment lacks is skipped), then blocks on the
pipe named by ``KCOVER_ZYGOTE_FD``.  When a restart comes, ``kcover pod`` writes
one JSON order there — the environment, the working directory, and either a
script or a module with its arguments — and this process becomes that worker:
it takes the order's environment (keeping its own progress pipe and launcher
mark), sets ``sys.argv`` and ``sys.path`` as ``python script.py`` or ``python
-m module`` would, and runs it as ``__main__``.  An import of torch that took
seconds has already happened.  A pipe closed without an order ends it quietly.

It is run by path with the worker's own interpreter and imports nothing of
kcover, so it works wherever the training command's Python does.  Once it has
its order it names itself after the script or module (``/proc/PID/comm``), so
``ps`` and ``top`` show the worker as what it runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import runpy
import sys

KEEP = ("KCOVER_PROGRESS_FD", "KCOVER_PROGRESS_PIPE", "KCOVER_LAUNCHER")
PR_SET_NAME = 15
"""This process's own variables, kept whatever the order's environment says."""


def _preload(names: str) -> None:
    for name in [n for n in names.split(",") if n]:
        try:
            __import__(name)
        except Exception:  # a module this environment lacks: the script imports what it needs
            continue


def _read_order(descriptor: int) -> dict[str, object] | None:
    with os.fdopen(descriptor, "rb") as pipe:
        data = pipe.read()
    if not data:
        return None
    order = json.loads(data)
    return order if isinstance(order, dict) else None


def name_process(target: str) -> None:
    """Show the worker under its own name (``ps``, ``top``): the script's or the module's last part."""
    name = os.path.basename(target) if target.endswith(".py") else target.rsplit(".", 1)[-1]
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        del sys.path[0]  # never let this folder's modules shadow the script's imports
    descriptor = int(os.environ.pop("KCOVER_ZYGOTE_FD"))
    _preload(sys.argv[1] if len(sys.argv) > 1 else "")
    order = _read_order(descriptor)
    if order is None:
        sys.exit(0)
    kept = {name: os.environ[name] for name in KEEP if name in os.environ}
    environment = order.get("env")
    if isinstance(environment, dict):
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in environment.items()})
    os.environ.update(kept)
    cwd = order.get("cwd")
    if isinstance(cwd, str) and cwd:
        os.chdir(cwd)
    target, arguments = str(order["target"]), [str(a) for a in order.get("args", [])]  # type: ignore[attr-defined]
    name_process(target)
    if order.get("kind") == "module":
        sys.argv = [target, *arguments]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *arguments]
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main()
