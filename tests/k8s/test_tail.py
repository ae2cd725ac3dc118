"""Following CRI log files: whole lines only, rotation, truncation, offsets that survive a restart."""

from __future__ import annotations

from pathlib import Path

from kcover.k8s.agent.tail import Tailer


def test_offsets_rotation_truncation_and_forgetting(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    state = tmp_path / "offsets.json"
    log.write_bytes(b"one\ntwo\npart")
    tailer = Tailer(state)
    assert tailer.read(log) == (b"one\ntwo\n", 1)
    assert tailer.read(log) is None  # the partial line waits
    with log.open("ab") as out:
        out.write(b"ial\n")
    assert tailer.read(log) == (b"partial\n", 3)
    tailer.save()
    again = Tailer(state)  # a restarted agent resumes, nothing is read twice
    assert again.read(log) is None
    log.rename(tmp_path / "0.log.20240101")  # rotation: a new file under the old name
    log.write_bytes(b"fresh\n")
    assert again.read(log) == (b"fresh\n", 1)
    log.write_bytes(b"")  # truncation
    log.write_bytes(b"x\n")
    assert again.read(log) == (b"x\n", 1)
    log.unlink()
    again.forget_missing()
    assert again.cursors == {}
