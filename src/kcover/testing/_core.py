"""The engine of the test cluster: start the control plane, watch it, stop it.

:class:`ClusterCore` holds what every test cluster does regardless of the
tests: make the PKI and tokens, start etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and KWOK as child processes on free
loopback ports (retrying a port found taken), wait for ``/readyz`` and for the
controller manager to make the default service account, watch the children,
and stop them all in reverse order. :class:`kcover.testing.cluster.TestCluster`
adds the helpers tests call (nodes, pods, RBAC identities, logs, tools).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
import urllib.error
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

from kcover.ports import free_port
from kcover.testing import node_cleanup, pki
from kcover.testing._process import Component, tail
from kcover.testing._rest import JSON, ApiError, RestClient
from kcover.testing.binaries import Binaries, find_binaries, hack_dir

__all__ = ["ClusterCore", "ClusterStartError", "kubeconfig_text", "wait_for"]

T = TypeVar("T")

FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
_PORT_TAKEN = ("address already in use", "bind: address", "listen tcp")


class ClusterStartError(RuntimeError):
    """The cluster did not come up; the message names the component and shows its log."""


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


def kubeconfig_text(server: str, ca_pem: bytes, user: str, auth: Mapping[str, str]) -> str:
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
    node_cleanup.undo_stale()  # first: a killed run's real nodes still have mounts in there
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


class ClusterCore:
    """The lifecycle of one throw-away control plane (see :class:`TestCluster`)."""

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
            self._after_start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began

    def _after_start(self) -> None:
        """Hook for subclasses: more start-up work inside start()'s clean-up guard."""

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
            elif self._files is not None:  # kept on purpose: not stale for the next start
                (self._files.root / "owner.pid").unlink(missing_ok=True)
            self._api = None

    def check(self) -> None:
        """Raise :class:`ComponentDiedError` (with its last log lines) if any component died."""
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
                # real nodes are named, not in DNS: reach kubelets by address (logs, exec)
                "--kubelet-preferred-address-types=InternalIP",
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
            kubeconfig_text(self.server, ca_pem, "kcover-admin", {"token": self._admin_token})
        )
        for name, token in self._component_tokens.items():
            path = self.files.root / f"{name}.kubeconfig"
            path.write_text(
                kubeconfig_text(self.server, ca_pem, f"system:{name}", {"token": token})
            )

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
                # as large clusters set it: at the default 20/s the Job controller alone needs ~10 s
                # to stop and replace 64 pods (see bench/k8s_restart_latency.py)
                "--kube-api-qps=100",
                "--kube-api-burst=200",
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

    def wait_for(self, probe: Callable[[], T | None], timeout: float = 30.0, what: str = "") -> T:
        """Poll ``probe`` until truthy; fail early if a component died."""
        return wait_for(
            probe, timeout, what or getattr(probe, "__name__", "condition"), check=self.check
        )

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

    def apply(self, path: str, body: JSON) -> JSON:
        """Server-side apply ``body`` at the object URL ``path`` (create or update)."""
        return self.api.apply(path, body)

    def create_namespace(self, name: str) -> str:
        self.apply(
            f"/api/v1/namespaces/{name}",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
        return name
