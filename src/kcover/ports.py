"""Finding a free TCP port on the loopback interface, for anything kcover starts that must listen.

The launcher needs one for a job's rendezvous (``MASTER_PORT``) when none is
given; the test cluster harness needs them for its API server, etcd and
controllers.  The port was free a moment ago: whoever binds it next should
bind it soon.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
