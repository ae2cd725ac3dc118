"""Benchmark of peer-replicated snapshots (``Checkpointer(replicas=1)``) against the disk, in the same run.

Two gloo ranks, each on a simulated node of its own (its own shared-memory folder); a lost node is one whose
folder is emptied.  Measured:

- **restore after a node loss**: four ranks on two nodes snapshot step 1 (persisted) and step 2 (memory
  only); node-1 is lost.  With replicas, node-1's ranks restore step 2 from their buddies' memory and
  node-0's from their own; without, every rank must go back to step 1 on the disk (the newest step all can
  load).  Timed: the lost ranks' ``load_latest()`` and the whole job's (the slowest rank), checksums
  verified both ways, the disk with a cold page cache (a replacement node has never read the files: they
  are evicted with ``posix_fadvise``) and with a warm one (the kindest baseline).  Median of ``--repeats``,
  each restore in fresh processes;
- **training step time** with replication on vs off: DDP training of a ~64 MB model (Adam: ~200 MB of state a
  rank), a memory snapshot every ``--every`` steps, a Checkpointer without replicas and one with taking turns
  in blocks of steps within each run (see :func:`training_figures`), the median of ``--rounds`` runs' ratios.
  Both "nodes" share this machine's cores, and each rank sends its replica and receives its buddy's, as on a
  cluster; the replication threads run at the lowest CPU priority, so the cost that lands on a step is what
  the training leaves no idle CPU for (every CPU is busy here: one rank a core);
- **steps lost after a node loss**: from one more training run, with replication throughout: for each step,
  how far the newest step whose replicas are complete lags behind (what a node lost at that moment costs),
  vs a persist every N steps (which loses (N-1)/2 steps on average, plus the persist's own time).

Run: ``python -m bench.peer_restore --size-mb 1024 --dir /path/on/disk``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.args import existing_dir

WORKER = Path(__file__).parent / "workers" / "replica_rank.py"


def ranks(phase: str, root: Path, world: int, per_node: int, *args: str) -> list[dict[str, Any]]:
    """Run one phase on fresh rank processes; their JSON reports."""
    store = root / f"store-{time.monotonic_ns()}"
    procs = [subprocess.Popen([sys.executable, str(WORKER), phase, str(rank), str(world), str(per_node), str(store),
                               str(root), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise SystemExit(f"rank failed in phase {phase}:\n{err[-3000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


def evict(folder: Path) -> None:
    """Drop the files' pages from the page cache (they were fsynced: the pages are clean)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


SCENARIOS = {  # what every rank must restore from, after node-1 is lost
    "peer replicas": ("memory", "memory", "peer", "peer"),
    # without replicas the job goes back to step 1: node-0's ranks still hold it in memory (the snapshot
    # before the newest), the lost node's ranks read it from the disk
    "disk, cold cache": ("memory", "memory", "disk", "disk"),
    "disk, warm cache": ("memory", "memory", "disk", "disk"),
}


def restore_figures(root: Path, size_mb: int, repeats: int) -> dict[str, Any]:
    """Four ranks on two nodes; node-1 is lost: restore with its ranks' replicas, and without them."""
    saved = ranks("save", root, 4, 2, str(size_mb))
    keeper = root / "shm" / "node-0"
    kept = root / "kept-replicas"
    kept.mkdir()
    for path in keeper.glob("*.replica-*"):
        shutil.copy2(path, kept / path.name)
    lost: dict[str, list[float]] = {kind: [] for kind in SCENARIOS}
    job: dict[str, list[float]] = {kind: [] for kind in SCENARIOS}
    for _ in range(repeats):
        for kind, sources in SCENARIOS.items():
            shutil.rmtree(root / "shm" / "node-1", ignore_errors=True)
            for path in keeper.glob("*.replica-*"):
                path.unlink()
            if kind == "peer replicas":
                for path in kept.iterdir():
                    shutil.copy2(path, keeper / path.name)
            if kind == "disk, warm cache":
                for path in (root / "ckpt").rglob("*.img"):
                    path.read_bytes()
            else:
                evict(root / "ckpt")
            reports = ranks("restore", root, 4, 2)
            if tuple(r["source"] for r in reports) != sources:
                raise SystemExit(f"{kind}: the ranks restored from {[r['source'] for r in reports]}, not {sources}")
            lost[kind].append(max(r["seconds"] for r in reports[2:]))
            job[kind].append(max(r["seconds"] for r in reports))
    return {"lost": {k: statistics.median(v) for k, v in lost.items()},
            "job": {k: statistics.median(v) for k, v in job.items()},
            "persist": max(r["persist"] for r in saved), "replicate": max(r["replicate"] for r in saved)}


def training_figures(root: Path, steps: int, every: int, rounds: int, width: int) -> dict[str, Any]:
    """The step time without and with replication, and how far the replicas lag behind the training.

    The step times come from ``rounds`` runs in which the two take turns in blocks of 2 × ``every`` steps in
    the same processes (this machine's speed drifts by more than the effect between runs a minute apart:
    whole runs off and on differed by ±10%); a round's ratio is the mean step with replication over the
    mean step without, the first block of each left out (warm-up; the pushes of the first two snapshots
    allocate the keeper's memory for the replicas, once a job).  A block with replication ends with a
    ``wait()`` for the replica in flight, counted in its last step: the cost is never carried into the
    next block.  The lag comes from one run with replication throughout.
    """
    ratios: list[float] = []
    means: dict[int, list[float]] = {0: [], 1: []}
    first = 4 * every if steps >= 8 * every else 0
    for _ in range(rounds):
        reports = ranks("alternate", root, 2, 1, str(steps), str(every), str(width))
        per_step = [statistics.mean(times) for times in zip(*(r["step_seconds"] for r in reports), strict=True)]
        modes = reports[0]["modes"]
        mean = {mode: statistics.mean(t for t, m in zip(per_step[first:], modes[first:], strict=True) if m == mode)
                for mode in (0, 1)}
        ratios.append(mean[1] / mean[0])
        for mode in (0, 1):
            means[mode].append(mean[mode])
    reports = ranks("train", root, 2, 1, str(steps), str(every), "1", str(width))
    newest = [min(values) for values in zip(*(r["replicated"] for r in reports), strict=True)]
    lags = [step - done for step, done in enumerate(newest, start=1) if step > every * 2]
    return {"off": statistics.median(means[0]), "on": statistics.median(means[1]), "ratio": statistics.median(ratios),
            "ratios": ratios, "lag": statistics.mean(lags) if lags else float("nan"), "lag_max": max(lags, default=0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size-mb", type=int, default=1024, help="each rank's state for the restore (MiB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="training steps per run")
    parser.add_argument("--every", type=int, default=10, help="a memory snapshot every this many steps")
    parser.add_argument("--rounds", type=int, default=3, help="training runs with the two taking turns")
    parser.add_argument("--width", type=int, default=2048, help="the model's layer width (4 layers)")
    parser.add_argument("--dir", type=existing_dir, default=None, help="where the checkpoints go (default: a temp dir)")
    options = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kcover-peer-bench-", dir=options.dir))
    shm_root = Path(tempfile.mkdtemp(prefix="kcover-peer-bench-", dir="/dev/shm"))
    (root / "shm").symlink_to(shm_root)  # the simulated nodes' shared memory is real shared memory
    try:
        restore = restore_figures(root, options.size_mb, options.repeats)
        train = training_figures(root, options.steps, options.every, options.rounds, options.width)
    finally:
        shutil.rmtree(shm_root, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    lost, job = restore["lost"], restore["job"]
    print(f"node-1 of 2 lost (2 ranks a node, {options.size_mb} MiB a rank; median of {options.repeats}):")
    print(f"  with replicas: its ranks restore step 2 from their buddies' memory in {lost['peer replicas']:.3f} s; "
          f"the whole job has restored in {job['peer replicas']:.3f} s")
    for kind in ("disk, cold cache", "disk, warm cache"):
        print(f"  without, from the {kind}: step 1 (1 step lost) in {lost[kind]:.3f} s, the job in {job[kind]:.3f} s"
              f"  -> ratio {lost[kind] / lost['peer replicas']:.2f}x for the lost ranks, "
              f"{job[kind] / job['peer replicas']:.2f}x for the job (target >= 3)")
    print(f"  (the save: persist {restore['persist']:.2f} s, replication to the buddy {restore['replicate']:.2f} s)")
    print(f"training step, a memory snapshot every {options.every} steps (median of {options.rounds} runs):")
    print(f"  replication off: {train['off'] * 1000:.1f} ms, on: {train['on'] * 1000:.1f} ms"
          f"  -> ratio {train['ratio']:.3f}, the median of the runs' "
          f"{' '.join(f'{r:.3f}' for r in train['ratios'])} (target <= 1.02)")
    print(f"steps lost after a node loss: peer replicas {train['lag']:.1f} on average (at most {train['lag_max']});"
          f" a persist every 10 steps: {9 / 2:.1f}, every 100: {99 / 2:.1f} (plus the persist's own time)")


if __name__ == "__main__":
    main()
