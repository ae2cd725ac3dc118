"""What launchers and log aggregators write before a worker's line, and what it tells.

A worker's line reaches us wrapped: ``torchrun --tee`` tags it ``[default0]:``,
PyTorch ``[rank3]:``, ``mpirun --tag-output`` ``[1,3]<stderr>:`` (Horovod's
gloo runner ``[3]<stderr>:``), DeepSpeed's pdsh runner the host's name
(``worker-1: ``), Ray the actor and its node
(``(RayTrainWorker pid=4123, ip=10.0.0.7) ``), ``kubectl logs --prefix`` the pod
(``[pod/trainer-0/pytorch] ``), ``docker compose`` the service
(``trainer-1  | ``), journald and syslog the time and host
(``Dec 01 10:00:00 gpu-7 ``, before ``kernel: …``), often several of these
nested, and a paste adds quote marks (``> ``) and timestamps.  A rule anchored
at a message's start (a Python exception line), the reading of a traceback and
the words that name a layer need the message itself; :func:`next_prefix` finds
one prefix at a time, and each may tell the line's rank, node or time.

These wrap every line a worker writes.  A logger's own head (loguru's
``| ERROR    | train:main:12 - ``, glog's ``E0501 10:00:00.123456  12 f.cc:8] ``)
is not taken off: it is written once per record, not before a traceback's lines,
and its level is what tells a fatal record from an error the program survived.
Some prefixes cannot be told from a program's own words by their shape, and
are not read here: ``srun --label``'s ``3: `` is also what
``/sys/class/infiniband/…/state`` holds (``1: DOWN``), and is decided per log
(:mod:`kcover.collect.task_labels`); the standard library's
``ERROR:gcsfs:`` names the logger a rule may need; journald's program
(``systemd-oomd[812]: ``) is part of what a rule reads.  A host's name before
``: `` is read only at the very start of a line, only as an address or a
lowercase name with a ``-`` and a digit (``worker-1``,
``ip-10-0-0-7.ec2.internal``), and never as a device's or a program's name
(``nvidia-nvswitch3: SXid``, ``python3: can't open file``, ``s3fs: …``,
``mlx4: local QP operation err``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LAUNCHER_TAGS = (
    r"\[rank(?P<rank>\d{1,7})\]:\s?"  # PyTorch's rank tag
    r"|\[default(?P<local>\d{1,7})\]:\s?"  # torchrun --tee
    r"|\[(?:\d{1,7},)?(?P<mpi>\d{1,7})\]<std(?:out|err|diag)>:\s?"  # mpirun --tag-output, Horovod's gloo runner
)
LAUNCHER_TAG = re.compile(_LAUNCHER_TAGS)
"""A launcher's rank tag (``[rank3]:``, ``[default0]:``, ``[1,3]<stderr>:``): ``rank`` or ``mpi`` is the rank."""
_QUOTE = re.compile(r" {0,3}(?:> ?)+")
"""Quote marks of a log pasted into an issue or an e-mail (``> ``, ``>> ``)."""
_LEADING_TIMESTAMP = re.compile(
    r"\[?(?P<stamp>\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\]?"
    r"(?: {0,8}[|:\-] | )"
)
"""A timestamp and its separator before a message (``2024-05-01T10:00:00.123Z ``, ``[2024-05-01 10:00:00] ``).

One space only: the indentation after it is the message's (a traceback's frames)."""
_RAY_ACTOR = (
    r"\((?:[A-Za-z_][\w.]{0,80} )?pid=\d{1,10}(?:, ip=(?P<ray_ip>[0-9A-Fa-f.:]{3,45}))?"
    r"(?:, \w{1,40}=[\w.\-]{0,80}){0,4}\)(?: |$)"
)
_SYSLOG = (
    r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (?P<syslog_host>[a-z0-9][a-z0-9.\-]{0,252}) "
    r"(?=[\w.\-/@]{1,64}(?:\[\d{1,10}\])?: )"
)
"""journald's and syslog's time and host, read only before a program's tag, which stays in the message.

A ``ts``-stamped line (``Dec 01 10:00:00 Segmentation fault``) has no host: its first word is the message's."""
_ANYWHERE = re.compile(
    "|".join(
        (
            _LAUNCHER_TAGS,
            _RAY_ACTOR,  # Ray: the actor and its node
            r"\(raylet(?:, ip=(?P<raylet_ip>[0-9A-Fa-f.:]{3,45}))?\)(?: |$)",
            r"\[pod/[^/\]\s]{1,253}/[^\]\s]{1,253}\](?: |$)",  # kubectl logs --prefix
            _SYSLOG,
        )
    )
)
_LEVEL_WORDS = r"(?i:trace|debug|info|notice|success|warn|warning|error|err|critical|crit|fatal|alert|emerg)"
_LINE_START = re.compile(
    r"(?P<host>\d{1,3}(?:\.\d{1,3}){3}|(?=[a-z0-9.\-]{0,252}\d)[a-z][a-z0-9]{0,62}(?:-[a-z0-9]{1,63}){1,8}"
    # pdsh: an address, or a host with a - and a digit; never bash's "run-1.sh: line 4: … Killed"
    r"(?:\.[a-z0-9\-]{1,63}){0,8}):(?: (?!line \d)|$)"
    # docker compose's service, never a logger's level
    r"|(?!" + _LEVEL_WORDS + r" )[A-Za-z0-9][\w.\-]{0,62} {1,20}\|(?: |$)"
)
_DEVICE = re.compile(
    r"(?:(?:eth|ib|bond|vlan|wlan|tun|tap|nvme|nbd|loop|md|dm-|card|renderd|cpu|gpu|cuda|nvidia|nvidia-nvswitch|nvswitch"
    r"|efa|irdma|sd[a-z]{1,2}|[vh]d[a-z]|xvd[a-z]|en[opsx])\d*(?:[a-z]\d+)*|veth[0-9a-f]+|br-[0-9a-f]+)"
    r"|.{1,250}\.(?:sh|py|pl|rb|js|log|txt|out|err|cc|cpp|yaml|yml|json)"
)
"""A device's name at a line's start (a kernel or driver message) or a file's (a script's), never a host's."""
_NO_NODE = frozenset(("localhost", "localhost.localdomain", "127.0.0.1"))
_RAY_DEDUPLICATED = "across cluster]"
"""Ray's ``[repeated 7x across cluster]``: the line stands for several nodes' lines, so it names none."""


@dataclass(frozen=True)
class Prefix:
    """One prefix before a message: where it ends and the rank, node or time it tells."""

    end: int
    rank: int | None = None
    node: str | None = None
    timestamp: str | None = None


def next_prefix(text: str, at: int) -> Prefix | None:
    """The prefix at ``at`` in ``text`` (a launcher's, an aggregator's, a quote, a timestamp), if any.

    A blank line behind a prefix has lost the prefix's last space (lines are read without
    trailing blanks), so a prefix may also end the text.
    """
    found = _ANYWHERE.match(text, at)
    if found is not None:
        groups = found.groupdict()
        rank = groups["rank"] or groups["mpi"]
        node = groups["ray_ip"] or groups["raylet_ip"] or groups["syslog_host"]
        if node in _NO_NODE or (node and not groups["syslog_host"] and _RAY_DEDUPLICATED in text):
            node = None
        return Prefix(found.end(), int(rank) if rank else None, node)
    if at == 0 and (first := _line_start(text)) is not None:
        return first
    found = _QUOTE.match(text, at) or _LEADING_TIMESTAMP.match(text, at)
    return Prefix(found.end(), timestamp=found.groupdict().get("stamp")) if found else None


def _line_start(text: str) -> Prefix | None:
    """A host's name before a line (read only at its very start), or a compose service."""
    found = _LINE_START.match(text)
    if found is None:
        return None
    host = found.group("host")
    if host is not None and _DEVICE.fullmatch(host):
        return None
    return Prefix(found.end(), node=None if host in _NO_NODE else host)
