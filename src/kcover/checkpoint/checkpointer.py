"""The Checkpointer: async save into shared memory, background persist, verified restore.

``save(step, state)`` blocks training only while the state's tensors are copied
into the host snapshot buffer (:mod:`~kcover.checkpoint.snapshot`, a
``/dev/shm`` file, so the snapshot survives the worker); a background thread
then writes the same bytes to the checkpoint dir (:mod:`~kcover.checkpoint.disk`),
commits them with an atomic manifest rename, reports ``kcover.checkpointed(step)``
to ``kcover run`` and prunes old checkpoints.  Shared memory keeps two
snapshots, the newest and the one before (``memory_snapshots=2``, extra host
memory two state sizes; ``1`` halves that and writes in place, so a worker
killed during a save leaves none): a ``save`` while the previous snapshot is
still being persisted either waits for it (``if_busy="wait"``, the default) or
returns False without saving (``if_busy="skip"``).  With
``save(..., overlap=optimizer)`` the large tensors are copied on a background
thread during the next forward and backward, and the optimizer's step waits
for that copy.

``load_latest()`` restores the newest complete checkpoint this rank can load —
from shared memory when a snapshot there is at least as new as the newest on disk
(a worker restarted on the same machine), else from disk, verifying every
block's checksum and falling back to older checkpoints with a warning.  Under
``torch.distributed`` the ranks agree on one step (:mod:`~kcover.checkpoint.agree`).
On SIGTERM the newest snapshot is persisted before the process ends
(:mod:`~kcover.checkpoint.emergency`).

With ``replicas=N`` (:mod:`~kcover.checkpoint.replication`) each snapshot is
also sent, on a second background thread, to the memory of N buddy ranks on
other nodes; ``load_latest()`` then finds a lost node's steps in its buddies'
memory (``source == "peer"``) and goes to the disk only when no step every
rank can load is left in memory.  A save waits for (or, ``if_busy="skip"``,
skips while) the previous snapshot's replication as it does for its persist.

Write failures never raise into the training loop: they are logged and kept in
``last_error``.

Any number of Checkpointers may read one dir and rank, one may write it: the
first ``save`` or ``reserve`` takes the writer lock (:mod:`~kcover.checkpoint.lock`);
a second writer gets :class:`~kcover.checkpoint.errors.CheckpointInUseError`,
and a reader never removes a file a writer may be using.  Pruning keeps
``keep_last`` loadable checkpoints and never deletes the one just written nor
the newest one this Checkpointer has verified (written, or read back whole).

Called by training scripts, usually as ``Checkpointer()`` under ``kcover run``
(the dir comes from ``KCOVER_CHECKPOINT_DIR``, rank and world size from
``RANK`` / ``WORLD_SIZE``, the snapshot folder from ``KCOVER_SHARED_MEMORY``,
default ``/dev/shm``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import torch

from kcover import sdk
from kcover.checkpoint import disk
from kcover.checkpoint.agree import NONE, agree_on_step, group_size
from kcover.checkpoint.emergency import SigtermGuard
from kcover.checkpoint.errors import CheckpointError, CorruptCheckpointError, WorldSizeChangedError
from kcover.checkpoint.flatten import flatten
from kcover.checkpoint.image import COMMITTED, Header, Image, Plan, make_plan, parse
from kcover.checkpoint.locations import DEFAULT_SHARED_MEMORY, dir_token, shared_memory_dir, snapshot_path
from kcover.checkpoint.lock import WriterLock
from kcover.checkpoint.replication import check_replica_options, start_replication
from kcover.checkpoint.restore import (
    Restored,
    load_from_disk,
    map_private,
    materialize,
    memory_image,
    peer_image,
    usable_manifest,
)
from kcover.checkpoint.snapshot import (
    Region,
    SnapshotBuffer,
    begin_snapshot,
    commit_snapshot,
    copy_tensors,
    withdraw,
)

log = logging.getLogger("kcover.checkpoint")
IfBusy = Literal["wait", "skip"]
OVERLAP_BELOW = 1 << 20  # with save(overlap=…), tensors smaller than this are copied before save returns
MIN_BLOCK_SIZE = 4096  # smaller blocks only make the manifest huge


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


class Checkpointer:
    """Fast, never-torn checkpoints of one rank's state dict (see the module docstring)."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        keep_last: int = 2,
        keep_every: int | None = None,
        if_busy: IfBusy = "wait",
        rank: int | None = None,
        world_size: int | None = None,
        replicated: bool = False,
        shared_memory: str | os.PathLike[str] | None = DEFAULT_SHARED_MEMORY,
        job_id: str | None = None,
        emergency_save: bool = True,
        trusted: bool = False,
        block_size: int = 64 << 20,
        replicas: int = 0,
        replica_bandwidth: float | None = None,
        memory_snapshots: int = 2,
    ) -> None:
        if directory is None:
            directory = os.environ.get("KCOVER_CHECKPOINT_DIR") or None
            if directory is None:
                raise CheckpointError("no checkpoint dir given and KCOVER_CHECKPOINT_DIR is not set")
        if keep_last < 1 or (keep_every is not None and keep_every < 1) or if_busy not in ("wait", "skip"):
            raise ValueError("keep_last and keep_every must be ≥ 1, if_busy 'wait' or 'skip'")
        if type(memory_snapshots) is not int or memory_snapshots not in (1, 2):
            raise ValueError(f"memory_snapshots must be 1 or 2, not {memory_snapshots!r}")
        if block_size < MIN_BLOCK_SIZE:
            raise ValueError(f"block_size must be ≥ {MIN_BLOCK_SIZE} bytes, not {block_size}")
        check_replica_options(replicas, replica_bandwidth)
        self.directory = Path(directory).absolute()
        self.rank = _env_int("RANK", 0) if rank is None else rank
        self.world_size = _env_int("WORLD_SIZE", 1) if world_size is None else world_size
        self.keep_last, self.keep_every, self.if_busy = keep_last, keep_every, if_busy
        self.replicated, self.trusted, self.block_size = replicated, trusted, block_size
        self.last_error: CheckpointError | None = None
        self.persisted_step: int | None = None
        self.last_blocking_seconds = 0.0  # how long the last save() call took
        self.last_step_wait_seconds = 0.0  # how long an optimizer step last waited for an overlapped copy
        self.last_persist_seconds = 0.0
        self.skipped = 0
        shm: Path | None = None
        folder = shared_memory_dir(shared_memory)
        if folder is not None and folder.is_dir():
            shm = snapshot_path(folder, self.directory, self.rank, job_id)
        elif folder is not None:
            log.warning("kcover checkpoint: shared-memory folder %s does not exist; snapshots go to private "
                        "memory (no instant restore after a restart)", folder)
        self._buffer = SnapshotBuffer(shm, keep_previous=memory_snapshots == 2)
        self._replication = start_replication(shm, replicas, replica_bandwidth, self.rank, self.world_size)
        self._replica_thread: threading.Thread | None = None
        self._stop_replication = threading.Event()
        if self._replication is not None:  # a Checkpointer dropped without close() stops serving all the same
            weakref.finalize(self, self._replication.close)
        try:
            self._set_up(job_id, emergency_save)
        except BaseException:
            if self._replication is not None:
                self._replication.close()
            raise

    def _set_up(self, job_id: str | None, emergency_save: bool) -> None:
        self._token = dir_token(self.directory)
        self._writer = WriterLock(self.directory, self.rank)
        self._verified: set[int] = set()  # steps this Checkpointer wrote or read back whole from disk
        self._damaged: set[int] = set()  # steps whose files of this rank failed verification here
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._unpersisted: tuple[int, int] | None = None  # (step, size) in the buffer, not yet on disk
        self._stopping = False
        self._closed = False
        self._world_changed: WorldSizeChangedError | None = None
        self._guard = SigtermGuard(self._emergency) if emergency_save else None
        self._snapshotted = threading.Event()  # clear while an overlapped snapshot is still being copied
        self._snapshotted.set()
        self._watched: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        if self._writer.try_acquire():  # no live writer: remove what a dead one left, and let go
            self._clean_leftovers()
            self._writer.release()
        self._adopt_snapshot()
        if self._guard is not None:
            self._guard.install()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The snapshot lock; a SIGTERM handled meanwhile in this thread waits until it is released."""
        with self._guard.deferred() if self._guard else contextlib.nullcontext(), self._lock:
            yield

    # saving ---------------------------------------------------------------------------------------------------

    def _clean_leftovers(self) -> None:
        disk.clean_leftovers(self.directory, self.rank)
        self._buffer.discard_leftover()

    def _claim(self) -> None:
        """Become the writer of this dir and rank (first save or reserve); raises CheckpointInUseError."""
        if self._writer.held or self._writer.unlocked:
            return
        self._writer.acquire()
        self._clean_leftovers()
        with self._locked():
            self._unpersisted = self._unpersisted_in_memory()

    def save(self, step: int, state: Any, *, persist: bool = True,
             overlap: torch.optim.Optimizer | None = None) -> bool:
        """Snapshot ``state`` as ``step`` (blocking only for the copy), then persist it in the background.

        Returns False when the save was skipped (``if_busy="skip"`` and a persist still running, or the
        process is being terminated).  ``persist=False`` keeps the snapshot in memory only: instant restore
        and the emergency save on SIGTERM, no disk write.

        ``overlap=optimizer`` shortens the block to the small tensors (< 1 MiB: buffers such as batch-norm
        statistics that a forward pass changes): the large ones are copied while the next forward and
        backward run, and that optimizer's next ``step()`` waits until the copy is done (a step pre-hook),
        as CheckFreq does.  Only that optimizer may change the large tensors in between.
        """
        if self._closed:
            raise CheckpointError("this Checkpointer is closed")
        if self._stopping:
            return False
        self._claim()
        began = time.perf_counter()
        skeleton, tensors = flatten(state, self.trusted)
        plan = make_plan(tensors, skeleton, self._token, self.replicated)
        if self.busy:
            if self.if_busy == "skip":
                self.skipped += 1
                log.info("kcover checkpoint: step %d skipped, the previous one is still being persisted", step)
                return False
            self.wait()
            began = time.perf_counter()  # waiting for the disk is the skip policy's business, not the copy's
        with self._guard.deferred() if self._guard else contextlib.nullcontext():
            self._lock.acquire()  # released by whoever finishes the snapshot: here, or the overlap thread
            try:
                if self._stopping:  # SIGTERM arrived while we waited: the emergency save owns the buffer now
                    self._lock.release()
                    return False
                region = self._target(plan.total)
                header = Header(COMMITTED, step, time.time_ns(), plan.total, plan.meta_offset, len(plan.meta),
                                self.rank, self.world_size)
                begin_snapshot(region, header)
                small = (lambda nbytes: nbytes < OVERLAP_BELOW) if overlap is not None else (lambda nbytes: True)
                devices = copy_tensors(region, plan, tensors, small)
            except BaseException:
                self._lock.release()
                raise
            if overlap is None:
                self._finish_snapshot(step, region, plan, devices)
            else:  # started before a deferred SIGTERM runs: the emergency save waits for this thread's lock
                self.last_step_wait_seconds = 0.0
                self._watch_optimizer(overlap)
                self._snapshotted.clear()
                rest = (region, plan, tensors, devices)
                self._thread = threading.Thread(target=self._finish_in_background, args=(step, rest, persist),
                                                name="kcover-snapshot")
                self._thread.start()
        if overlap is None:
            self._replicate_in_background(step, plan.total)
        if overlap is None and persist:
            self._thread = threading.Thread(target=self._persist, args=(step, plan.total), name="kcover-persist")
            self._thread.start()
        self.last_blocking_seconds = time.perf_counter() - began
        return True

    def _finish_snapshot(self, step: int, region: Region, plan: Plan, devices: set[torch.device]) -> None:
        """Commit and publish the snapshot, and release the lock ``save`` took.

        After the first save the second file is reserved at once, in the background, so that the next
        ``save`` does not wait for its page faults.
        """
        try:
            commit_snapshot(region, plan, devices)
            self._buffer.publish(region)
            self._buffer.touch()
            self._unpersisted = (step, plan.total)
            prepare_next = self._buffer.wants_spare()
        finally:
            self._lock.release()
        if prepare_next:
            self._prepare_in_background(plan.total)

    def _finish_in_background(self, step: int, rest: tuple[Region, Plan, list[torch.Tensor], set[torch.device]],
                              persist: bool) -> None:
        region, plan, tensors, devices = rest
        try:
            devices |= copy_tensors(region, plan, tensors, lambda nbytes: nbytes >= OVERLAP_BELOW)
        except BaseException:
            self._lock.release()
            self._snapshotted.set()
            log.exception("kcover checkpoint: step %d: the snapshot copy failed", step)
            return
        self._finish_snapshot(step, region, plan, devices)
        self._snapshotted.set()
        self._replicate_in_background(step, plan.total)
        if persist:
            self._persist(step, plan.total)

    def _replicate_in_background(self, step: int, size: int) -> None:
        """Send the snapshot just committed to the buddies; the buffer is not reused until that is done."""
        if self._replication is None:
            return
        self._replica_thread = threading.Thread(
            target=self._replication.push_all, args=(step, self._buffer.view()[:size], self._stop_replication),
            name="kcover-replicate")
        self._replica_thread.start()

    def _watch_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Once per optimizer: its ``step()`` first waits for a snapshot still being copied."""
        if optimizer in self._watched:
            return
        self._watched.add(optimizer)
        snapshotted = self._snapshotted

        def wait_for_the_snapshot(*_: Any) -> None:
            if not snapshotted.is_set():
                began = time.perf_counter()
                snapshotted.wait()
                self.last_step_wait_seconds = time.perf_counter() - began

        optimizer.register_step_pre_hook(wait_for_the_snapshot)

    def _target(self, size: int) -> Region:
        try:
            return self._buffer.prepare(size)
        except CheckpointError as exc:
            log.warning("kcover checkpoint: %s; snapshots go to private memory (no instant restore after a "
                        "restart)", exc)
            self._buffer.use_private()
            return self._buffer.prepare(size)

    def reserve(self, state: Any) -> None:
        """Reserve the snapshot buffer for ``state`` on a background thread (saves the first ``save`` the cost)."""
        self._claim()
        skeleton, tensors = flatten(state, self.trusted)
        self._prepare_in_background(make_plan(tensors, skeleton, self._token, self.replicated).total)

    def _prepare_in_background(self, size: int) -> None:
        def prepare() -> None:
            with self._lock, contextlib.suppress(CheckpointError):
                if not self._closed:
                    self._buffer.prepare(size).populate()

        threading.Thread(target=prepare, name="kcover-reserve", daemon=True).start()

    @property
    def busy(self) -> bool:
        """True while a snapshot is being copied (``overlap``), persisted or sent to the buddies."""
        return any(thread is not None and thread.is_alive() for thread in (self._thread, self._replica_thread))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the snapshot in flight to be persisted and replicated; True when nothing is in flight any more."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for name in ("_thread", "_replica_thread"):  # in this order: the first may start the second
            thread = getattr(self, name)
            if thread is not None:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not self.busy

    def _persist(self, step: int, size: int) -> None:
        began = time.perf_counter()
        try:
            disk.persist(self.directory, self._buffer.view()[:size], step, self.rank, self.world_size,
                         self.replicated, self.block_size)
        except CheckpointError as exc:
            self.last_error = exc
            log.error("kcover checkpoint: %s; training continues, earlier checkpoints are intact", exc)
            return
        self.last_persist_seconds = time.perf_counter() - began
        self.persisted_step = step
        self._verified.add(step)
        self._damaged.discard(step)
        if self._unpersisted == (step, size):
            self._unpersisted = None
        sdk.checkpointed(step)
        self._prune(step)

    def _prune(self, written: int) -> None:
        """Retention, counting only loadable checkpoints; the one just written and the newest verified stay."""
        try:
            removed = disk.prune(self.directory, self.rank, self.world_size, self.keep_last, self.keep_every,
                                 protect={written, max(self._verified)}, damaged=self._damaged)
        except OSError as exc:
            log.warning("kcover checkpoint: pruning old checkpoints failed: %s", exc)
            return
        self._verified.difference_update(removed)

    def _emergency(self) -> None:
        """On SIGTERM: let a snapshot or persist in progress finish, then persist the newest snapshot.

        Holds the snapshot lock throughout, so no new snapshot can overwrite the bytes being written.
        """
        self._stopping = True
        self._stop_replication.set()  # a replica in flight is abandoned within half a second: persisting comes first
        began = time.perf_counter()
        with self._lock:
            self.wait()
            if self._closed or not self._may_write():
                return
            pending = self._unpersisted
            if pending is not None:
                self._persist(*pending)
                log.warning("kcover checkpoint: SIGTERM: step %d persisted in %.2f s", pending[0],
                            time.perf_counter() - began)

    def _may_write(self) -> bool:
        """For the emergency save: are we the writer, or is there none alive (then we are now)?

        A reader never persists the snapshot of a live writer: that writer's own guard does.
        """
        if self._writer.held or self._writer.unlocked:
            return True
        if not self._writer.try_acquire():
            log.info("kcover checkpoint: SIGTERM: another process writes rank %d's checkpoints; nothing to save here",
                     self.rank)
            return False
        self._unpersisted = self._unpersisted_in_memory()  # as of now, not as of our start
        return True

    def _unpersisted_in_memory(self) -> tuple[int, int] | None:
        """The snapshot in shared memory if it is newer than the disk, as (step, size); caller holds the lock."""
        current = self._buffer.current
        image = memory_image(current, self.rank, self.world_size, self._token) if current is not None else None
        on_disk = max(disk.committed_steps(self.directory, self.rank), default=NONE)
        if image is None or image.header.step <= on_disk:
            return None
        return image.header.step, image.header.total

    def _adopt_snapshot(self) -> None:
        """A snapshot left in shared memory by a previous life of this rank, newer than the disk: not yet safe."""
        with self._locked():
            self._unpersisted = self._unpersisted_in_memory()

    # loading --------------------------------------------------------------------------------------------------

    def _memory_steps(self) -> dict[int, Region]:
        """The steps of the committed snapshots in this rank's memory (the newest and the one before)."""
        steps: dict[int, Region] = {}
        with self._locked():
            for region in self._buffer.regions():
                image = memory_image(region, self.rank, self.world_size, self._token)
                if image is not None:
                    steps.setdefault(image.header.step, region)
        return steps

    def _disk_steps(self) -> dict[int, list[int]]:
        """Committed steps → the ranks whose files this rank may load, best first."""
        if not self.replicated:
            return {s: [self.rank] for s in disk.committed_steps(self.directory, self.rank)}
        return {s: sorted(ranks, key=lambda r: (r != self.rank, r))
                for s, ranks in disk.committed_steps(self.directory, None).items()}

    def latest_step(self) -> int | None:
        """The newest step with a snapshot in memory or a readable manifest on disk (data not yet verified)."""
        steps = [*self._memory_steps(), NONE]
        for step, ranks in self._disk_steps().items():
            with contextlib.suppress(CheckpointError):
                usable_manifest(self.directory, step, ranks[0], self.world_size)
                steps.append(step)
        best = max(steps)
        return None if best == NONE else best

    def _load_memory(self, step: int, region: Region) -> tuple[torch.Tensor, Image, str] | None:
        with self._locked():
            image = memory_image(region, self.rank, self.world_size, self._token)
            if image is None or image.header.step != step or region.path is None:
                return None
            where = str(region.path)
            try:
                private = map_private(region.path, image.header.total)
            except OSError as exc:  # deleted or replaced since it was checked: the disk serves
                log.warning("kcover checkpoint: cannot map the snapshot %s: %s", where, exc)
                return None
            self._buffer.freeze(region, private)  # no later snapshot may overwrite what the restored tensors see
            restored = parse(memoryview(private), where)
        if restored.header.step != step:  # the file changed between the check and the mapping
            return None
        return torch.frombuffer(private, dtype=torch.uint8), restored, where

    def _load_peer(self, step: int, keepers: list[int], device: torch.device | None) -> Restored | None:
        """This rank's replica of ``step`` from the first keeper that has it whole."""
        assert self._replication is not None
        for keeper in keepers:
            where = f"the replica kept by {self._replication.where(keeper)}"
            try:
                data = self._replication.fetch(keeper, step)
                if data is None:
                    continue
                image = peer_image(data, where, step, self.rank, self.world_size, self._token)
            except (CheckpointError, OSError) as exc:
                log.warning("kcover checkpoint: step %d: %s", step, exc)
                if isinstance(exc, WorldSizeChangedError):
                    self._world_changed = exc
                continue
            return materialize(step, data, image, "peer", where, device, self.trusted)
        return None

    def _load_step(self, step: int, memory_steps: dict[int, Region], peer_steps: dict[int, list[int]],
                   disk_steps: dict[int, list[int]], device: torch.device | None) -> Restored | None:
        """``step`` from the fastest place that has it whole: own memory, a buddy's memory, the disk."""
        if step in memory_steps:
            loaded = self._load_memory(step, memory_steps[step])
            if loaded is not None:
                data, image, where = loaded
                return materialize(step, data, image, "memory", where, device, self.trusted)
        if step in peer_steps:
            restored = self._load_peer(step, peer_steps[step], device)
            if restored is not None:
                return restored
        for rank in disk_steps.get(step, []):
            try:
                data, image = load_from_disk(self.directory, step, rank, self.world_size)
            except CheckpointError as exc:
                log.warning("kcover checkpoint: skipping step %d: %s", step, exc)
                if isinstance(exc, WorldSizeChangedError):
                    self._world_changed = exc
                elif isinstance(exc, CorruptCheckpointError) and rank == self.rank:
                    self._damaged.add(step)
                continue
            if rank == self.rank:
                self._verified.add(step)
                self._damaged.discard(step)
            where = str(disk.step_dir(self.directory, step))
            return materialize(step, data, image, "disk", where, device, self.trusted)
        return None

    def load_latest(self, device: str | torch.device | None = None) -> Restored | None:
        """Restore the newest complete, verified checkpoint (see the module docstring); None if there is none.

        Tensors come back on the CPU, as views of one buffer, unless ``device`` is given.  Raises
        :class:`WorldSizeChangedError` when the only checkpoints are sharded ones of another world size.
        """
        self.wait()
        memory_steps = self._memory_steps()
        disk_steps = self._disk_steps()
        peer_steps = self._replication.inventory() if self._replication is not None else {}
        steps = sorted(set(disk_steps) | set(peer_steps) | set(memory_steps), reverse=True)
        self._world_changed = None
        loaded: Restored | None = None
        failed: set[int] = set()

        def load(step: int) -> bool:
            nonlocal loaded
            if loaded is not None and loaded.step == step:
                return True
            if step in failed or step not in steps:
                return False
            loaded = None  # at most one restored state held at a time
            loaded = self._load_step(step, memory_steps, peer_steps, disk_steps,
                                     None if device is None else torch.device(device))
            if loaded is None:
                failed.add(step)
            return loaded is not None

        def best_at_most(bound: int) -> int:
            return next((s for s in steps if s <= bound and load(s)), NONE)

        step = agree_on_step(best_at_most, load)  # an error here (no memory, a peer gone) keeps every replica
        if step == NONE:
            self._forget_replicas(None)  # the job starts over: what is kept belongs to a timeline it abandoned
            if self._world_changed is not None:
                raise self._world_changed
            if steps:
                log.warning("kcover checkpoint: rank %d holds step(s) %s, but no step that every rank can load: "
                            "nothing is restored", self.rank, ", ".join(map(str, steps[:5])))
            return None
        load(step)
        assert loaded is not None
        self._forget_replicas(step)
        self._forget_newer_snapshots(step)
        if loaded.source != "disk":
            log.info("kcover checkpoint: step %d restored from %s", step, loaded.where)
        return loaded

    def _forget_newer_snapshots(self, restored: int) -> None:
        """This rank's checkpoints after the step the ranks agreed on belong to an abandoned timeline.

        They are withdrawn — memory snapshots marked uncommitted, disk checkpoints uncommitted (the manifest
        goes; the image is removed with the leftovers) — so that when the job redoes such a step and some rank
        dies before committing it again, no rank can resume from the old one while the others take the new
        one (nor can the emergency save persist it).  Only checkpoints this world size can load are touched
        (a sharded one of another world size, or one found damaged, stays), only when ranks agreed (alone,
        a newer step is one this process failed to load, perhaps for a passing reason: it stays), and only
        by the writer or a process that may become it.
        """
        if group_size() == 1:
            return
        with self._locked():
            memory = [region for region in self._buffer.regions()
                      if (image := memory_image(region, self.rank, self.world_size, self._token)) is not None
                      and image.header.step > restored]
            on_disk = [step for step in disk.committed_steps(self.directory, self.rank)
                       if step > restored and step not in self._damaged
                       and disk.looks_loadable(self.directory, step, self.rank, self.world_size)]
            if not memory and not on_disk:
                return
            taken = not self._writer.held and not self._writer.unlocked and self._writer.try_acquire()
            if not (taken or self._writer.held or self._writer.unlocked):
                return  # a live writer elsewhere: its checkpoints are its own business
            for region in memory:
                withdraw(region)
            for step in on_disk:
                disk.withdraw(self.directory, step, self.rank)
                self._verified.discard(step)
            if on_disk:
                log.warning("kcover checkpoint: rank %d's step(s) %s on disk were withdrawn: not every rank could "
                            "load them, and the job resumes from step %d", self.rank,
                            ", ".join(map(str, sorted(on_disk))), restored)
            if self._unpersisted is not None and self._unpersisted[0] > restored:
                self._unpersisted = None
            if taken:
                self._writer.release()

    def _forget_replicas(self, restored: int | None) -> None:
        """Replicas kept here of steps after the one restored belong to a timeline the job has abandoned."""
        if self._replication is not None:
            self._replication.store.drop_newer_than(restored)

    # lifetime -------------------------------------------------------------------------------------------------

    def close(self, remove_snapshot: bool = False) -> None:
        """Finish the persist and replication in flight and release the snapshot buffer (deleted only if
        ``remove_snapshot``, together with the replicas this rank keeps for its peers)."""
        if self._closed:
            return
        self.wait()
        if self._guard is not None:
            self._guard.uninstall()
        with self._locked():
            self._closed = True
            self._unpersisted = None
            self._buffer.close(remove=remove_snapshot)
            self._writer.release()
        if self._replication is not None:
            self._replication.close(remove=remove_snapshot)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

