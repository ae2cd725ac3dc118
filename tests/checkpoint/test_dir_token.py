"""Every rank agrees on the checkpoint dir's id, even when their processes have the same pid.

In containers every rank's trainer has a small pid, often the same one (pid 1 in
each pod's namespace), and they share the dir over a network filesystem or a
hostPath.  The id was created through a temporary file named after the pid: two
ranks wrote the same temporary file, one linked and removed it, the other found
it gone and went on with no id — so its snapshots and replicas were not of "this
dir" for the others, and a replacement rank on a new node started from scratch
although its buddy held its step (found in the real-node peer-replica test).
Here the ranks are real processes, each pid 1 in a pid namespace of its own
(``unshare``, as root), all reading a fresh dir's id at once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcover.checkpoint.locations import dir_token

RANKS = 3
DIRS = 100
# One process per rank (kcover.checkpoint imports torch: a process per try would not fit two cores); for each
# dir every rank says it is ready, then all read its id at once, when the test says go.
READ_IDS = """
import os, sys, time
from pathlib import Path
from kcover.checkpoint.locations import dir_token
root, rank, dirs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
for n in range(dirs):
    (root / f"ready-{n}-{rank}").touch()
    while not (root / f"go-{n}").exists():
        time.sleep(0.0002)
    print(n, dir_token(root / f"ckpt-{n}"), os.getpid(), flush=True)
"""


def wait_for(path: Path, ranks: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline and all(r.poll() is None for r in ranks), f"no {path.name}"
        time.sleep(0.0002)


def can_unshare() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not can_unshare(), reason="needs root and unshare (pid namespaces)")
def test_ranks_with_the_same_pid_agree_on_one_id(tmp_path: Path) -> None:
    ranks = [subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", READ_IDS, str(tmp_path), str(rank),
                               str(DIRS)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(RANKS)]
    try:
        for n in range(DIRS):
            for rank in range(RANKS):
                wait_for(tmp_path / f"ready-{n}-{rank}", ranks)
            (tmp_path / f"go-{n}").touch()
        said = [rank.communicate(timeout=60) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()
    found: dict[str, set[str]] = {}
    for out, err in said:
        assert "ignoring" not in err, err
        for line in out.splitlines():
            n, token, pid = line.split()
            assert pid == "1"
            found.setdefault(n, set()).add(token)
    assert {n: len(tokens) for n, tokens in found.items()} == {str(n): 1 for n in range(DIRS)}
    assert all(tokens == {dir_token(tmp_path / f"ckpt-{n}")} for n, tokens in found.items())
    assert not [p for n in range(DIRS) for p in (tmp_path / f"ckpt-{n}").iterdir() if p.name != ".kcover-id"]


def test_the_id_is_created_once_and_kept(tmp_path: Path) -> None:
    first = dir_token(tmp_path / "new")
    assert first.isalnum() and len(first) == 16
    assert dir_token(tmp_path / "new") == first
    assert [p.name for p in (tmp_path / "new").iterdir()] == [".kcover-id"]
