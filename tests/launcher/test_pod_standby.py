"""``kcover pod --assigned-rank``: a warm standby until the operator writes its rank, as a real process.

The test plays the operator and the kubelet: it writes the ``rank`` file beside
the generation file, as the downward API mounts the pod's ``kcover.io/rank``
annotation.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from tests.launcher.test_pod import Pod, alive, pods, start

from kcover.launcher.pod_files import DONE, STANDBY, read_rank
from kcover.podline import PodState

__all__ = ["pods"]  # the fixture, used by name


def spares_of(pod: Pod, count: int = 2) -> set[int]:
    found: set[int] = set()
    deadline = time.monotonic() + 30
    while len(found) < count and time.monotonic() < deadline:
        found = {c.pid for c in psutil.Process(pod.process.pid).children() if "zygote.py" in " ".join(c.cmdline())}
        time.sleep(0.05)
    return found


def test_a_standby_waits_warm_and_runs_the_rank_it_is_given_from_its_warm_workers(pods: list[Pod],
                                                                                   tmp_path: Path) -> None:
    """No rank file yet (the annotation not written): standby, warm workers started at once, no worker; the
    operator's rank and generation (one kubelet write) start the rank's workers from those warm processes."""
    pod = start(pods, tmp_path, "--assigned-rank", "--preload", "json")
    pod.wait_for("state=standby")
    spares = spares_of(pod)
    assert len(spares) == 2, "no warm workers while standing by"
    time.sleep(0.5)
    assert "worker rank=" not in pod.text()
    (tmp_path / "rank").write_text("0")
    pod.file.write_text("3")
    pod.wait_for("worker rank=0 generation=3")
    pod.wait_for("worker rank=1 generation=3")
    reports = pod.reports()
    assert [(g, s) for g, s, _ in reports][:2] == [(0, PodState.STANDBY), (3, PodState.RUNNING)]
    assert reports[1][2].endswith(", 2 warm")
    assert {int((tmp_path / f"pid-{rank}-3").read_text()) for rank in (0, 1)} == spares
    (tmp_path / "finish").touch()
    assert pod.end() == 0


def test_a_standby_the_job_did_not_need_ends_with_success_and_leaves_nothing(pods: list[Pod],
                                                                             tmp_path: Path) -> None:
    (tmp_path / "rank").write_text(STANDBY)
    pod = start(pods, tmp_path, "--assigned-rank")
    pod.wait_for("state=standby")
    spares = spares_of(pod)
    (tmp_path / "rank").write_text(DONE + "\n")
    assert pod.end() == 0
    assert [s for _, s, _ in pod.reports()] == [PodState.STANDBY, PodState.DONE]
    assert "worker rank=" not in pod.text()
    assert not alive(spares)


def test_sigterm_to_a_standby_exits_143_and_leaves_no_warm_worker(pods: list[Pod], tmp_path: Path) -> None:
    pod = start(pods, tmp_path, "--assigned-rank")
    pod.wait_for("state=standby")
    spares = spares_of(pod)
    pod.process.send_signal(signal.SIGTERM)
    assert pod.end() == 143
    assert not alive(spares)
    assert "standby: kcover pod received SIGTERM" in pod.text()


@pytest.mark.parametrize("kind", ["out of range", "negative", "words", "fifo", "junk"])
def test_a_rank_file_that_names_no_rank_is_said_once_and_waited_out(pods: list[Pod], tmp_path: Path,
                                                                     kind: str) -> None:
    """The job has one pod (ranks 0-1 in it): rank 1 of the pods is out of range, so are -1, words, a FIFO
    (never blocks) and a megabyte of junk; the pod stays a standby until a good rank comes."""
    rank = tmp_path / "rank"
    if kind == "fifo":
        os.mkfifo(rank)
    else:
        rank.write_bytes({"out of range": b"1", "negative": b"-1", "words": b"rank 0",
                          "junk": b"\xff" * 1_000_000}[kind])
    pod = start(pods, tmp_path, "--assigned-rank", "--no-warm")
    pod.wait_for("names no rank from 0 to 0")
    time.sleep(0.3)
    assert [s for _, s, _ in pod.reports()] == [PodState.STANDBY]
    assert pod.process.poll() is None
    rank.unlink()
    rank.write_text("0")
    pod.wait_for("worker rank=1 generation=0")
    (tmp_path / "finish").touch()
    assert pod.end() == 0
    assert pod.text().count("names no rank") == 1


def test_reading_the_rank_file(tmp_path: Path) -> None:
    path = tmp_path / "rank"
    assert read_rank(path, 4) == STANDBY  # not mounted yet
    for text, expected in [("", STANDBY), ("standby\n", STANDBY), ("done", DONE), ("3", 3), ("0", 0), ("4", None),
                           ("03", 3), ("1e3", None), ("９", None), ("99999999", None), ("done!", None)]:
        path.write_text(text)
        assert read_rank(path, 4) == expected, text
    path.unlink()
    path.mkdir()
    assert read_rank(path, 4) is None
