"""``kcover pod`` as a real process: generations on order, failures, stops, and what a hostile setup does.

Each test starts ``python -m kcover pod`` with real worker processes
(``workers/pod_worker.py``) and plays the operator by writing the generation
file, as the kubelet does for the downward API.  The whole story on real
nodes, with the real operator and agent, is ``tests/cluster/test_real_in_place.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from kcover.launcher.pod import read_generation
from kcover.podline import MAX_TIMINGS, PodReport, PodState, parse, parse_timings
from kcover.ports import free_port

WORKER = Path(__file__).parent / "workers" / "pod_worker.py"


class Pod:
    """One ``kcover pod`` with two workers (``worker``, by default ``pod_worker.py``), its output in a file."""

    def __init__(self, folder: Path, *options: str, generation: str | None = "0", term_seconds: float = 0,
                 env: dict[str, str] | None = None, worker: Path = WORKER) -> None:
        self.folder = folder
        self.file = folder / "generation"
        if generation is not None:
            self.file.write_text(generation)
        self.output = folder / "pod.out"
        env = {**os.environ, "POD_TEST_DIR": str(folder), "TERM_SECONDS": str(term_seconds), **(env or {})}
        for variable in ("RANK", "WORLD_SIZE", "JOB_COMPLETION_INDEX", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(variable, None)
        self.port = free_port()
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kcover", "pod", "--nnodes", "1", "--node-rank", "0", "--nproc-per-node",
                 "2", "--master-port", str(self.port), "--generation-file", str(self.file), "--grace-period", "3",
                 *options, "--", sys.executable, str(worker)], env=env, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def reports(self) -> list[tuple[int, PodState, str]]:
        """The changes of state (not the running line repeated for a first step or a checkpoint)."""
        return [(r.generation, r.state, r.line()) for r in self.parsed() if r.at is None]

    def parsed(self) -> list[PodReport]:
        return [r for r in (parse(line) for line in self.text().splitlines()) if r is not None]

    def wait_for(self, words: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while words not in self.text():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {words!r} in:\n{self.text()}")
            time.sleep(0.05)

    def worker_pids(self) -> set[int]:
        return {int(p.read_text()) for p in self.folder.glob("pid-*") if p.read_text()}

    def end(self, timeout: float = 30) -> int:
        return self.process.wait(timeout)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        if pod.process.poll() is None:
            pod.process.kill()
            pod.process.wait()


def start(pods: list[Pod], folder: Path, *options: str, **kwargs: object) -> Pod:
    pod = Pod(folder, *options, **kwargs)  # type: ignore[arg-type]
    pods.append(pod)
    return pod


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}


def test_an_order_restarts_every_worker_for_the_new_generation_on_the_next_port(pods: list[Pod],
                                                                                 tmp_path: Path) -> None:
    pod = start(pods, tmp_path, term_seconds=0.5)
    pod.wait_for("worker rank=1 generation=0")
    pod.wait_for("worker rank=0 generation=0")
    first = pod.worker_pids()
    pod.file.write_text("1")
    pod.wait_for("worker rank=1 generation=1")
    pod.wait_for("worker rank=0 generation=1")
    assert f"port={pod.port + 1}" in pod.text() and f"generation=0 port={pod.port}" in pod.text()
    assert pod.text().count("saved on SIGTERM") == 2  # each old worker had its grace to save
    assert not alive(first)
    (tmp_path / "finish").touch()
    assert pod.end() == 0
    states = [(g, s) for g, s, _ in pod.reports()]
    assert states == [(0, PodState.RUNNING), (0, PodState.STOPPED), (1, PodState.RUNNING), (1, PodState.DONE)]
    stopped = pod.reports()[1][2]
    assert "order for generation 1" in stopped and " step=" in stopped


def test_each_generation_reports_its_first_step_and_newer_checkpoints_and_the_last_one_as_it_ends(
        pods: list[Pod], tmp_path: Path) -> None:
    """The running line is repeated with ``at`` for a generation's first step and each newer checkpoint (at most
    every 5 s, the workers checkpoint every second), and a checkpoint not yet said is said before the failure."""
    began = time.time()
    pod = start(pods, tmp_path)
    pod.wait_for("checkpoint=")
    (tmp_path / "fail-0").touch()
    pod.wait_for("state=failed")
    ended = time.time()
    reports = pod.parsed()
    firsts = [r for r in reports if r.step is not None and r.state is PodState.RUNNING]
    checkpoints = [r for r in reports if r.checkpoint is not None]
    assert len(firsts) == 1 and firsts[0].generation == 0 and firsts[0].at is not None
    assert began <= firsts[0].at <= ended
    assert checkpoints and all(r.state is PodState.RUNNING and r.at is not None for r in checkpoints)
    assert [r.checkpoint % 20 for r in checkpoints] == [0] * len(checkpoints)
    assert all(firsts[0].at <= r.at <= ended for r in checkpoints if r.at is not None)
    failed = reports.index(next(r for r in reports if r.state is PodState.FAILED))
    assert reports[failed - 1].checkpoint is not None  # the generation's last checkpoint, said as it ended
    assert reports[failed].step is not None and reports[failed].step >= (reports[failed - 1].checkpoint or 0)
    timed = [t for t in (parse_timings(line) for line in pod.text().splitlines()) if t is not None]
    for rank in (0, 1):  # every step the rank made in generation 0 was said, in batches of at most 32, in order;
        # a generation of about 20 steps fills no batch and is younger than 5 s: the steps were said as it ended
        steps = [step for t in timed if t.rank == rank and t.generation == 0 for step, _ in t.steps()]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 15
        assert {seconds for t in timed if t.rank == rank for _, seconds in t.steps()} == {0.01 * (1 + rank)}
    assert all(len(t.seconds) <= MAX_TIMINGS for t in timed)
    pod.file.write_text("1")
    pod.wait_for("generation=1 state=running step=")
    assert [r.generation for r in pod.parsed() if r.step is not None and r.state is PodState.RUNNING] == [0, 1]
    (tmp_path / "finish").touch()
    assert pod.end() == 0


def test_a_flood_of_junk_and_random_timings_on_the_pipe_is_said_in_bounded_lines(pods: list[Pod],
                                                                                  tmp_path: Path) -> None:
    """A rank writes a 1 MiB line, bad timings and 100,000 timings of random steps: kcover pod keeps at most 64
    of a rank's timings pending and says one batch per rank per tick, so its log stays small; the generation
    runs on."""
    began = time.monotonic()
    pod = start(pods, tmp_path, env={"FLOOD": "1"})
    pod.wait_for("worker rank=0 flooded")
    pod.wait_for("state=running step=")
    (tmp_path / "finish").touch()
    assert pod.end() == 0
    ticks = (time.monotonic() - began) / 0.05
    flooded = [t for t in (parse_timings(line) for line in pod.text().splitlines()) if t is not None and t.rank == 0]
    assert 0 < len(flooded) <= ticks + 2 * MAX_TIMINGS
    assert all(0 < s < 1e6 for t in flooded for _, s in t.steps())
    assert [s for _, s, _ in pod.reports()] == [PodState.RUNNING, PodState.DONE]


def test_the_next_generation_starts_from_warm_workers_that_imported_ahead(pods: list[Pod], tmp_path: Path) -> None:
    """The spares start once the generation stepped, import ``--preload`` and wait; the order makes them the
    workers (the pids that answer are the spares'), and nothing of them is left when the pod ends."""
    pod = start(pods, tmp_path, "--preload", "json,email.mime.text,no_such_module")
    pod.wait_for("worker rank=1 generation=0")
    spares: set[int] = set()
    deadline = time.monotonic() + 30
    while len(spares) < 2 and time.monotonic() < deadline:
        spares = {c.pid for c in psutil.Process(pod.process.pid).children()
                  if "zygote.py" in " ".join(c.cmdline())}
        time.sleep(0.05)
    assert len(spares) == 2, "no warm workers started"
    pod.file.write_text("1")
    pod.wait_for("worker rank=0 generation=1")
    pod.wait_for("worker rank=1 generation=1")
    running = [r for g, s, r in pod.reports() if g == 1 and s is PodState.RUNNING]
    assert running and running[0].endswith(", 2 warm")
    answered = {int((tmp_path / f"pid-{rank}-1").read_text()) for rank in (0, 1)}
    assert answered == spares
    assert {Path(f"/proc/{pid}/comm").read_text().strip() for pid in answered} == {"pod_worker.py"}
    time.sleep(1)  # generation 1 stepped: its own spares for generation 2 start
    children = {c.pid for c in psutil.Process(pod.process.pid).children()}
    pod.process.send_signal(signal.SIGTERM)
    assert pod.end() == 143
    assert not alive(spares | children | pod.worker_pids())


def test_no_warm_starts_every_generation_cold(pods: list[Pod], tmp_path: Path) -> None:
    pod = start(pods, tmp_path, "--no-warm")
    pod.wait_for("worker rank=1 generation=0")
    time.sleep(0.5)
    assert not [c for c in psutil.Process(pod.process.pid).children() if "zygote.py" in " ".join(c.cmdline())]
    pod.file.write_text("1")
    pod.wait_for("worker rank=1 generation=1")
    assert "warm" not in next(r for g, _, r in pod.reports() if g == 1)
    (tmp_path / "finish").touch()
    assert pod.end() == 0


def test_a_failed_worker_stops_its_peer_reports_its_status_and_waits_for_the_order(pods: list[Pod],
                                                                                  tmp_path: Path) -> None:
    pod = start(pods, tmp_path)
    pod.wait_for("worker rank=1 generation=0")
    (tmp_path / "fail-0").touch()
    pod.wait_for("state=failed")
    failed = next(r for g, s, r in pod.reports() if s is PodState.FAILED)
    assert "rank=0 exit=-9" in failed and " step=" in failed
    assert not alive(pod.worker_pids())  # the peer was stopped too
    time.sleep(0.5)
    assert pod.process.poll() is None  # waiting for the operator
    pod.file.write_text("1")
    pod.wait_for("worker rank=0 generation=1")
    (tmp_path / "finish").touch()
    assert pod.end() == 0


def test_without_an_order_the_pod_ends_with_the_workers_status(pods: list[Pod], tmp_path: Path) -> None:
    pod = start(pods, tmp_path, "--order-wait", "1")
    pod.wait_for("worker rank=1 generation=0")
    (tmp_path / "fail-0").touch()
    assert pod.end() == 137
    assert "no restart order in 1s: exiting with the worker's status 137" in pod.text()


def test_without_a_generation_file_in_place_is_off_and_a_failure_ends_the_pod(pods: list[Pod],
                                                                             tmp_path: Path) -> None:
    pod = start(pods, tmp_path, generation=None)
    pod.wait_for("worker rank=1 generation=0")
    assert "in-place=off" in pod.reports()[0][2] and "no order file" in pod.reports()[0][2]
    (tmp_path / "fail-0").touch()
    assert pod.end() == 137


@pytest.mark.parametrize("kind", ["fifo", "garbage", "directory"])
def test_a_generation_file_that_is_not_a_number_in_a_file_never_blocks_nor_restarts(
        pods: list[Pod], tmp_path: Path, kind: str) -> None:
    pod = start(pods, tmp_path)
    pod.wait_for("worker rank=1 generation=0")
    pod.file.unlink()
    if kind == "fifo":
        os.mkfifo(pod.file)
    elif kind == "directory":
        pod.file.mkdir()
    else:
        pod.file.write_bytes(b"\xff" * 1_000_000)
    pod.wait_for("cannot read a generation")
    assert read_generation(pod.file) is None
    time.sleep(0.5)
    assert [s for _, s, _ in pod.reports()] == [PodState.RUNNING]  # no restart
    (tmp_path / "finish").touch()
    assert pod.end() == 0
    assert pod.text().count("cannot read a generation") == 1


def test_sigterm_stops_the_workers_with_their_grace_and_exits_143(pods: list[Pod], tmp_path: Path) -> None:
    pod = start(pods, tmp_path, term_seconds=0.5)
    pod.wait_for("worker rank=1 generation=0")
    pod.wait_for("worker rank=0 generation=0")  # both answer SIGTERM by now
    workers = pod.worker_pids()
    pod.process.send_signal(signal.SIGTERM)
    assert pod.end() == 143
    assert pod.text().count("saved on SIGTERM") == 2
    assert not alive(workers)


def test_kill_9_of_kcover_pod_leaves_no_worker(pods: list[Pod], tmp_path: Path) -> None:
    pod = start(pods, tmp_path)
    pod.wait_for("worker rank=1 generation=0")
    workers = pod.worker_pids()
    pod.process.kill()
    pod.end()
    deadline = time.monotonic() + 10
    while alive(workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(workers)


@pytest.mark.parametrize(("arguments", "env", "words"), [
    ([], {}, "how many pods does the job have?"),
    (["--nnodes", "2"], {}, "which pod of the job is this?"),
    (["--nnodes", "2", "--node-rank", "2"], {}, "must be from 0 to 1 for 2 pods (got 2)"),
    (["--nnodes", "2"], {"JOB_COMPLETION_INDEX": "x1"}, "(from JOB_COMPLETION_INDEX) must be a whole number"),
    (["--nnodes", "2", "--node-rank", "1"], {}, "where do the ranks meet?"),
    ([], {"WORLD_SIZE": "0", "RANK": "0"}, "(from WORLD_SIZE) must be from 1"),
    (["--nnodes", "1", "--node-rank", "0", "--grace-period", "nan"], {}, "--grace-period must be a number"),
    (["--nnodes", "1", "--node-rank", "0", "--master-port", "65535"], {}, "must leave room for --port-span"),
    (["--nnodes", "1", "--node-rank", "0", "--port-span", "0"], {}, "--port-span must be from 1 to 1000 (got 0)"),
])
def test_a_pod_set_up_wrong_is_told_what_is_missing_and_nothing_starts(
        arguments: list[str], env: dict[str, str], words: str, tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "JOB_COMPLETION_INDEX",
                                                              "MASTER_ADDR", "MASTER_PORT")}
    marker = tmp_path / "started"
    done = subprocess.run([sys.executable, "-m", "kcover", "pod", *arguments, "--", "touch", str(marker)],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done
    assert words in done.stderr and "Traceback" not in done.stderr
    assert not marker.exists()
