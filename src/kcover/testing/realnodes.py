"""Real Kubernetes nodes next to the KWOK ones: containerd, runc and a kubelet per node.

KWOK nodes never start a container. A :class:`RealNodePool` adds nodes that do,
all on this machine: per node one containerd (its own root, state, socket and
CNI folder; Debian's package), runc underneath it, and one kubelet (built from
the pinned ``k8s.io/kubernetes`` by ``hack/test-cluster/build``) with its own
root folder, ports, cgroup root and pod-log folder, using the cgroupfs driver.

- **Addresses.** Each pool makes a Linux bridge holding one private address per
  node (``10.250.X.N/32``); a node's kubelet listens there and pods use host
  networking, so every byte stays on this machine and each node still has an
  address of its own (``MASTER_ADDR`` of a job can be a node's address).
- **Node-local paths.** containerd and the kubelet of a node share a mount
  namespace of their own in which ``/var/log/pods`` and ``/var/lib/kcover`` are
  that node's folders, so a DaemonSet's hostPath means each node's own folder.
- **Images.** No registry is reachable: the pause and host-runtime images of
  :mod:`kcover.testing.images` are written and imported into each containerd.
  Pods mount the host's ``/usr``, Python and the project read-only
  (:func:`host_runtime_pod`).
- **Isolation from the KWOK tests.** Real nodes carry the label and
  ``NoSchedule`` taint ``kcover.io/real-node=true``; only pods that tolerate it
  (those :func:`host_runtime_pod` makes) land there.
- **Clean-up.** Every change to the machine is recorded before it is made
  (:mod:`kcover.testing.node_cleanup`); :meth:`RealNodePool.stop` undoes it and
  reports anything left; a pool whose owner was killed is undone by the next one.

Needs root, ``containerd``, ``runc``, ``busybox`` (static) and the CNI
``loopback`` plugin (Debian: ``containerd runc busybox-static
containernetworking-plugins``); :func:`missing_prerequisites` says which are
absent. The kubelet's containerd 1.6 lacks the ``RuntimeConfig`` call, so the
kubelet falls back to its configured cgroup driver (supported through 1.37).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kcover.ports import free_port
from kcover.testing import images, node_cleanup
from kcover.testing._core import ClusterCore, ClusterStartError, wait_for
from kcover.testing._process import Component, tail
from kcover.testing._rest import ApiError
from kcover.testing.node_cleanup import HostChanges

__all__ = [
    "POOL_LABEL",
    "REAL_NODE_LABEL",
    "RealNode",
    "RealNodePool",
    "host_runtime_pod",
    "missing_prerequisites",
]

REAL_NODE_LABEL = "kcover.io/real-node"
POOL_LABEL = "kcover.io/real-node-pool"  # one value per pool: keeps a test's pods on its own nodes
CNI_BIN = Path("/usr/lib/cni")
DEBIAN_PACKAGES = "containerd runc busybox-static containernetworking-plugins"
_START_TIMEOUT = 90.0
# Paths every node has of its own (bind mounts in its mount namespace), as node-local folders a chart's
# hostPath volumes name: container logs, and the agent's state.
NODE_LOCAL_PATHS = {"/var/log/pods": "pods", "/var/lib/kcover": "kcover-state"}


def missing_prerequisites(kubelet: Path | None) -> list[str]:
    """Why real nodes cannot run here ([] when they can)."""
    missing: list[str] = []
    if os.geteuid() != 0:
        missing.append("real nodes need root (containerd, runc, mounts, cgroups)")
    for tool in ("containerd", "runc", "busybox", "ctr", "ip"):
        if shutil.which(tool) is None:
            missing.append(f"{tool} is not installed (apt-get install {DEBIAN_PACKAGES})")
    if not (CNI_BIN / "loopback").exists():
        missing.append(f"the CNI loopback plugin is not in {CNI_BIN} (containernetworking-plugins)")
    if kubelet is None or not kubelet.exists():
        missing.append("kubelet is not built (hack/test-cluster/build)")
    if not os.access(node_cleanup.CGROUP_FS / "memory", os.W_OK):
        missing.append(f"{node_cleanup.CGROUP_FS}/memory is not a writable cgroup v1 hierarchy")
    return missing


@dataclass
class RealNode:
    """One real node: its name, address, folders and its two programs."""

    name: str
    ip: str
    root: Path
    cgroup_root: str
    kubelet_port: int
    containerd: Component
    kubelet: Component

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def pod_logs(self) -> Path:
        """The kubelet's ``podLogsDir`` (``/var/log/pods`` on the node), as this machine sees it:
        ``<ns>_<pod>_<uid>/<container>/<n>.log`` files."""
        return self.root / NODE_LOCAL_PATHS["/var/log/pods"]

    def check(self) -> None:
        self.containerd.check()
        self.kubelet.check()

    def ctr(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``ctr -n k8s.io`` against this node's containerd; return stdout."""
        done = subprocess.run(
            ["ctr", "-a", str(self.socket), "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} on {self.name}: {done.stderr.strip()}")
        return done.stdout


_CONTAINERD_TOML = """\
version = 2
root = "{root}/containerd/root"
state = "{root}/containerd/state"
[grpc]
  address = "{root}/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # this machine withholds CAP_SYS_RESOURCE: never ask runc for a lower oom_score_adj
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{root}/cni"
"""

# Pods use host networking; a loopback-only network lets the runtime report
# NetworkReady (and gives any pod that asks for its own network namespace just lo).
_CNI_CONF = {
    "cniVersion": "0.4.0",
    "name": "kcover-loopback",
    "plugins": [{"type": "loopback"}],
}


def _kubelet_config(node: RealNode, healthz_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "failSwapOn": False,
        "failCgroupV1": False,  # this machine kind mounts cgroup v1
        "address": node.ip,
        "port": node.kubelet_port,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "readOnlyPort": 0,
        # test-only: the API server's log/exec calls need no client certificate
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": "/var/log/pods",  # the node's own folder, in its mount namespace
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "registerWithTaints": [{"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}],
        "evictionHard": {"memory.available": "100Mi"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "maxPods": 16,
        "serializeImagePulls": False,
        "localStorageCapacityIsolation": False,
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "5s",
    }


class RealNodePool:
    """Real nodes registered with a running test cluster; :meth:`stop` removes every trace."""

    def __init__(self, cluster: ClusterCore, kubelet: Path) -> None:
        self.cluster = cluster
        self.kubelet_binary = kubelet
        self.nodes: dict[str, RealNode] = {}
        self.folder = cluster.files.root / "real-nodes"
        self._images: list[Path] = []
        self.changes = HostChanges(owner_pid=os.getpid(), bridge=f"kcv{os.urandom(3).hex()}")
        self._subnet = _free_subnet()

    @property
    def pool_id(self) -> str:
        """This pool's value of the :data:`POOL_LABEL` node label."""
        return self.changes.bridge

    # ------------------------------------------------------------- start
    def add(self, count: int = 1, prefix: str = "real-") -> list[str]:
        """Start ``count`` more nodes and wait until each is Ready; return their names."""
        missing = missing_prerequisites(self.kubelet_binary)
        if missing:
            raise ClusterStartError("real nodes cannot start: " + "; ".join(missing))
        if not self.nodes:
            self._prepare_host()
        started: list[RealNode] = []
        for _ in range(count):
            index = len(self.nodes) + 1
            node = self._start_node(f"{prefix}{index}-{self.changes.bridge[3:]}", index)
            self.nodes[node.name] = node
            started.append(node)
        for node in started:
            self._wait_ready(node)
        return [node.name for node in started]

    def _prepare_host(self) -> None:
        node_cleanup.undo_stale()
        self.changes.sysctls = node_cleanup.read_sysctls()
        self.changes.save()
        folder = self.folder / "images"
        self._images = [
            images.write_pause_image(folder / "pause.tar"),
            images.write_host_runtime_image(folder / "host-runtime.tar"),
        ]
        _ip("link", "add", self.changes.bridge, "type", "bridge")
        _ip("link", "set", self.changes.bridge, "up")

    def _start_node(self, name: str, index: int) -> RealNode:
        root = self.folder / name
        cgroup_root = f"/kcover-{name}"
        ip = str(self._subnet[index])
        self.changes.roots.append(str(root))
        self.changes.cgroup_roots.append(cgroup_root)
        self.changes.sockets.append(str(root / "containerd.sock"))
        self.changes.save()
        (root / "cni").mkdir(parents=True)
        (root / "cni" / "10-loopback.conflist").write_text(json.dumps(_CNI_CONF))
        _ip("addr", "add", f"{ip}/32", "dev", self.changes.bridge)
        for hierarchy in node_cleanup.CGROUP_FS.iterdir():
            if (hierarchy / "cgroup.procs").exists():
                (hierarchy / cgroup_root.strip("/")).mkdir(exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": str(root)}
        config = root / "containerd.toml"
        config.write_text(
            _CONTAINERD_TOML.format(root=root, pause=images.PAUSE_IMAGE, cni_bin=CNI_BIN)
        )
        containerd = Component(
            f"containerd-{name}", self._in_own_mounts(root, ["containerd", "--config", str(config)]),
            self.cluster.files.logs / f"containerd-{name}.log", env, root,
        )
        containerd.start()
        self.cluster.components.append(containerd)
        node = RealNode(
            name, ip, root, cgroup_root, free_port(),
            containerd,
            Component(f"kubelet-{name}", [], self.cluster.files.logs / f"kubelet-{name}.log",
                      env, root),
        )
        wait_for(node.socket.exists, 30, f"containerd of {name} to open its socket",
                 check=containerd.check)
        for archive in self._images:
            node.ctr("images", "import", str(archive))
        kubelet_yaml = root / "kubelet.json"
        kubelet_yaml.write_text(json.dumps(_kubelet_config(node, free_port()), indent=1))
        node.kubelet.argv = [
            "nsenter", f"--mount=/proc/{containerd.pid}/ns/mnt", "--",  # containerd's mounts
            str(self.kubelet_binary),
            f"--config={kubelet_yaml}",
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--root-dir={root / 'kubelet'}",
            f"--hostname-override={name}",
            f"--node-ip={ip}",
            f"--node-labels={REAL_NODE_LABEL}=true,{POOL_LABEL}={self.pool_id}",
            "--v=1",
        ]
        node.kubelet.start()
        self.cluster.components.append(node.kubelet)
        return node

    def _in_own_mounts(self, root: Path, argv: list[str]) -> list[str]:
        """``argv`` run in a mount namespace of the node's own, where :data:`NODE_LOCAL_PATHS` are its folders.

        Every node then has its ``/var/log/pods`` (and agent state) at the usual path, as on a real
        cluster, so one DaemonSet with one hostPath serves them all; the kubelet joins this namespace.
        """
        steps = ["set -e"]
        for path, sub in NODE_LOCAL_PATHS.items():
            (root / sub).mkdir(exist_ok=True)
            if not Path(path).exists():
                Path(path).mkdir(parents=True)
                self.changes.created_dirs.append(path)
                self.changes.save()
            steps.append(f"mount --bind {shlex.quote(str(root / sub))} {shlex.quote(path)}")
        steps.append("exec " + shlex.join(argv))
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "; ".join(steps)]

    def _wait_ready(self, node: RealNode) -> None:
        def ready() -> bool:
            conditions = self.cluster.api.get(f"/api/v1/nodes/{node.name}").get("status", {})
            return any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in conditions.get("conditions") or []
            )

        def alive() -> None:
            node.check()

        try:
            wait_for(_ignore_missing(ready), _START_TIMEOUT, f"real node {node.name} Ready",
                     check=alive)
        except TimeoutError as err:
            raise ClusterStartError(
                f"{err}; last kubelet lines:\n{tail(node.kubelet.log_path, 20)}"
            ) from err

    # -------------------------------------------------------------- stop
    def stop(self) -> list[str]:
        """Stop every node and undo every change; return what could not be removed."""
        for node in self.nodes.values():
            node.kubelet.stop()
        for node in self.nodes.values():
            with contextlib.suppress(ApiError, OSError):
                self.cluster.api.request("DELETE", f"/api/v1/nodes/{node.name}")
        for node in self.nodes.values():
            node.containerd.stop()  # containers die below, by cgroup; shims with them
        for node in self.nodes.values():
            for comp in (node.kubelet, node.containerd):
                if comp in self.cluster.components:
                    self.cluster.components.remove(comp)
        self.nodes.clear()
        if not self.changes.path.exists():
            return []
        return node_cleanup.undo(self.changes)


def _ignore_missing(probe: Any) -> Any:
    def wrapped() -> Any:
        try:
            return probe()
        except ApiError as err:  # the node object appears only after registration
            if err.status != 404:
                raise
            return False

    return wrapped


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ClusterStartError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.250.X.0/24 no interface of this machine uses yet."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                          check=False).stdout
    choices = list(range(256))
    random.shuffle(choices)
    for third in choices:
        if f"10.250.{third}." not in used:
            return ipaddress.IPv4Network(f"10.250.{third}.0/24")
    raise ClusterStartError("no free 10.250.X.0/24 subnet for real nodes")


def host_runtime_pod(
    name: str,
    command: Sequence[str],
    *,
    node: str | None = None,
    project_root: Path,
    env: Mapping[str, str] | None = None,
    grace_seconds: int = 5,
    restart_policy: str = "Never",
    writable: Mapping[str, Path] | None = None,
) -> dict[str, Any]:
    """A pod spec (``spec`` only) that runs ``command`` on a real node with the host's Python.

    Host networking, the host-runtime image, the host's ``/usr``, Python and
    project mounted read-only, the real-node toleration and, with ``node``, a
    ``nodeName``. ``writable`` maps container paths to host folders mounted
    read-write (created if missing): shared storage, or a node's snapshot folder.
    """
    mounts = images.host_runtime_mounts(project_root)
    rw = sorted((writable or {}).items())
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": grace_seconds,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "containers": [
            {
                "name": "main",
                "image": images.HOST_RUNTIME_IMAGE,
                "imagePullPolicy": "Never",
                "command": list(command),
                "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                "volumeMounts": [
                    {"name": m.name, "mountPath": m.path, "readOnly": True} for m in mounts
                ]
                + [{"name": f"rw-{i}", "mountPath": path} for i, (path, _) in enumerate(rw)],
            }
        ],
        "volumes": [
            {"name": m.name, "hostPath": {"path": m.path, "type": "Directory"}} for m in mounts
        ]
        + [
            {"name": f"rw-{i}", "hostPath": {"path": str(host), "type": "DirectoryOrCreate"}}
            for i, (_, host) in enumerate(rw)
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    return spec

