"""The side channel replicas travel on: one small TCP server per rank, push and fetch.

Replicas do not use the job's process group: a collective would queue behind
(or in front of) the training's own, and a rank would have to take part in
every transfer.  Each rank with replicas listens on a port of its own
(:class:`ReplicaServer`, threads only, so it serves while the training thread
computes or waits in a collective).  Every connection opens with
a 16-byte challenge from the server, answered with ``KCVRREP1``, the
HMAC-SHA256 of the challenge and the operation under the job's secret (a random
value rank 0 shares over the process group: the secret itself never travels)
and the operation:

``P`` push ``rank step size``; the server answers one status byte once it has
reserved the room (or refuses: no room); then come the image's bytes, then
their CRC-32: the server writes them to its
:class:`~kcover.checkpoint.replica_store.ReplicaStore` and commits only when
the checksum matches; it answers a second status byte.
``F`` fetch ``rank step``: the server answers ``status size crc`` and the bytes
(``sendfile``: the kernel copies from shared memory to the socket).

:func:`push` paces itself to ``bandwidth`` bytes per second when given, stops
within half a second when ``stop`` is set, and gives up on a keeper that takes
nothing for ``STALL_SECONDS`` (a lost node often sends no reset); :func:`fetch`
verifies the checksum before it returns.  The server listens on the address
peers reach it at only, takes at most ``MAX_CONNECTIONS`` at once, drops a
connection whose handshake takes over ``HANDSHAKE_SECONDS``, and keeps serving
through a shortage of file descriptors.  Both ends of a push run at the lowest CPU
priority (:func:`yield_to_training`); a fetch, which a restore waits for, does not.
Called by :mod:`~kcover.checkpoint.replication`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct
import threading
import time

import torch

from kcover.checkpoint.checksums import Checksums
from kcover.checkpoint.errors import CheckpointWriteError, CorruptCheckpointError
from kcover.checkpoint.files import open_regular
from kcover.checkpoint.landing import landing_buffer
from kcover.checkpoint.replica_store import ReplicaStore

log = logging.getLogger("kcover.checkpoint")
MAGIC = b"KCVRREP1"
SECRET_SIZE = 32
NONCE_SIZE = 16
CHUNK = 4 << 20  # a push is paced between chunks of this size
SEND_PIECE = 1 << 20
RECEIVE_CHUNK = 16 << 20
POLL_SECONDS = 0.5  # how often a blocked push looks at its stop event
STALL_SECONDS = 10.0  # a peer that moves no byte for this long is given up
HANDSHAKE_SECONDS = 5.0
IDLE_SECONDS = 60.0  # a connection that sends nothing for this long is dropped
MAX_CONNECTIONS = 64
YIELDING_NICENESS = 19  # pushes and receipts run at the lowest priority (see yield_to_training)
_OPEN = struct.Struct("<8s32sc")
_PUSH = struct.Struct("<iqQ")
_FETCH = struct.Struct("<iq")
_ANSWER = struct.Struct("<BQI")
_CRC = struct.Struct("<I")
OK, MISSING, FAILED = 0, 1, 2
MAX_RANK = 100_000  # replica names hold five digits
MAX_SIZE = 1 << 46  # 64 TiB: anything larger is a corrupt or hostile header


class PeerStalledError(ConnectionError):
    """The peer moved no byte for ``STALL_SECONDS``."""


def _proof(secret: bytes, nonce: bytes, op: bytes) -> bytes:
    return hmac.new(secret, nonce + op, hashlib.sha256).digest()


def _receive_exactly(conn: socket.socket, size: int, stop: threading.Event | None = None) -> bytes:
    """``size`` bytes; ConnectionError when the peer closes, PeerStalledError when it goes quiet (or ``stop``)."""
    data = bytearray()
    quiet_since = time.monotonic()
    while len(data) < size:
        try:
            chunk = conn.recv(size - len(data))
        except TimeoutError:
            if (stop is not None and stop.is_set()) or time.monotonic() - quiet_since > STALL_SECONDS:
                raise PeerStalledError("the peer went quiet") from None
            continue
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
        quiet_since = time.monotonic()
    return bytes(data)


def _send_all(conn: socket.socket, data: memoryview, stop: threading.Event) -> bool:
    """Send ``data`` in pieces; False when ``stop`` was set first, PeerStalledError when the peer takes nothing."""
    quiet_since = time.monotonic()
    while data:
        if stop.is_set():
            return False
        try:
            sent = conn.send(data[:SEND_PIECE])
        except TimeoutError:
            if time.monotonic() - quiet_since > STALL_SECONDS:
                raise PeerStalledError(f"the keeper took nothing for {STALL_SECONDS:g} s") from None
            continue
        data = data[sent:]
        quiet_since = time.monotonic()
    return True


class ReplicaServer:
    """Serves pushes into and fetches from ``store`` until :meth:`close`; nobody is served before
    :attr:`secret` is set (a connection that comes earlier waits for it, within its handshake deadline: a
    peer may finish the set-up's collective and push before this rank has stored the secret)."""

    def __init__(self, store: ReplicaStore, host: str = "", port: int = 0) -> None:
        self.store = store
        self._secret = b""
        self._has_secret = threading.Event()
        if ":" in host or (not host and socket.has_dualstack_ipv6()):
            self._listener = socket.create_server((host, port), family=socket.AF_INET6, dualstack_ipv6=not host)
        else:
            self._listener = socket.create_server((host, port))
        self.port = int(self._listener.getsockname()[1])
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._active: dict[socket.socket, threading.Thread] = {}
        self._thread = threading.Thread(target=self._accept, name="kcover-replica-server", daemon=True)
        self._thread.start()

    @property
    def secret(self) -> bytes:
        return self._secret

    @secret.setter
    def secret(self, value: bytes) -> None:
        self._secret = value
        self._has_secret.set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError as exc:
                if self._closed.is_set() or exc.errno in (errno.EBADF, errno.EINVAL):
                    return
                log.warning("kcover checkpoint: the replica server cannot accept a connection: %s", exc)
                self._closed.wait(0.5)  # out of descriptors, for a moment: serve again afterwards
                continue
            with self._lock:
                crowded = len(self._active) >= MAX_CONNECTIONS or self._closed.is_set()
                thread = threading.Thread(target=self._serve, args=(conn,), name="kcover-replica-conn", daemon=True)
                if not crowded:
                    self._active[conn] = thread
            if crowded:
                conn.close()
                continue
            try:
                thread.start()
            except RuntimeError:
                with self._lock:
                    self._active.pop(conn, None)
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(HANDSHAKE_SECONDS)
                nonce = secrets.token_bytes(NONCE_SIZE)
                conn.sendall(nonce)
                deadline = time.monotonic() + HANDSHAKE_SECONDS
                opening = b""
                while len(opening) < _OPEN.size and time.monotonic() < deadline:
                    piece = conn.recv(_OPEN.size - len(opening))
                    if not piece:
                        return
                    opening += piece
                if len(opening) < _OPEN.size:
                    return
                magic, proof, op = _OPEN.unpack(opening)
                if magic != MAGIC:
                    return
                self._has_secret.wait(max(0.0, deadline - time.monotonic()))  # set at once by close()
                if len(self.secret) != SECRET_SIZE \
                        or not hmac.compare_digest(proof, _proof(self.secret, nonce, op)):
                    return
                conn.settimeout(IDLE_SECONDS)
                if op == b"P":
                    yield_to_training()  # this thread ends with the push
                    self._take_push(conn)
                elif op == b"F":
                    self._give(conn)
        except (OSError, struct.error) as exc:
            log.debug("kcover checkpoint: replica connection dropped: %s", exc)
        finally:
            with self._lock:
                self._active.pop(conn, None)

    def _take_push(self, conn: socket.socket) -> None:
        rank, step, size = _PUSH.unpack(_receive_exactly(conn, _PUSH.size))
        if not 0 <= rank < MAX_RANK or size > MAX_SIZE:
            conn.sendall(bytes([FAILED]))
            return
        try:
            partial, crc = self.store.receive(rank, step, size, lambda view: receive_into(conn, view),
                                              lambda: conn.sendall(bytes([OK])))
        except CheckpointWriteError as exc:
            log.warning("kcover checkpoint: %s", exc)
            with contextlib.suppress(OSError):
                conn.sendall(bytes([FAILED]))
            return
        try:
            (expected,) = _CRC.unpack(_receive_exactly(conn, _CRC.size))
            if expected != crc:
                log.warning("kcover checkpoint: rank %d's replica of step %d arrived damaged; the previous one "
                            "stays", rank, step)
                raise CheckpointWriteError("damaged")
            if self._closed.is_set():
                raise CheckpointWriteError("closing")
            self.store.commit(partial, rank, step, crc)
        except (OSError, CheckpointWriteError) as exc:  # damaged, closing, or something not ours at the name
            self.store.discard(partial)
            if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
                log.warning("kcover checkpoint: cannot keep rank %d's replica of step %d: %s", rank, step, exc)
            with contextlib.suppress(OSError):
                conn.sendall(bytes([FAILED]))
            return
        conn.sendall(bytes([OK]))

    def _give(self, conn: socket.socket) -> None:
        rank, step = _FETCH.unpack(_receive_exactly(conn, _FETCH.size))
        held = self.store.find(rank, step)
        fd = -1
        if held is not None:
            with contextlib.suppress(OSError):
                fd = open_regular(held.path)
        if held is None or fd < 0:
            conn.sendall(_ANSWER.pack(MISSING, 0, 0))
            return
        with os.fdopen(fd, "rb") as source:
            extent = self.store.extent(held, source.fileno())
            if extent is None:
                conn.sendall(_ANSWER.pack(MISSING, 0, 0))
                return
            size, crc = extent
            conn.sendall(_ANSWER.pack(OK, size, crc))
            conn.sendfile(source, 0, size)

    def close(self, wait: float = 5.0) -> None:
        """Stop accepting, cut the connections in progress (a push in progress leaves nothing), and wait
        for them to end, at most ``wait`` seconds."""
        self._closed.set()
        self._has_secret.set()  # a handshake waiting for a secret that never comes ends now (and fails)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            active = list(self._active.items())
        for conn, _ in active:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + wait
        for _, thread in active:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._thread.join(max(0.0, deadline - time.monotonic()))


def yield_to_training() -> None:
    """Lower the calling thread's CPU priority to the least (and the threads it starts, which inherit it).

    Replicas are background work: on a node whose CPUs the training keeps busy (data loading, a CPU
    job) a push or a receipt should take what the training leaves, not slow its steps.  Linux gives each
    thread its own nice value, so the training thread keeps its own.  No privilege is needed to lower one.
    """
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), YIELDING_NICENESS)


def receive_into(conn: socket.socket, view: memoryview) -> int:
    """Fill ``view`` from ``conn`` (fewer bytes only when the peer closed or went quiet); returns the count."""
    return conn.recv_into(view, len(view), socket.MSG_WAITALL)


def _connect(host: str, port: int, secret: bytes, op: bytes, timeout: float) -> socket.socket:
    conn = socket.create_connection((host, port), timeout=HANDSHAKE_SECONDS)
    try:
        nonce = _receive_exactly(conn, NONCE_SIZE)
        conn.sendall(_OPEN.pack(MAGIC, _proof(secret, nonce, op), op))
        conn.settimeout(timeout)
    except BaseException:
        conn.close()
        raise
    return conn


def push(host: str, port: int, secret: bytes, rank: int, step: int, data: memoryview, *,
         bandwidth: float | None = None, stop: threading.Event | None = None) -> bool:
    """Send ``data`` as ``rank``'s replica of ``step``; True when the keeper committed it.

    Returns False when ``stop`` was set before the end (the keeper keeps its previous replica); raises
    OSError (PeerStalledError included) or CheckpointError when the keeper cannot be reached, stalls or refused it.
    """
    stop = stop or threading.Event()
    began, sent = time.monotonic(), 0
    checksum = Checksums(running=True)
    try:
        with _connect(host, port, secret, b"P", POLL_SECONDS) as conn:
            conn.sendall(_PUSH.pack(rank, step, len(data)))
            if _receive_exactly(conn, 1, stop)[0] != OK:
                raise CheckpointWriteError(f"the keeper at {host}:{port} refused rank {rank}'s replica of step {step} "
                                           f"({len(data)} bytes): no room in its shared memory, or no such rank")
            while sent < len(data):
                chunk = data[sent : sent + CHUNK]
                checksum.add(chunk)
                if not _send_all(conn, chunk, stop):
                    return False
                sent += len(chunk)
                if bandwidth:
                    ahead = sent / bandwidth - (time.monotonic() - began)
                    if ahead > 0 and stop.wait(ahead):
                        return False
            if not _send_all(conn, memoryview(_CRC.pack(checksum.finish()[0])), stop):
                return False
            answer = _receive_exactly(conn, 1, stop)
    finally:
        checksum.finish()
    if answer[0] != OK:
        raise CheckpointWriteError(f"the keeper at {host}:{port} refused rank {rank}'s replica of step {step} "
                                   "(damaged on the way, or something else at its name)")
    return True


def fetch(host: str, port: int, secret: bytes, rank: int, step: int, timeout: float = 60.0) -> torch.Tensor | None:
    """``rank``'s replica of ``step`` from the keeper at ``host:port``, verified; None if it holds none."""
    where = f"the replica of rank {rank}, step {step}, at {host}:{port}"
    with _connect(host, port, secret, b"F", timeout) as conn:
        conn.sendall(_FETCH.pack(rank, step))
        status, size, expected = _ANSWER.unpack(_receive_exactly(conn, _ANSWER.size))
        if status != OK:
            return None
        data = landing_buffer(size, where)
        view, got, checksum = data.numpy().data, 0, Checksums(running=True)
        try:
            while got < size:
                count = receive_into(conn, view[got : got + RECEIVE_CHUNK])
                if count <= 0:
                    raise CorruptCheckpointError(f"{where}: the keeper went away after {got} of {size} bytes")
                checksum.add(view[got : got + count])
                got += count
        finally:
            (crc,) = checksum.finish()
    if crc != expected:
        raise CorruptCheckpointError(f"{where}: checksum mismatch (damaged in the keeper's memory or on the way)")
    return data
