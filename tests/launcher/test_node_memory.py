"""Each simulated node of ``kcover run`` has its own shared memory: made, emptied when lost, freed at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcover.launcher.node_memory import forget_node, memory_root, node_memory, tidy


def test_a_node_folder_per_node_emptied_when_the_node_is_lost(tmp_path: Path) -> None:
    (tmp_path / "shm").mkdir()
    root = memory_root(tmp_path / "state", {"KCOVER_SHARED_MEMORY": str(tmp_path / "shm")})
    assert root is not None and root.parent == tmp_path / "shm" and root.name.startswith("kcover-nodes-")
    assert root == memory_root(tmp_path / "state", {"KCOVER_SHARED_MEMORY": str(tmp_path / "shm")})  # stable
    assert root != memory_root(tmp_path / "other", {"KCOVER_SHARED_MEMORY": str(tmp_path / "shm")})
    for node in ("node-0", "node-1"):
        folder = node_memory(root, node)
        assert folder is not None
        (folder / "kcover-x-rank00000.img").write_bytes(b"snapshot")
    forget_node(root, "node-1")
    assert sorted(p.name for p in root.iterdir()) == ["node-0"]
    (root / "node-2").mkdir()
    tidy(root, finished=False)  # a failed run: snapshots wait for the next run, empty folders go
    assert sorted(p.name for p in root.iterdir()) == ["node-0"]
    tidy(root, finished=True)
    assert not root.exists()


@pytest.mark.parametrize("base", ["/proc", "/sys", "/nonexistent/shm", "relative-missing", "a-file"])
def test_odd_bases_turn_it_off_instead_of_failing_the_run(tmp_path: Path, base: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a folder")
    assert memory_root(tmp_path, {"KCOVER_SHARED_MEMORY": base}) is None
    tidy(None, finished=True)
