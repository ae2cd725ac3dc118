"""The agent frees node memory: snapshot files no job saved for a day are deleted, fresh ones kept."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.k8s.conftest import Processes, wait_until

from kcover.k8s.agent.snapshots import sweep
from kcover.testing import TestCluster

DAY = 86400.0


def snapshot_files(folder: Path, ages: dict[str, float]) -> None:
    now = time.time()
    for name, age in ages.items():
        path = folder / name
        path.write_bytes(b"\0" * 4096)
        os.utime(path, (now - age, now - age))


def test_sweep_deletes_only_old_kcover_snapshots(tmp_path: Path) -> None:
    snapshot_files(tmp_path, {"kcover-aa-rank00000.img": 2 * DAY, "kcover-aa-rank00000.img.next": 2 * DAY,
                              "kcover-bb-rank00003.img": 60, "someone-elses.img": 3 * DAY})
    removed = sweep(tmp_path, DAY)
    assert sorted(p.name for p in removed) == ["kcover-aa-rank00000.img", "kcover-aa-rank00000.img.next"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kcover-bb-rank00003.img", "someone-elses.img"]


def test_the_agent_sweeps_its_nodes_snapshot_folder(test_cluster: TestCluster, gpu_nodes: list[str],
                                                    kcover_processes: Processes, tmp_path: Path) -> None:
    folder = tmp_path / "shm"
    folder.mkdir()
    snapshot_files(folder, {"kcover-old-rank00000.img": 2 * DAY, "kcover-new-rank00001.img": 10})
    kcover_processes.start(["agent", "--node", gpu_nodes[0], "--log-root", str(test_cluster.log_root), "--kmsg", "",
                            "--state-dir", str(tmp_path / "state"), "--kubeconfig", str(test_cluster.kubeconfig),
                            "--health-interval", "0", "--snapshot-dir", str(folder)], tmp_path / "agent.log")
    wait_until(lambda: not (folder / "kcover-old-rank00000.img").exists(), 30, "the day-old snapshot deleted")
    assert (folder / "kcover-new-rank00001.img").exists()
    assert "removed the memory snapshot" in (tmp_path / "agent.log").read_text()
