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

It writes an admin kubeconfig, waits on ``/readyz``, and on :meth:`stop`
stops every child in reverse order and deletes its temp dir (children get
``HOME`` and ``TMPDIR`` inside it, so nothing is left elsewhere). A port
found taken is retried on another one. :meth:`check` raises
:class:`~kcover.testing._process.ComponentDied` with the last log lines of a
component that died; the pytest fixtures call it around every test.

Manual use: ``python -m kcover.testing.cluster up --nodes 4`` prints the
``KUBECONFIG`` to export and runs until Ctrl-C, then stops everything.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Self, TypeVar

from kcover.testing import pki
from kcover.testing._process import Component, ComponentDied, free_port, tail
from kcover.testing._rest import JSON, ApiError, RestClient
from kcover.testing.binaries import Binaries, find_binaries, hack_dir
from kcover.testing.logs import LogLine, write_container_log

__all__ = ["ClusterStartError", "Credentials", "TestCluster", "main"]

T = TypeVar("T")

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAIL_ANNOTATION = "kcover.test/fail"
SUCCEED_ANNOTATION = "kcover.test/succeed"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
_PORT_TAKEN = ("address already in use", "bind: address", "listen tcp")


class ClusterStartError(RuntimeError):
    """The cluster did not come up; the message names the component and shows its log."""


@dataclass(frozen=True)
class Credentials:
    """How one identity reaches the cluster: a kubeconfig, and a token if it has one."""

    user: str
    kubeconfig: Path
    token: str | None = None
    groups: tuple[str, ...] = ()


@dataclass
class _Files:
    root: Path
    pki: Path = field(init=False)
    logs: Path = field(init=False)
    home: Path = field(init=False)
    tmp: Path = field(init=False)
    pods: Path = field(init=False)

    def __post_init__(self) -> None:
        self.pki = self.root / "pki"
        self.logs = self.root / "logs"
        self.home = self.root / "home"
        self.tmp = self.root / "tmp"
        self.pods = self.root / "pods"
        for folder in (self.pki, self.logs, self.home, self.tmp, self.pods):
            folder.mkdir(parents=True, exist_ok=True)


def _kubeconfig(server: str, ca_pem: bytes, user: str, auth: Mapping[str, str]) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "kcover-test",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": dict(auth)}],
        "contexts": [{"name": "kcover-test", "context": {"cluster": "kcover-test", "user": user}}],
        "current-context": "kcover-test",
    }
    return json.dumps(config, indent=2)


_WORKDIR_PREFIX = "kcover-cluster-"


def _remove_stale_workdirs() -> None:
    """Delete temp dirs of clusters whose owner process is gone (it was SIGKILLed).

    Their children died with them (parent-death signal), but nobody removed
    the files. Only folders with an ``owner.pid`` naming a dead process go.
    """
    for folder in Path(tempfile.gettempdir()).glob(f"{_WORKDIR_PREFIX}*"):
        try:
            pid = int((folder / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            continue


def wait_for(
    probe: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.2,
    check: Callable[[], None] | None = None,
) -> T:
    """Call ``probe`` until it returns something truthy; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


class TestCluster:
    """One throw-away control plane; use as a context manager or call start()/stop()."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        binaries: Binaries | None = None,
        workdir: Path | None = None,
        *,
        controllers: Sequence[str] = (),
        keep: bool = False,
        startup_timeout: float = 90.0,
    ) -> None:
        self.binaries = binaries or find_binaries()
        self._given_workdir = workdir
        self.controllers = tuple(controllers)
        self.keep = keep
        self.startup_timeout = startup_timeout
        self.components: list[Component] = []
        self.startup_seconds: float | None = None
        self.server = ""
        self._files: _Files | None = None
        self._api: RestClient | None = None
        self._admin_token = secrets.token_hex(16)
        self._ca: pki.CertificateAuthority | None = None
        self._lock = threading.Lock()
        self.cleanup_paths: list[Path] = []

    # ----------------------------------------------------------------- paths
    @property
    def files(self) -> _Files:
        if self._files is None:
            raise RuntimeError("the cluster is not started")
        return self._files

    @property
    def workdir(self) -> Path:
        return self.files.root

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (user ``kcover-admin`` in group ``system:masters``)."""
        return self.files.root / "kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.files.pki / "ca.crt"

    @property
    def log_root(self) -> Path:
        """A temp folder laid out like ``/var/log/pods`` (see :meth:`write_container_log`)."""
        return self.files.pods

    @property
    def admin_token(self) -> str:
        return self._admin_token

    @property
    def api(self) -> RestClient:
        """An admin client for the bootstrap work (stdlib only; tests may use any client)."""
        if self._api is None:
            raise RuntimeError("the cluster is not started")
        return self._api

    # ------------------------------------------------------------- lifecycle
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start every component and wait until the cluster serves and schedules."""
        self.binaries.require()
        began = time.monotonic()
        _remove_stale_workdirs()
        root = self._given_workdir or Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
        self._files = _Files(root)
        (root / "owner.pid").write_text(str(os.getpid()))
        try:
            self._write_pki()
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url)
            self._start_controllers_and_kwok()
            self._wait_bootstrapped()
            if self.controllers:
                from kcover.testing.controllers import start_controllers

                start_controllers(self, self.controllers)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop every process this cluster started (reverse order); remove its temp dir."""
        with self._lock:
            for comp in reversed(self.components):
                comp.stopping = True
            for comp in reversed(self.components):
                comp.stop()
            self.components.clear()
            for path in self.cleanup_paths:
                shutil.rmtree(path, ignore_errors=True)
            self.cleanup_paths.clear()
            if self._files is not None and not self.keep:
                shutil.rmtree(self._files.root, ignore_errors=True)
            self._api = None

    def check(self) -> None:
        """Raise :class:`ComponentDied` (with its last log lines) if any component died."""
        for comp in list(self.components):
            comp.check()

    def component(self, name: str) -> Component:
        for comp in self.components:
            if comp.name == name:
                return comp
        raise KeyError(name)

    # ------------------------------------------------------------ bootstrap
    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "ETCD"))}
        env.update(HOME=str(self.files.home), TMPDIR=str(self.files.tmp))
        return env

    def _write_pki(self) -> None:
        files = self.files
        ca = pki.new_ca()
        self._ca = ca
        serving = ca.issue_server(
            [
                "127.0.0.1",
                "localhost",
                "10.96.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
        )
        sa = pki.new_service_account_key()
        (files.pki / "ca.crt").write_bytes(ca.cert_pem)
        (files.pki / "ca.key").write_bytes(ca.key_pem)
        (files.pki / "apiserver.crt").write_bytes(serving.cert_pem)
        (files.pki / "apiserver.key").write_bytes(serving.key_pem)
        (files.pki / "sa.pub").write_bytes(sa.cert_pem)
        (files.pki / "sa.key").write_bytes(sa.key_pem)
        for key in files.pki.glob("*.key"):
            key.chmod(0o600)
        self._component_tokens = {
            name: secrets.token_hex(16)
            for name in ("kube-controller-manager", "kube-scheduler", "kwok", "controllers")
        }
        rows = [f'{self._admin_token},kcover-admin,kcover-admin,"system:masters"']
        rows += [
            f'{token},system:{name},system:{name},"system:masters"'
            for name, token in self._component_tokens.items()
        ]
        tokens = files.root / "tokens.csv"
        tokens.write_text("\n".join(rows) + "\n")
        tokens.chmod(0o600)

    def _launch(
        self,
        name: str,
        argv_for_port: Callable[[int], list[str]],
        ready: Callable[[int], bool],
        timeout: float,
        attempts: int = 4,
    ) -> int:
        """Start ``name`` on a free port; on "address in use" retry on another one."""
        log_path = self.files.logs / f"{name}.log"
        for attempt in range(1, attempts + 1):
            port = free_port()
            comp = Component(name, argv_for_port(port), log_path, self._env(), self.files.root)
            comp.start()
            self.components.append(comp)
            deadline = time.monotonic() + timeout
            while comp.alive() and time.monotonic() < deadline:
                if ready(port):
                    return port
                time.sleep(0.1)
            last = tail(log_path, 40)
            comp.stop()
            self.components.remove(comp)
            if attempt < attempts and any(sign in last.lower() for sign in _PORT_TAKEN):
                with log_path.open("a") as log:
                    log.write(f"\n[kcover] port {port} was taken; retrying on another port\n")
                continue
            state = (
                "did not become ready"
                if comp.proc
                and comp.proc.returncode
                in (
                    None,
                    -signal.SIGTERM,
                )
                else f"exited with status {comp.proc.returncode if comp.proc else '?'}"
            )
            raise ClusterStartError(
                f"test-cluster component {name!r} {state} (within {timeout:.0f}s); "
                f"last lines of {log_path}:\n{last}"
            )
        raise AssertionError("unreachable")

    def _start_etcd(self) -> str:
        data = self.files.root / "etcd"

        def argv(port: int) -> list[str]:
            url = f"http://127.0.0.1:{port}"
            return [
                str(self.binaries.path("etcd")),
                "--name=kcover",
                f"--data-dir={data}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                "--listen-peer-urls=http://127.0.0.1:0",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=kcover=http://127.0.0.1:2380",
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=2147483648",
            ]

        def ready(port: int) -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
                    return b'"true"' in resp.read()
            except (OSError, urllib.error.URLError):
                return False

        port = self._launch("etcd", argv, ready, timeout=30)
        return f"http://127.0.0.1:{port}"

    def _start_apiserver(self, etcd_url: str) -> None:
        pki_dir = self.files.pki

        def argv(port: int) -> list[str]:
            return [
                str(self.binaries.path("kube-apiserver")),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                "--endpoint-reconciler-type=none",
                f"--cert-dir={pki_dir}",
                f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
                f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
                f"--client-ca-file={pki_dir / 'ca.crt'}",
                f"--token-auth-file={self.files.root / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                f"--service-account-issuer=https://127.0.0.1:{port}/",
                f"--service-account-key-file={pki_dir / 'sa.pub'}",
                f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
                "--profiling=false",
                "--v=1",
            ]

        def ready(port: int) -> bool:
            probe = RestClient(
                f"https://127.0.0.1:{port}", str(pki_dir / "ca.crt"), self._admin_token
            )
            try:
                status, _ = probe.raw("GET", "/readyz", timeout=2)
            except (OSError, urllib.error.URLError):
                return False
            return status == 200

        port = self._launch("kube-apiserver", argv, ready, timeout=self.startup_timeout)
        self.server = f"https://127.0.0.1:{port}"
        self._api = RestClient(self.server, str(self.ca_file), self._admin_token)
        ca_pem = self.ca_file.read_bytes()
        self.kubeconfig.write_text(
            _kubeconfig(self.server, ca_pem, "kcover-admin", {"token": self._admin_token})
        )
        for name, token in self._component_tokens.items():
            path = self.files.root / f"{name}.kubeconfig"
            path.write_text(_kubeconfig(self.server, ca_pem, f"system:{name}", {"token": token}))

    def component_kubeconfig(self, name: str) -> Path:
        """Kubeconfig of a component identity (kube-controller-manager, kube-scheduler, kwok, controllers)."""
        return self.files.root / f"{name}.kubeconfig"

    def start_process(
        self,
        name: str,
        argv: list[str],
        *,
        kubeconfig: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> Component:
        """Start a child process that :meth:`stop` will stop and :meth:`check` will watch."""
        env = self._env()
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        env.update(extra_env or {})
        comp = Component(name, argv, self.files.logs / f"{name}.log", env, self.files.root)
        comp.start()
        self.components.append(comp)
        return comp

    def _start_controllers_and_kwok(self) -> None:
        pki_dir = self.files.pki
        self.start_process(
            "kube-controller-manager",
            [
                str(self.binaries.path("kube-controller-manager")),
                f"--kubeconfig={self.component_kubeconfig('kube-controller-manager')}",
                f"--root-ca-file={pki_dir / 'ca.crt'}",
                f"--service-account-private-key-file={pki_dir / 'sa.key'}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                f"--cert-dir={pki_dir}",
                "--leader-elect=false",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
        )
        self.start_process(
            "kube-scheduler",
            [
                str(self.binaries.path("kube-scheduler")),
                f"--kubeconfig={self.component_kubeconfig('kube-scheduler')}",
                f"--authentication-kubeconfig={self.component_kubeconfig('kube-scheduler')}",
                f"--authorization-kubeconfig={self.component_kubeconfig('kube-scheduler')}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                f"--cert-dir={pki_dir}",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        stages = hack_dir() / "stages" / "stages.yaml"
        self.start_process(
            "kwok",
            [
                str(self.binaries.path("kwok")),
                f"--kubeconfig={self.component_kubeconfig('kwok')}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.240.0.1",
            ],
        )

    def _wait_bootstrapped(self) -> None:
        """Wait until the controller manager has made the default service account."""

        def default_sa() -> bool:
            try:
                self.api.get("/api/v1/namespaces/default/serviceaccounts/default")
            except ApiError:
                return False
            return True

        wait_for(
            default_sa,
            self.startup_timeout,
            "the controller manager to create the default service account",
            check=self.check,
        )

    # --------------------------------------------------------- test helpers
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

    def wait_for(self, probe: Callable[[], T | None], timeout: float = 30.0, what: str = "") -> T:
        """Poll ``probe`` until truthy; fail early if a component died."""
        return wait_for(
            probe, timeout, what or getattr(probe, "__name__", "condition"), check=self.check
        )

    def apply(self, path: str, body: JSON) -> JSON:
        """Server-side apply ``body`` at the object URL ``path`` (create or update)."""
        return self.api.apply(path, body)

    def install_crds(self, paths: Iterable[Path], timeout: float = 30.0) -> list[str]:
        """Create or update CRDs from YAML files and wait until each is Established."""
        import yaml

        names: list[str] = []
        for path in paths:
            for doc in yaml.safe_load_all(path.read_text()):
                if not doc or doc.get("kind") != "CustomResourceDefinition":
                    continue
                name = doc["metadata"]["name"]
                self.apply(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}", doc)
                names.append(name)
        for name in names:
            self.wait_for(
                functools.partial(self._crd_established, name), timeout, f"CRD {name} Established"
            )
        return names

    def _crd_established(self, name: str) -> bool:
        crd = self.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

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
        path.write_text(_kubeconfig(self.server, self.ca_file.read_bytes(), name, auth))
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
        path.write_text(_kubeconfig(self.server, self.ca_file.read_bytes(), user, {"token": token}))
        path.chmod(0o600)
        creds = Credentials(
            user, path, token, ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")
        )
        for role in cluster_roles:
            self.bind(creds, role)
        for role in roles:
            self.bind(creds, role, namespace=namespace, kind="Role")
        return creds

    def create_namespace(self, name: str) -> str:
        self.apply(
            f"/api/v1/namespaces/{name}",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        return name


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
    except ComponentDied as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except (ClusterStartError, RuntimeError, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kcover.testing.cluster up``: run a test cluster until Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m kcover.testing.cluster", description=main.__doc__
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster, print its KUBECONFIG, run until Ctrl-C")
    up.add_argument("--nodes", type=int, default=2, help="fake KWOK nodes to create (default 2)")
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
        for name in binaries.missing(
            (
                "etcd",
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kwok",
                "kubectl",
                "helm",
                "jobset",
                "training-operator",
            )
        ):
            print(f"missing {name}: {binaries.why_missing(name).splitlines()[0]}")
        return 0
    return _up(args)


if __name__ == "__main__":
    sys.exit(main())
