"""kcover times a DDP script's steps by itself (``kcover/launcher/autotime``): real torch, real processes.

The script (``workers/ddp_train.py``) imports nothing of kcover.  Each variant of how a script can use DDP
(its own communication hook, early or late, a built-in one, a hook registered twice, gradient accumulation,
an evaluation forward, its own SDK timings) runs twice at world size 1 — once as kcover starts it, once as
plain Python — and must train to the very same parameters and hook calls, while kcover's run gets one timing
per step.  The hostile cases: a pipe nobody reads, a descriptor that is not one, the switch turned off, the
environment's own ``sitecustomize`` (working or raising).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from tests.launcher.test_pod import Pod, start
from tests.launcher.test_run import run

from kcover.launcher.workers import AUTO_TIMING, with_auto_timing
from kcover.podline import parse_timings

DDP_TRAIN = Path(__file__).parent / "workers" / "ddp_train.py"
STEPS = 6
VARIANTS = ("", "hook", "late-hook", "builtin", "twice", "accumulate", "eval", "compiled", "eval-mode", "sync-later",
            "wait", "two-models", "copies", "freed", "sdk")


def plain_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCOVER_") and k != "PYTHONPATH"}
    # MASTER_PORT 0: a world of one binds a port of the kernel's choice (free_port() raced between the runs
    # started at once: EADDRINUSE)
    return {**env, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0",
            "STEPS": str(STEPS), **extra}


def train_every_variant(folder: Path, kcover: bool) -> tuple[dict[str, str], dict[str, list[tuple[int, float]]]]:
    """``ddp_train.py`` at world size 1 through every variant: what each said, and its timings (step, seconds)."""
    sink_path = folder / f"timings-{kcover}"
    with sink_path.open("wb") as sink:
        env = plain_env(VARIANTS=",".join(VARIANTS), MARK_FD=str(sink.fileno()))
        if kcover:
            env = with_auto_timing({**env, "KCOVER_PROGRESS_FD": str(sink.fileno())})
        done = subprocess.run([sys.executable, str(DDP_TRAIN)], env=env, pass_fds=(sink.fileno(),),
                              capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sitecustomize" not in done.stderr, done.stderr
    said: dict[str, str] = {}
    for line in done.stdout.splitlines():
        if not line.startswith("step "):
            said.setdefault(line.split(":")[0] if ": " in line else line.rsplit(" ", 1)[0], line)
    timings: dict[str, list[tuple[int, float]]] = {}
    variant = "?"
    for kind, first, *rest in (line.split(" ") for line in sink_path.read_text().splitlines()):
        if kind == "variant":
            variant = first
            timings[variant] = []
        else:
            timings[variant].append((int(first), float(rest[0])))
    return said, timings


def median(values: list[tuple[int, float]]) -> float:
    return sorted(seconds for _, seconds in values)[len(values) // 2]


def test_every_way_of_using_ddp_trains_exactly_as_without_kcover_and_is_timed_once_per_step(tmp_path: Path) -> None:
    timed_said, timed = train_every_variant(tmp_path, kcover=True)
    plain_said, untimed = train_every_variant(tmp_path, kcover=False)
    graph_breaks = int(timed_said.pop("graph breaks").split()[-1]), int(plain_said.pop("graph breaks").split()[-1])
    assert timed_said == plain_said  # the same parameters, hook calls, refusals, copies and frees as without kcover
    assert untimed == {variant: [] for variant in VARIANTS}
    assert graph_breaks[0] == graph_breaks[1] + 1  # torch.compile: the pre-hook runs eagerly, one break more
    numbers = [step for variant in VARIANTS if variant != "sdk" for step, _ in timed[variant]]
    assert numbers == sorted(set(numbers)), timed  # one numbering in the process, a rebuilt model goes on
    for variant in VARIANTS:
        if variant == "sdk":  # the script's own timings (twice the real time) and nothing of kcover's timer
            assert [step for step, _ in timed[variant]] == list(range(STEPS)), timed
        else:  # one per step, sent as the next one begins: the last step's is never sent
            assert len(timed[variant]) == STEPS - 1, (variant, timed)
        assert all(0 < seconds < 30 for _, seconds in timed[variant]), (variant, timed)
    assert timed_said["hook"].endswith(f"hook calls {STEPS}")
    assert timed_said["late-hook"].endswith(f"hook calls {STEPS - 2}")
    assert timed_said["hook refused"] == "hook refused: register_comm_hook or register_builtin_comm_hook can only " \
                                         "be called once."
    assert timed_said["freed"] == "freed: 0 still alive"
    plain = median(timed[""])
    assert median(timed["accumulate"]) > 1.5 * plain and median(timed["sync-later"]) > 1.5 * plain  # both batches
    assert median(timed["sdk"]) > 1.5 * plain  # the script's own figures
    assert median(timed["eval-mode"]) < 1.5 * plain  # an evaluation forward is not the step's compute
    assert median(timed["wait"]) < 0.2  # the 0.25 s after each backward is waiting, not compute


PROBE = """
import os, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import torch
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(2, 2))
import sys
timers = getattr(sys.modules.get("kcover_autotime"), "TIMERS", {})
print("timed" if model in timers else "untimed", flush=True)
dist.destroy_process_group()
"""


def run_all(commands: list[tuple[list[str], dict[str, str], tuple[int, ...]]]) -> list[tuple[int, str, str]]:
    """Run the commands at once (each imports torch for seconds): exit code, stdout and stderr of each."""
    started = [subprocess.Popen(command, env=env, pass_fds=fds, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE) for command, env, fds in commands]
    return [(process.returncode, *process.communicate(timeout=300)) for process in started
            if process.wait(timeout=300) is not None]


def test_a_pipe_nobody_reads_a_descriptor_that_is_not_one_or_not_kcovers_pipe_never_breaks_training(
        tmp_path: Path) -> None:
    """The last case is a child process that inherited kcover's variables but not the pipe: its descriptor of
    that number is a log file here (a socket elsewhere), and nothing of kcover's may be written into it, neither
    by the timer nor by the SDK."""
    read, write = os.pipe()
    os.close(read)
    foreign = tmp_path / "their.log"
    with foreign.open("wb") as log:
        try:
            commands = [([sys.executable, str(DDP_TRAIN)], with_auto_timing(plain_env(KCOVER_PROGRESS_FD=fd)),
                         (write,)) for fd in (str(write), "not-a-number", "999")]
            commands.append(([sys.executable, str(DDP_TRAIN)], with_auto_timing(plain_env(
                KCOVER_PROGRESS_FD=str(log.fileno()), KCOVER_PROGRESS_PIPE="1:1", VARIANTS=",sdk")), (log.fileno(),)))
            results = run_all(commands)
        finally:
            os.close(write)
    for code, out, err in results:
        assert code == 0, err[-3000:]
        assert f"step {STEPS - 1}" in out and "plain: params" in out
    assert "sdk: params" in results[-1][1]
    assert foreign.read_bytes() == b""


def probe(env: dict[str, str], then: str = "") -> tuple[list[str], dict[str, str], tuple[int, ...]]:
    return [sys.executable, "-c", f"{PROBE}\n{then}"], env, ()


def test_the_switch_turns_it_off_even_with_the_folder_on_the_path_and_outside_kcover_nothing_is_installed() -> None:
    assert "PYTHONPATH" not in with_auto_timing({"KCOVER_AUTO_TIMING": "0"})
    results = run_all([probe(plain_env(PYTHONPATH=str(AUTO_TIMING), KCOVER_PROGRESS_FD="2", KCOVER_AUTO_TIMING="0")),
                       probe(plain_env(PYTHONPATH=str(AUTO_TIMING))),  # no KCOVER_PROGRESS_FD: not under kcover
                       probe(plain_env(PYTHONPATH=str(AUTO_TIMING), KCOVER_PROGRESS_FD="2"))])
    assert [out for _, out, _ in results] == ["untimed\n", "untimed\n", "timed\n"], results


def test_the_folder_goes_first_on_the_path_once_and_the_users_path_is_kept() -> None:
    assert with_auto_timing({})["PYTHONPATH"] == str(AUTO_TIMING)
    kept = with_auto_timing({"PYTHONPATH": f"/mine{os.pathsep}/theirs"})["PYTHONPATH"]
    assert kept == f"{AUTO_TIMING}{os.pathsep}/mine{os.pathsep}/theirs"
    assert with_auto_timing({"PYTHONPATH": kept})["PYTHONPATH"] == kept
    assert sorted(p.name for p in AUTO_TIMING.iterdir() if p.suffix == ".py") == ["sitecustomize.py"]


def test_the_environments_own_sitecustomize_still_runs_as_it_would_without_kcover(tmp_path: Path) -> None:
    """A working one and one that raises (Python says so and goes on, with or without kcover's in front)."""
    bodies = {"works": "", "raises": "1 / 0"}
    probes = []
    for name, body in bodies.items():
        (tmp_path / name).mkdir()
        marker = tmp_path / f"{name}.marker"
        (tmp_path / name / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n{body}\n")
        probes.append(probe(plain_env(PYTHONPATH=f"{AUTO_TIMING}{os.pathsep}{tmp_path / name}",
                                      KCOVER_PROGRESS_FD="2")))
    twice = tmp_path / "twice"  # kcover's folder twice on the path (a symlink): the next one is still theirs
    twice.symlink_to(AUTO_TIMING)
    probes.append(probe(plain_env(PYTHONPATH=os.pathsep.join([str(AUTO_TIMING), str(twice), str(tmp_path / "works")]),
                                  KCOVER_PROGRESS_FD="2"), "import sitecustomize; print(sitecustomize.__file__)"))
    (works, out, err), (raises, raised_out, raised_err), (doubled, doubled_out, doubled_err) = run_all(probes)
    assert (works, out, raises, raised_out) == (0, "timed\n", 0, "timed\n"), err + raised_err
    assert (tmp_path / "works.marker").read_text() == (tmp_path / "raises.marker").read_text() == "ran"
    assert "Error in sitecustomize" in raised_err and "Error in sitecustomize" not in err
    assert doubled == 0 and doubled_out == f"timed\n{tmp_path / 'works' / 'sitecustomize.py'}\n", doubled_err


def test_a_ddp_script_without_any_kcover_call_has_its_throttled_rank_found(tmp_path: Path) -> None:
    """The same job as tests/launcher/test_straggler_run.py, but the script never calls kcover."""
    code, doc, stderr = run(tmp_path, "ddp_train.py", "--nnodes", "3", "--inject", "slow@rank2:factor=1.5:step=30")
    assert code == 0, stderr[-3000:]
    [straggler] = doc["stragglers"]
    assert (straggler["rank"], straggler["node"], straggler["action"]) == (2, "node-2", "reported")
    assert 1.2 < straggler["slowdown"] < 2.0
    assert 30 < straggler["since_step"] < 30 + 30


def warm_workers(pid: int) -> int:
    count = 0
    for child in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            count += "zygote.py" in " ".join(child.cmdline())
    return count


def test_kcover_pod_says_a_ddp_scripts_timings_in_every_generation_warm_ones_included(tmp_path: Path) -> None:
    pods: list[Pod] = []
    try:
        pod = start(pods, tmp_path, "--preload", "torch", worker=DDP_TRAIN, env={"STEPS": "100000"})
        deadline = time.monotonic() + 90
        while warm_workers(pod.process.pid) < 2:
            assert time.monotonic() < deadline, "no warm workers started"
            time.sleep(0.1)
        seen: set[tuple[int, int]] = set()
        while {(0, 0), (0, 1), (1, 0), (1, 1)} - seen:
            assert time.monotonic() < deadline, pod.text()[-3000:]
            timings = [t for t in map(parse_timings, pod.text().splitlines()) if t is not None]
            seen = {(t.generation, t.rank) for t in timings}
            if (0, 0) in seen and (0, 1) in seen and pod.file.read_text() == "0":
                pod.file.write_text("1")
            time.sleep(0.2)
        assert "2 warm" in pod.text()
        pod.process.send_signal(signal.SIGTERM)
        assert pod.end() == 143
    finally:
        for started in pods:
            if started.process.poll() is None:
                started.process.kill()
                started.process.wait()
