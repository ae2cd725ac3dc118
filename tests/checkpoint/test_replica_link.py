"""The replica side channel and store, attacked directly: wrong secrets, torn and damaged transfers, no room.

A real server on a real socket, real files in /dev/shm; the buddy choice as a pure function.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcover.checkpoint import replica_link
from kcover.checkpoint.buddies import Peer, buddies_of
from kcover.checkpoint.errors import CheckpointWriteError, CorruptCheckpointError
from kcover.checkpoint.image import COMMITTED, HEADER_SIZE, WRITING, Header, pack_header
from kcover.checkpoint.replica_store import STALE_PARTIAL_SECONDS, ReplicaStore
from kcover.checkpoint.replication import Replication

SECRET = b"s" * replica_link.SECRET_SIZE
PREFIX = "kcover-0123456789abcdef-rank"


@pytest.fixture
def server(shm_dir: Path) -> Iterator[replica_link.ReplicaServer]:
    keeper = replica_link.ReplicaServer(ReplicaStore(shm_dir, PREFIX))
    keeper.secret = SECRET
    yield keeper
    keeper.close()


def push(server: replica_link.ReplicaServer, step: int, data: bytes, **options: object) -> bool:
    return replica_link.push("127.0.0.1", server.port, SECRET, 3, step, memoryview(data), **options)  # type: ignore[arg-type]


def names(server: replica_link.ReplicaServer) -> list[str]:
    return sorted(p.name[len(PREFIX):] for p in server.store.folder.iterdir())


def opened(server: replica_link.ReplicaServer, op: bytes = b"P") -> socket.socket:
    """A raw connection past the handshake (the test then speaks the protocol by hand)."""
    conn = socket.create_connection(("127.0.0.1", server.port))
    nonce = replica_link._receive_exactly(conn, replica_link.NONCE_SIZE)
    conn.sendall(replica_link._OPEN.pack(replica_link.MAGIC, replica_link._proof(SECRET, nonce, op), op))
    return conn


def die_mid_transfer(server: replica_link.ReplicaServer, step: int, sent: bytes) -> None:
    """Announce a 10 MB replica of ``step``, send ``sent`` of it and vanish; returns once the keeper cleaned up."""
    with opened(server) as conn:
        conn.sendall(replica_link._PUSH.pack(3, step, 10_000_000))
        assert conn.recv(1) == bytes([replica_link.OK])
        conn.sendall(sent)
        wait_for(lambda: any(n.endswith(".img.next") for n in names(server)))
    wait_for(lambda: not any(n.endswith(".img.next") for n in names(server)))


def wait_for(condition: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_pushed_replicas_come_back_byte_for_byte_and_only_two_steps_are_kept(
        server: replica_link.ReplicaServer) -> None:
    for step in (1, 2, 3):
        assert push(server, step, bytes([step]) * 100_000)
    assert [n[:15] for n in names(server)] == ["00003.replica-s", "00003.replica-s"]
    assert [h.step for h in server.store.held()] == [2, 3]
    fetched = replica_link.fetch("127.0.0.1", server.port, SECRET, 3, 3)
    assert fetched is not None and bytes(fetched.numpy()) == b"\x03" * 100_000
    assert replica_link.fetch("127.0.0.1", server.port, SECRET, 3, 1) is None  # pruned
    assert replica_link.fetch("127.0.0.1", server.port, SECRET, 4, 3) is None  # nobody's replica
    server.store.drop_newer_than(2)
    assert [h.step for h in server.store.held()] == [2]


def test_a_new_replica_reuses_the_oldest_ones_file_and_a_failed_one_leaves_the_newest(
        server: replica_link.ReplicaServer) -> None:
    assert push(server, 1, b"1" * 300_000) and push(server, 2, b"2" * 200_000)
    oldest = server.store.find(3, 1)
    assert oldest is not None
    inode = oldest.path.stat().st_ino
    assert push(server, 3, b"3" * 100_000)  # shorter than the file it is written into
    assert [h.step for h in server.store.held()] == [2, 3]
    newest = server.store.find(3, 3)
    assert newest is not None and newest.path.stat().st_ino == inode  # step 1's pages, reused
    assert newest.path.read_bytes() == b"3" * 100_000  # cut to its own length: nothing of step 1 is left
    fetched = replica_link.fetch("127.0.0.1", server.port, SECRET, 3, 3)
    assert fetched is not None and bytes(fetched.numpy()) == b"3" * 100_000
    die_mid_transfer(server, 4, b"4" * 1_000_000)  # step 2's file was taken for it, step 3 stays
    assert [h.step for h in server.store.held()] == [3]
    assert push(server, 4, b"4" * 1000)  # one replica held: a new file, the newest is not touched
    assert [h.step for h in server.store.held()] == [3, 4]
    newest = server.store.find(3, 3)
    assert newest is not None and newest.path.read_bytes() == b"3" * 100_000


def test_a_recycled_file_is_not_taken_for_a_killed_writers_by_another_keeper(shm_dir: Path) -> None:
    """Keepers of one job share a node's folder and sweep each other's dead partials: a replica written into
    an old replica's file must not look dead (its modification time is the old replica's)."""
    store = ReplicaStore(shm_dir, PREFIX)
    for step in (1, 2):
        data = bytes([step]) * 1000
        partial, crc = store.receive(3, step, len(data), functools.partial(_fill_from, data=data), lambda: None)
        store.commit(partial, 3, step, crc)
    long_ago = time.time() - 10 * STALE_PARTIAL_SECONDS
    for held in store.held():
        os.utime(held.path, (long_ago, long_ago))
    arrived = threading.Event()
    release = threading.Event()

    def slow(view: memoryview) -> int:
        arrived.set()
        release.wait(10)
        return _fill_from(view, data=b"\x03" * 1000)

    receiving = threading.Thread(target=lambda: result.append(store.receive(3, 3, 1000, slow, lambda: None)))
    result: list[tuple[Path, int]] = []
    receiving.start()
    assert arrived.wait(10)
    ReplicaStore(shm_dir, PREFIX)  # another keeper starts and sweeps
    release.set()
    receiving.join(10)
    (partial, crc), = result
    store.commit(partial, 3, 3, crc)  # still there: not taken for a dead one
    assert [h.step for h in store.held()] == [2, 3]


def _fill_from(view: memoryview, *, data: bytes) -> int:
    view[: len(data)] = data[: len(view)]
    return min(len(view), len(data))


def test_a_push_that_comes_before_the_keeper_has_the_secret_waits_for_it(shm_dir: Path) -> None:
    """A peer can leave the set-up's collective and push before this rank has stored the secret."""
    keeper = replica_link.ReplicaServer(ReplicaStore(shm_dir, PREFIX))
    try:
        threading.Timer(0.5, lambda: setattr(keeper, "secret", SECRET)).start()
        assert replica_link.push("127.0.0.1", keeper.port, SECRET, 3, 1, memoryview(b"early" * 100))
        assert [h.step for h in keeper.store.held()] == [1]
    finally:
        keeper.close()


def test_closing_a_keeper_ends_a_handshake_that_waits_for_the_secret(shm_dir: Path) -> None:
    keeper = replica_link.ReplicaServer(ReplicaStore(shm_dir, PREFIX))  # its secret never comes
    with socket.create_connection(("127.0.0.1", keeper.port)) as conn:
        nonce = replica_link._receive_exactly(conn, replica_link.NONCE_SIZE)
        conn.sendall(replica_link._OPEN.pack(replica_link.MAGIC, replica_link._proof(SECRET, nonce, b"P"), b"P"))
        wait_for(lambda: keeper._active)
        keeper.close(wait=2.0)  # shorter than the handshake deadline the connection would otherwise wait out
        assert not keeper._active
        assert conn.recv(1) == b""  # refused: there is no secret to check it against


def test_a_second_life_of_the_same_step_replaces_the_first(server: replica_link.ReplicaServer) -> None:
    assert push(server, 7, b"old" * 1000) and push(server, 7, b"new" * 1000)
    (held,) = server.store.held()
    assert held.path.read_bytes() == b"new" * 1000


def test_a_wrong_secret_or_garbage_is_served_nothing(server: replica_link.ReplicaServer) -> None:
    assert push(server, 1, b"x" * 1000)
    with pytest.raises(ConnectionError):
        replica_link.fetch("127.0.0.1", server.port, b"w" * replica_link.SECRET_SIZE, 3, 1)
    with pytest.raises(ConnectionError):
        replica_link.push("127.0.0.1", server.port, b"w" * replica_link.SECRET_SIZE, 3, 2, memoryview(b"y" * 10))
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        try:
            conn.sendall(b"\xff" * 1_000_000)  # a 1 MB line of nothing in particular
            assert len(conn.recv(replica_link.NONCE_SIZE)) == replica_link.NONCE_SIZE  # the challenge, then nothing
            assert conn.recv(1) == b""  # closed (or reset, below: the rest was never read)
        except ConnectionResetError:
            pass
    assert [h.step for h in server.store.held()] == [1]


def test_a_sender_that_dies_mid_transfer_leaves_the_previous_replica_and_no_file(
        server: replica_link.ReplicaServer) -> None:
    assert push(server, 1, b"a" * 1000)
    die_mid_transfer(server, 2, b"b" * 4_000_000)
    assert [h.step for h in server.store.held()] == [1]


def test_a_replica_damaged_on_the_way_is_refused(server: replica_link.ReplicaServer) -> None:
    assert push(server, 1, b"a" * 1000)
    with opened(server) as conn:
        conn.sendall(replica_link._PUSH.pack(3, 2, 4))
        assert conn.recv(1) == bytes([replica_link.OK])
        conn.sendall(b"abcd" + replica_link._CRC.pack(12345))
        assert conn.recv(1) == bytes([replica_link.FAILED])
    assert [h.step for h in server.store.held()] == [1] and not any(n.endswith(".next") for n in names(server))


def test_a_replica_damaged_in_the_keepers_memory_is_not_restored(server: replica_link.ReplicaServer) -> None:
    assert push(server, 1, b"a" * 1000)
    (held,) = server.store.held()
    held.path.write_bytes(b"a" * 999 + b"b")
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch"):
        replica_link.fetch("127.0.0.1", server.port, SECRET, 3, 1)


def test_no_room_in_the_keepers_memory_is_a_clear_refusal(server: replica_link.ReplicaServer) -> None:
    assert push(server, 1, b"a" * 1000)
    for size in (1 << 45, 1 << 50, (1 << 64) - 1):  # 32 TiB: posix_fallocate refuses it; the others are no size
        with opened(server) as conn:
            conn.sendall(replica_link._PUSH.pack(3, 2, size))
            assert conn.recv(1) == bytes([replica_link.FAILED])
    assert [h.step for h in server.store.held()] == [1] and not any(n.endswith(".next") for n in names(server))


def test_the_sender_sees_a_refusal_as_an_error(server: replica_link.ReplicaServer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def no_room(*_: object) -> None:
        raise CheckpointWriteError("no room")

    monkeypatch.setattr(server.store, "receive", no_room)
    with pytest.raises(CheckpointWriteError, match=r"refused rank 3's replica of step 1 .*no room"):
        push(server, 1, b"a" * 1000 * 1000)


def test_pacing_and_stopping_mid_transfer(server: replica_link.ReplicaServer) -> None:
    began = time.monotonic()
    assert push(server, 1, b"a" * (3 * replica_link.CHUNK), bandwidth=replica_link.CHUNK * 20)
    assert time.monotonic() - began >= 0.1  # three chunks at 20 chunks a second: at least 0.15 s
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    began = time.monotonic()
    assert not push(server, 2, b"b" * (8 * replica_link.CHUNK), bandwidth=replica_link.CHUNK, stop=stop)  # 8 s paced
    assert time.monotonic() - began < 2
    wait_for(lambda: not any(n.endswith(".next") for n in names(server)))
    assert [h.step for h in server.store.held()] == [1]


def niceness_of_threads() -> list[int]:
    """The nice value of each of this process's threads (Linux keeps one per thread)."""
    values = []
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            values.append(int(stat.read_text().rsplit(")", 1)[1].split()[16]))
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
    return values


def test_replication_runs_at_the_lowest_priority_and_the_training_thread_keeps_its_own(
        server: replica_link.ReplicaServer, shm_dir: Path) -> None:
    """Both ends of a push (the sender's thread and the keeper's receiving one, with their checksum threads)
    yield to the training; the thread that asked for the push and a restore's fetch are not lowered."""
    sender_store = ReplicaStore(shm_dir / "sender", PREFIX)
    (shm_dir / "sender").mkdir()
    table = [Peer(3, "node-a", "127.0.0.1", 1), Peer(0, "node-b", "127.0.0.1", server.port)]
    replication = Replication(sender_store, replica_link.ReplicaServer(sender_store), table, 3, 1,
                              bandwidth=replica_link.CHUNK)
    replication.server.secret = SECRET
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    if max(niceness_of_threads()) >= replica_link.YIELDING_NICENESS:
        pytest.skip("this process already runs at the lowest priority: nothing to tell apart")
    stop = threading.Event()
    data = memoryview(b"r" * (3 * replica_link.CHUNK))
    pushing = threading.Thread(target=replication.push_all, args=(5, data, stop))
    pushing.start()  # paced to a chunk a second: three seconds, cut short below
    try:
        wait_for(lambda: niceness_of_threads().count(replica_link.YIELDING_NICENESS) == 4)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
    finally:
        stop.set()
        pushing.join(5)
        replication.close()
    wait_for(lambda: replica_link.YIELDING_NICENESS not in niceness_of_threads())
    assert push(server, 6, b"x" * 1000)
    # the keeper's receiving thread may still be ending (lowered, as it should be) when push returns
    wait_for(lambda: replica_link.YIELDING_NICENESS not in niceness_of_threads())
    fetched = replica_link.fetch("127.0.0.1", server.port, SECRET, 3, 6)
    assert fetched is not None and max(niceness_of_threads()) < replica_link.YIELDING_NICENESS


@pytest.fixture
def stalled_keeper() -> Iterator[int]:
    """A keeper that says yes to a push and then reads nothing more (a node that died without a reset)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        conn, _ = listener.accept()
        held.append(conn)
        conn.sendall(b"n" * replica_link.NONCE_SIZE)
        replica_link._receive_exactly(conn, replica_link._OPEN.size + replica_link._PUSH.size)
        conn.sendall(bytes([replica_link.OK]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    thread.join(5)
    for conn in held:
        conn.close()
    listener.close()


def test_a_stalled_keeper_is_left_at_once_when_stopped(stalled_keeper: int) -> None:
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    began = time.monotonic()
    assert not replica_link.push("127.0.0.1", stalled_keeper, SECRET, 3, 1, memoryview(b"x" * (64 << 20)), stop=stop)
    assert time.monotonic() - began < 1.0 + 2 * replica_link.POLL_SECONDS + 0.5


def test_a_stalled_keeper_is_given_up(stalled_keeper: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replica_link, "STALL_SECONDS", 1.0)
    with pytest.raises(replica_link.PeerStalledError, match="took nothing for 1 s"):
        replica_link.push("127.0.0.1", stalled_keeper, SECRET, 3, 1, memoryview(b"x" * (64 << 20)))


def test_closing_the_keeper_cuts_a_push_in_progress_and_leaves_nothing(server: replica_link.ReplicaServer) -> None:
    assert push(server, 1, b"a" * 1000)
    errors: list[BaseException] = []

    def slow() -> None:
        try:
            push(server, 2, b"b" * (40 * replica_link.CHUNK), bandwidth=replica_link.CHUNK * 4)  # 10 s paced
        except (OSError, CheckpointWriteError) as exc:
            errors.append(exc)

    sender = threading.Thread(target=slow)
    sender.start()
    wait_for(lambda: any(n.endswith(".next") for n in names(server)))
    server.close()
    sender.join(30)
    assert errors and not any(n.endswith(".next") for n in names(server))
    assert [h.step for h in server.store.held()] == [1]


def test_a_going_back_drops_the_abandoned_timelines_replicas(server: replica_link.ReplicaServer) -> None:
    for step in (10, 11):
        assert push(server, step, bytes([step]) * 1000)
    assert push(server, 3, b"\x03" * 1000)  # the job went back to step 2 and saved step 3 again
    assert [h.step for h in server.store.held()] == [3]
    assert push(server, 4, b"\x04" * 1000)
    assert [h.step for h in server.store.held()] == [3, 4]
    server.store.drop_newer_than(None)
    assert server.store.held() == []


def test_partials_of_killed_writers_are_removed_live_ones_kept(shm_dir: Path) -> None:
    dead = shm_dir / f"{PREFIX}00003.replica-pdeadbeef-0.img.next"
    live = shm_dir / f"{PREFIX}00004.replica-pfeedf00d-0.img.next"
    for path in (dead, live):
        path.write_bytes(b"x" * 100)
    os.utime(dead, (time.time() - 3600, time.time() - 3600))
    ReplicaStore(shm_dir, PREFIX)
    assert not dead.exists() and live.exists()


def test_many_idle_connections_do_not_stop_the_keeper(server: replica_link.ReplicaServer) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(replica_link.MAX_CONNECTIONS + 10)]
    try:
        time.sleep(replica_link.HANDSHAKE_SECONDS + 1)  # their handshakes time out: their places are free again
        assert push(server, 1, b"a" * 1000)
    finally:
        for conn in idle:
            conn.close()


def test_a_keeper_that_is_gone_is_an_oserror(server: replica_link.ReplicaServer) -> None:
    port = server.port
    server.close()
    with pytest.raises(OSError):
        replica_link.push("127.0.0.1", port, SECRET, 3, 1, memoryview(b"a"))


def test_buddies_are_on_other_nodes_each_on_its_own() -> None:
    peers = [Peer(rank, f"n{rank // 2}", "h", 1) for rank in range(8)]  # 4 nodes × 2 ranks
    assert buddies_of(peers, 0, 1) == [2] and buddies_of(peers, 1, 1) == [3] and buddies_of(peers, 7, 1) == [1]
    assert buddies_of(peers, 0, 3) == [2, 4, 6]
    assert buddies_of(peers, 0, 9) == [2, 4, 6]  # as many as there are other nodes
    lone = [Peer(rank, "same", "h", 1) for rank in range(4)]
    assert buddies_of(lone, 2, 1) == []
    uneven = [Peer(0, "a", "h", 1), Peer(1, "a", "h", 1), Peer(2, "a", "h", 1), Peer(3, "b", "h", 1)]
    assert [buddies_of(uneven, r, 1) for r in range(4)] == [[3], [3], [3], [0]]
    renamed = [Peer(rank, "spare" if rank < 2 else f"n{rank // 2}", "h", 1) for rank in range(8)]
    assert [buddies_of(renamed, r, 1) for r in range(8)] == [buddies_of(peers, r, 1) for r in range(8)]


def test_something_else_at_the_replicas_name_or_a_bad_rank_is_refused(server: replica_link.ReplicaServer) -> None:
    assert push(server, 1, b"a" * 1000)
    (server.store.folder / f"{PREFIX}00003.replica-s2-c{zlib.crc32(b'b' * 1000):08x}.img").mkdir()
    with pytest.raises(CheckpointWriteError, match="refused rank 3's replica of step 2"):
        push(server, 2, b"b" * 1000)
    assert not any(n.endswith(".next") for n in names(server))
    with pytest.raises(CheckpointWriteError, match="refused rank -1's replica"):
        replica_link.push("127.0.0.1", server.port, SECRET, -1, 5, memoryview(b"c" * 10))
    assert [h.step for h in server.store.held()] == [1]


def left_behind(folder: Path, rank: int, step: int, payload: bytes, *, state: int = COMMITTED,
                header_rank: int | None = None) -> bytes:
    """Write ``rank``'s own snapshot file as a process that ran on this node leaves it (the buffer is larger
    than the image: 4 kB of slack after it); returns the image's bytes."""
    total = HEADER_SIZE + len(payload)
    header = Header(state, step, 1, total, total, 0, rank if header_rank is None else header_rank, 8)
    image = pack_header(header).ljust(HEADER_SIZE, b"\0") + payload
    (folder / f"{PREFIX}{rank:05d}.img").write_bytes(image + b"\xee" * 4096)
    return image


def test_a_snapshot_left_by_a_rank_now_elsewhere_is_served_as_its_replica(server: replica_link.ReplicaServer) -> None:
    """Rank 5 ran on this node and was rescheduled elsewhere: its committed snapshot is offered and served up
    to the image's end; ranks on this node (not in ``serves``) are not offered, nor are unfinished snapshots,
    a header that names another rank, a FIFO or a symlink at the snapshot's name."""
    folder = server.store.folder
    image = left_behind(folder, 5, 7, os.urandom(100_000))
    left_behind(folder, 1, 7, b"on this node")
    left_behind(folder, 2, 7, b"half written", state=WRITING)
    left_behind(folder, 4, 7, b"another rank's", header_rank=6)
    os.mkfifo(folder / f"{PREFIX}00003.img")
    (folder / f"{PREFIX}00006.img").symlink_to(folder / f"{PREFIX}00005.img")
    assert server.store.offered() == []  # nothing is served before the ranks elsewhere are known
    server.store.serves = frozenset({2, 3, 4, 5, 6})
    assert [(h.rank, h.step, h.crc32) for h in server.store.offered()] == [(5, 7, None)]
    fetched = replica_link.fetch("127.0.0.1", server.port, SECRET, 5, 7)
    assert fetched is not None and fetched.numpy().tobytes() == image
    for rank, step in [(5, 6), (1, 7), (2, 7), (3, 7), (4, 7), (6, 7)]:
        assert replica_link.fetch("127.0.0.1", server.port, SECRET, rank, step) is None
    server.store.drop_newer_than(None)  # a start-over drops replicas, never another rank's own snapshot
    assert server.store.find(5, 7) is not None


def test_a_left_snapshot_rewritten_while_it_is_served_is_not_served(server: replica_link.ReplicaServer) -> None:
    """Its writer came back between the listing and the serving: the header no longer says the step offered."""
    folder = server.store.folder
    server.store.serves = frozenset({5})
    left_behind(folder, 5, 7, b"x" * 10_000)
    (held,) = server.store.offered()
    left_behind(folder, 5, 8, b"y" * 10_000)
    fd = os.open(held.path, os.O_RDONLY)
    try:
        assert server.store.extent(held, fd) is None
    finally:
        os.close(fd)
    assert replica_link.fetch("127.0.0.1", server.port, SECRET, 5, 7) is None
    assert replica_link.fetch("127.0.0.1", server.port, SECRET, 5, 8) is not None
