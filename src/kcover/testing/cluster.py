"""A real Kubernetes control plane on loopback, for kcover's tests.

:class:`TestCluster` starts, from the binaries that ``hack/test-cluster/build``
made (see :mod:`kcover.testing.binaries`):

* etcd (no fsync; data in the temp dir),
* kube-apiserver with RBAC on, a CA, serving certificate and service-account
  key made on the fly (:mod:`kcover.testing.pki`), a static admin token,
* kube-controller-manager (Job controller, garbage collector, namespace
  deletion, service accounts, node lifecycle) and kube-scheduler,
* KWOK, which plays the kubelet for fake nodes (annotation
  ``kwok.x-k8s.io/node=fake``) with the stages in
  ``hack/test-cluster/stages/stages.yaml``: scheduled pods become Running,
  and a pod a test marks with :meth:`TestCluster.fail_pod` becomes Failed with
  the exit code and reason it chose,
* optionally the JobSet controller and the Kubeflow training-operator
  (:mod:`kcover.testing.controllers`), with their CRDs.

The lifecycle lives in :class:`kcover.testing._core.ClusterCore`; this module
adds what tests call. It writes an admin kubeconfig, waits on ``/readyz``, and on :meth:`stop`
stops every child in reverse order and deletes its temp dir (children get
``HOME`` and ``TMPDIR`` inside it, so nothing is left elsewhere). A port
found taken is retried on another one. :meth:`check` raises
:class:`~kcover.testing._process.ComponentDiedError` with the last log lines of a
component that died; the pytest fixtures call it around every test.

Manual use: ``python -m kcover.testing.cluster up --nodes 4`` prints the
``KUBECONFIG`` to export and runs until Ctrl-C, then stops everything.
"""

from __future__ import annotations

import argparse
import base64
import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from kcover.testing._core import (
    FAKE_NODE_ANNOTATION,
    ClusterCore,
    ClusterStartError,
    kubeconfig_text,
)
from kcover.testing._process import ComponentDiedError
from kcover.testing._rest import JSON, ApiError
from kcover.testing.binaries import OPTIONAL, REQUIRED, find_binaries
from kcover.testing.logs import LogLine, write_container_log
from kcover.testing.realnodes import RealNodePool

__all__ = ["ClusterStartError", "Credentials", "TestCluster", "main"]

FAIL_ANNOTATION = "kcover.test/fail"
SUCCEED_ANNOTATION = "kcover.test/succeed"


@dataclass(frozen=True)
class Credentials:
    """How one identity reaches the cluster: a kubeconfig, and a token if it has one."""

    user: str
    kubeconfig: Path
    token: str | None = None
    groups: tuple[str, ...] = ()


class TestCluster(ClusterCore):
    """One throw-away control plane; use as a context manager or call start()/stop()."""

    __test__ = False  # not a pytest test class

    real_node_pool: RealNodePool | None = None
    real_node_leftovers: tuple[str, ...] = ()

    def add_real_nodes(self, count: int = 2) -> list[str]:
        """Start ``count`` real nodes (containerd + runc + kubelet); see :mod:`kcover.testing.realnodes`."""
        if self.real_node_pool is None:
            self.real_node_pool = RealNodePool(self, self.binaries.path("kubelet"))
        return self.real_node_pool.add(count)

    def stop(self) -> None:
        """Stop the real nodes first (undoing every change to the machine), then the control plane."""
        if self.real_node_pool is not None:
            self.real_node_leftovers = tuple(self.real_node_pool.stop())
            self.real_node_pool = None
        super().stop()

    def _after_start(self) -> None:
        if self.controllers:
            from kcover.testing.controllers import start_controllers

            start_controllers(self, self.controllers)

    def tool_env(self, kubeconfig: Path | None = None) -> dict[str, str]:
        """Environment for running kubectl/helm against this cluster, caches kept in the temp dir."""
        env = self._env()
        env["KUBECONFIG"] = str(kubeconfig or self.kubeconfig)
        for var, sub in (
            ("HELM_CACHE_HOME", "helm/cache"),
            ("HELM_CONFIG_HOME", "helm/config"),
            ("HELM_DATA_HOME", "helm/data"),
        ):
            env[var] = str(self.files.home / sub)
        env["PATH"] = f"{self.binaries.bin}{os.pathsep}{env.get('PATH', '')}"
        return env

    def run_tool(
        self, name: str, *args: str, kubeconfig: Path | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl`` or ``helm`` (the built ones) against this cluster; never raises on status."""
        if not self.binaries.has(name):
            raise FileNotFoundError(self.binaries.why_missing(name))
        return subprocess.run(
            [str(self.binaries.path(name)), *args],
            env=self.tool_env(kubeconfig),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def create_nodes(
        self,
        count: int,
        *,
        prefix: str = "kwok-node-",
        gpus: int = 8,
        cpu: str = "64",
        memory: str = "512Gi",
        pods: int = 110,
        labels: Mapping[str, str] | None = None,
        wait: bool = True,
        timeout: float = 30.0,
    ) -> list[str]:
        """Create ``count`` fake nodes managed by KWOK (``nvidia.com/gpu`` = ``gpus``)."""
        resources = {"cpu": cpu, "memory": memory, "pods": str(pods)}
        if gpus:
            resources["nvidia.com/gpu"] = str(gpus)
        names: list[str] = []
        existing = {n["metadata"]["name"] for n in self.api.get("/api/v1/nodes").get("items", [])}
        index = 0
        while len(names) < count:
            name = f"{prefix}{index}"
            index += 1
            if name in existing:
                continue
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        **(labels or {}),
                    },
                },
                "status": {"capacity": resources, "allocatable": resources},
            }
            self.api.post("/api/v1/nodes", node)
            names.append(name)
        if wait:
            for name in names:
                self.wait_for(
                    functools.partial(self.node_ready, name), timeout, f"node {name} Ready"
                )
        return names

    def node_ready(self, name: str) -> bool:
        node = self.api.get(f"/api/v1/nodes/{name}")
        conditions = (node.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def pod(self, namespace: str, name: str) -> JSON:
        return self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def wait_pod_phase(self, namespace: str, name: str, phase: str, timeout: float = 30.0) -> JSON:
        def probe() -> JSON | None:
            try:
                pod = self.pod(namespace, name)
            except ApiError as err:
                if err.status == 404:
                    return None
                raise
            return pod if pod.get("status", {}).get("phase") == phase else None

        return self.wait_for(probe, timeout, f"pod {namespace}/{name} to be {phase}")

    def fail_pod(
        self,
        namespace: str,
        name: str,
        *,
        exit_code: int = 1,
        reason: str = "Error",
        message: str = "",
        container: str | None = None,
        wait: bool = True,
        timeout: float = 30.0,
    ) -> JSON:
        """Make KWOK end a Running pod as Failed with this exit code / reason / message.

        ``container`` fails just that container (others end with 137); by
        default every container ends with ``exit_code``. Returns the pod.
        """
        annotations = {
            FAIL_ANNOTATION: "true",
            "kcover.test/exit-code": str(exit_code),
            "kcover.test/reason": reason,
            "kcover.test/message": message,
        }
        if container:
            annotations["kcover.test/container"] = container
        self.wait_pod_phase(namespace, name, "Running", timeout)
        pod = self.api.merge_patch(
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"metadata": {"annotations": annotations}},
        )
        return self.wait_pod_phase(namespace, name, "Failed", timeout) if wait else pod

    def succeed_pod(
        self, namespace: str, name: str, *, wait: bool = True, timeout: float = 30.0
    ) -> JSON:
        """Make KWOK end a Running pod as Succeeded (exit code 0)."""
        self.wait_pod_phase(namespace, name, "Running", timeout)
        pod = self.api.merge_patch(
            f"/api/v1/namespaces/{namespace}/pods/{name}",
            {"metadata": {"annotations": {SUCCEED_ANNOTATION: "true"}}},
        )
        return self.wait_pod_phase(namespace, name, "Succeeded", timeout) if wait else pod

    def write_container_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        lines: Iterable[str | LogLine],
        *,
        restart: int = 0,
        root: Path | None = None,
    ) -> Path:
        """Write CRI log lines for a pod's container under :attr:`log_root` (or ``root``)."""
        uid = self.pod(namespace, pod)["metadata"]["uid"]
        return write_container_log(
            root or self.log_root, namespace, pod, uid, container, lines, restart=restart
        )

    # ----------------------------------------------------------------- RBAC
    def bind(
        self,
        subject: Credentials,
        role: str,
        *,
        namespace: str | None = None,
        kind: str = "ClusterRole",
    ) -> None:
        """Bind ``subject`` to a Role/ClusterRole: in ``namespace``, or cluster-wide if None."""
        if subject.user.startswith("system:serviceaccount:"):
            _, _, sa_ns, sa_name = subject.user.split(":", 3)
            subj: JSON = {"kind": "ServiceAccount", "name": sa_name, "namespace": sa_ns}
        else:
            subj = {"kind": "User", "name": subject.user, "apiGroup": "rbac.authorization.k8s.io"}
        slug = "".join(ch if ch.isalnum() or ch in "-." else "-" for ch in subject.user).strip("-")
        name = f"kcover-test-{slug}-{kind.lower()}-{role}"[:253]
        body: JSON = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
            "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
            "subjects": [subj],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        }
        if namespace:
            path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/{name}"
        else:
            path = f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{name}"
        self.apply(path, body)

    def user(
        self,
        name: str,
        groups: Sequence[str] = (),
        *,
        cluster_roles: Sequence[str] = (),
        roles: Mapping[str, Sequence[str]] | None = None,
    ) -> Credentials:
        """A user authenticated by a client certificate, bound to the given roles.

        ``roles`` maps a namespace to names of Roles there. The returned
        kubeconfig authenticates as ``name`` in ``groups``; requests go through
        the real RBAC authorizer.
        """
        if self._ca is None:
            raise RuntimeError("the cluster is not started")
        pair = self._ca.issue_client(name, tuple(groups))
        slug = "".join(ch if ch.isalnum() else "-" for ch in name)
        path = self.files.root / f"user-{slug}.kubeconfig"
        auth = {
            "client-certificate-data": base64.b64encode(pair.cert_pem).decode(),
            "client-key-data": base64.b64encode(pair.key_pem).decode(),
        }
        path.write_text(kubeconfig_text(self.server, self.ca_file.read_bytes(), name, auth))
        path.chmod(0o600)
        creds = Credentials(name, path, None, tuple(groups))
        for role in cluster_roles:
            self.bind(creds, role)
        for namespace, names in (roles or {}).items():
            for role in names:
                self.bind(creds, role, namespace=namespace, kind="Role")
        return creds

    def service_account(
        self,
        namespace: str,
        name: str,
        *,
        cluster_roles: Sequence[str] = (),
        roles: Sequence[str] = (),
        expiration_seconds: int = 3600,
    ) -> Credentials:
        """A ServiceAccount (created if absent) with a TokenRequest token, bound to roles.

        ``roles`` are Roles in the service account's namespace.
        """
        sa_path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
        self.apply(
            sa_path, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
        )
        token = self.api.post(
            f"{sa_path}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )["status"]["token"]
        user = f"system:serviceaccount:{namespace}:{name}"
        path = self.files.root / f"sa-{namespace}-{name}.kubeconfig"
        path.write_text(
            kubeconfig_text(self.server, self.ca_file.read_bytes(), user, {"token": token})
        )
        path.chmod(0o600)
        creds = Credentials(
            user, path, token, ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")
        )
        for role in cluster_roles:
            self.bind(creds, role)
        for role in roles:
            self.bind(creds, role, namespace=namespace, kind="Role")
        return creds


# ------------------------------------------------------------------- CLI
def _up(args: argparse.Namespace) -> int:
    cluster = TestCluster(
        workdir=Path(args.workdir) if args.workdir else None,
        controllers=[c for c in args.controllers.split(",") if c],
        keep=args.keep,
    )
    stop = threading.Event()

    ready = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        if not ready.is_set():  # interrupt start-up; start() stops what it began
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        print("starting the test cluster ...", file=sys.stderr)
        cluster.start()
        if args.nodes:
            cluster.create_nodes(args.nodes, gpus=args.gpus)
        if args.real_nodes:
            names = cluster.add_real_nodes(args.real_nodes)
            print(f"real nodes: {', '.join(names)}", file=sys.stderr)
        ready.set()
        print(
            f"ready in {cluster.startup_seconds:.1f}s; logs in {cluster.files.logs}",
            file=sys.stderr,
        )
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        print(f"# pod log root (CRI files): {cluster.log_root}")
        print("# Ctrl-C stops the cluster and removes its files", file=sys.stderr)
        sys.stdout.flush()
        while not stop.wait(0.5):
            cluster.check()
        print("\nstopping ...", file=sys.stderr)
    except KeyboardInterrupt:
        print("\nstopping ...", file=sys.stderr)
    except ComponentDiedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (ClusterStartError, RuntimeError, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for left in cluster.real_node_leftovers:
            print(f"warning: the real nodes left this behind: {left}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kcover.testing.cluster up``: run a test cluster until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m kcover.testing.cluster", description=main.__doc__
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster, print its KUBECONFIG, run until Ctrl-C")
    up.add_argument("--nodes", type=int, default=2, help="fake KWOK nodes to create (default 2)")
    up.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        help="real nodes to add (containerd + runc + kubelet; needs root; default 0)",
    )
    up.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per node (default 8)")
    up.add_argument(
        "--controllers",
        default="",
        help="comma-separated optional controllers to run: jobset,training-operator",
    )
    up.add_argument("--workdir", help="use this folder instead of a new temp dir")
    up.add_argument("--keep", action="store_true", help="keep the temp dir (logs) after stopping")
    sub.add_parser("where", help="print the binary cache folder and what is missing")
    args = parser.parse_args(argv)
    if args.command == "where":
        binaries = find_binaries()
        print(binaries.root)
        for name in (*REQUIRED, *OPTIONAL):
            kind = "required" if name in REQUIRED else "optional"
            if binaries.has(name):
                print(f"  ok       {name} ({kind})")
            else:
                print(f"  MISSING  {name} ({kind}): {binaries.why_missing(name).splitlines()[0]}")
        return 0 if not binaries.missing() else 1
    return _up(args)


if __name__ == "__main__":
    sys.exit(main())
