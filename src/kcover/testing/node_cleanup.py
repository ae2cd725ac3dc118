"""What real test nodes leave on the host, and how to take every bit of it away again.

A real node (:mod:`kcover.testing.realnodes`) changes the machine outside its
own folder: containers run in cgroups under ``/sys/fs/cgroup/*/<cgroup root>``,
containerd's shims outlive containerd, overlay and tmpfs mounts appear under the
node's folder, a Linux bridge holds the nodes' addresses, and the kubelet sets
three kernel tunables. :class:`HostChanges` records all of that in a JSON file
*before* it happens (under ``$TMPDIR/kcover-real-nodes/``), so that:

- :func:`undo` takes it away in a safe order: kill every process in the
  cgroups, kill the shims, unmount deepest first, remove the cgroups bottom-up,
  delete the bridge, put the tunables back, remove the mount points it created
  (``/var/log/pods``, ``/var/lib/kcover``) unless another pool still runs;
- :func:`leftovers` lists what is still there (a test asserts it is empty);
- :func:`undo_stale` does the same for the record of a test run that was
  killed (its owner pid is gone), so a ``kill -9`` never leaves a machine dirty
  for the next run.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "KUBELET_SYSCTLS",
    "HostChanges",
    "cgroup_pids",
    "leftovers",
    "record_dir",
    "undo",
    "undo_stale",
]

CGROUP_FS = Path("/sys/fs/cgroup")
# What the kubelet writes on start-up (pkg/kubelet/cm setupKernelTunables).
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
_MNT_DETACH = 2


def record_dir() -> Path:
    return Path(tempfile.gettempdir()) / "kcover-real-nodes"


@dataclass
class HostChanges:
    """Everything a pool of real nodes changed or may change on this machine."""

    owner_pid: int
    bridge: str
    roots: list[str] = field(default_factory=list)
    cgroup_roots: list[str] = field(default_factory=list)
    sockets: list[str] = field(default_factory=list)
    sysctls: dict[str, str] = field(default_factory=dict)
    created_dirs: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return record_dir() / f"{self.bridge}.json"

    def save(self) -> None:
        """Write the record (atomically) before making the change it describes."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.path)

    @classmethod
    def load(cls, path: Path) -> HostChanges:
        return cls(**json.loads(path.read_text()))


def read_sysctls() -> dict[str, str]:
    values: dict[str, str] = {}
    for name in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = (Path("/proc/sys") / name).read_text().strip()
    return values


def _cgroup_dirs(cgroup_root: str) -> list[Path]:
    """Every cgroup folder under ``cgroup_root`` in every hierarchy, deepest first."""
    found: list[Path] = []
    rel = cgroup_root.strip("/")
    if not rel:
        return found
    for hierarchy in CGROUP_FS.iterdir() if CGROUP_FS.is_dir() else []:
        top = hierarchy / rel
        if top.is_dir():
            found.extend(Path(dirpath) for dirpath, _, _ in os.walk(top))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(cgroup_root: str) -> set[int]:
    """The processes in any cgroup under ``cgroup_root`` (a node's containers)."""
    pids: set[int] = set()
    for folder in _cgroup_dirs(cgroup_root):
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(line) for line in (folder / "cgroup.procs").read_text().split())
    return pids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _node_processes(changes: HostChanges) -> set[int]:
    """Container processes (by cgroup) and anything naming a node's folder or socket."""
    pids: set[int] = set()
    for root in changes.cgroup_roots:
        pids |= cgroup_pids(root)
    marks = [*changes.roots, *changes.sockets]
    for pid in _all_pids():
        if pid != os.getpid() and any(mark in _cmdline(pid) for mark in marks):
            pids.add(pid)
    pids.discard(os.getpid())
    return pids


def _kill_all(changes: HostChanges, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _node_processes(changes)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        for pid in pids:  # reap our own children (containerd, kubelet started by this process)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        time.sleep(0.1)


def _mounts_under(roots: list[str]) -> list[str]:
    points: list[str] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return points
    for line in lines:
        point = line.split()[4].replace("\\040", " ")
        if any(point == r or point.startswith(r.rstrip("/") + "/") for r in roots):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def _unmount_all(roots: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(5):  # stacked mounts need more than one pass
        points = _mounts_under(roots)
        if not points:
            return
        for point in points:
            libc.umount2(point.encode(), _MNT_DETACH)


def _bridge_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _restore_sysctls(saved: dict[str, str]) -> None:
    others = [pid for pid in _all_pids() if Path(f"/proc/{pid}/comm").exists() and _comm(pid) == "kubelet"]
    if others:  # another kubelet on this machine wants its values; leave them
        return
    for name, value in saved.items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / name).write_text(value)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def undo(changes: HostChanges) -> list[str]:
    """Take every recorded change away; return :func:`leftovers` (empty when clean)."""
    _kill_all(changes)
    _unmount_all(changes.roots)
    for root in changes.cgroup_roots:
        for folder in _cgroup_dirs(root):
            with contextlib.suppress(OSError):
                folder.rmdir()
    if _bridge_exists(changes.bridge):
        subprocess.run(["ip", "link", "delete", changes.bridge], check=False, capture_output=True)
    _restore_sysctls(changes.sysctls)
    for root in changes.roots:
        if not _mounts_under([root]):
            shutil.rmtree(root, ignore_errors=True)
    if not _other_records(changes):  # another pool's nodes may still mount over them
        for created in reversed(changes.created_dirs):
            with contextlib.suppress(OSError):
                Path(created).rmdir()
    left = leftovers(changes)
    if not left:
        changes.path.unlink(missing_ok=True)
    return left


def _other_records(changes: HostChanges) -> bool:
    folder = record_dir()
    return folder.is_dir() and any(p != changes.path for p in folder.glob("*.json"))


def leftovers(changes: HostChanges) -> list[str]:
    """What the nodes left behind: processes, mounts, cgroups, the bridge, changed tunables."""
    left = [f"process {pid}: {_cmdline(pid)[:200]}" for pid in sorted(_node_processes(changes))]
    left += [f"mount {point}" for point in _mounts_under(changes.roots)]
    for root in changes.cgroup_roots:
        left += [f"cgroup {folder}" for folder in _cgroup_dirs(root)]
    if _bridge_exists(changes.bridge):
        left.append(f"network link {changes.bridge}")
    left += [f"folder {root}" for root in changes.roots if Path(root).exists()]
    if not _other_records(changes):
        left += [f"folder {created}" for created in changes.created_dirs if Path(created).exists()]
    now = read_sysctls()
    if not any(_comm(pid) == "kubelet" for pid in _all_pids()):
        left += [
            f"sysctl {name}={now.get(name)} (was {value})"
            for name, value in changes.sysctls.items()
            if now.get(name) != value
        ]
    return left


def undo_stale() -> list[str]:
    """Undo the records of node pools whose owner process is gone; return what stayed behind."""
    left: list[str] = []
    folder = record_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            changes = HostChanges.load(path)
        except (OSError, ValueError, TypeError):
            continue
        try:
            os.kill(changes.owner_pid, 0)
            continue  # still running: not ours to touch
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        left += undo(changes)
    return left
