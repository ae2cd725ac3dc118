"""The optional workload controllers of the test cluster: JobSet and training-operator.

kcover's e2e tests should face the controllers users really run, so the
harness can start the JobSet controller and the Kubeflow training-operator
(PyTorchJob only) built from their Go modules, as local processes against the
test cluster. Both serve admission webhooks that the API server must reach:

* their CRDs and webhook manifests are copied by ``hack/test-cluster/build``
  from the module cache into ``<cache>/crds/<name>/`` and
  ``<cache>/webhooks/<name>/manifests.yaml``; here each webhook's service
  reference is rewritten to ``https://127.0.0.1:<port><path>`` with our CA;
* JobSet runs with its internal certificate management off and a serving
  certificate we issue in its cert dir (``$TMPDIR/k8s-webhook-server``);
* training-operator always runs open-policy-agent's cert-controller, which
  keeps a CA and certificate in a Secret and only checks that
  ``/tmp/k8s-webhook-server/serving-certs/tls.crt`` exists. We pre-seed the
  Secret with an RSA CA and a certificate valid for ``127.0.0.1`` and the
  service name for a year (so it is not rotated), put the same files in its
  cert dir, and remove the ``/tmp`` marker file at stop if we made it.
"""

from __future__ import annotations

import base64
import datetime as _dt
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kcover.testing import pki

if TYPE_CHECKING:
    from kcover.testing._core import ClusterCore

__all__ = ["KNOWN", "start_controllers"]

KNOWN = ("jobset", "training-operator")
_YEAR = _dt.timedelta(days=365)
_TO_NAMESPACE = "kubeflow"
_TO_SECRET = "training-operator-webhook-cert"
_TO_SERVICE = "training-operator"
_TO_WEBHOOK_CONFIG = "validator.training-operator.kubeflow.org"
_TO_MARKER = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")  # hard-coded upstream


def _webhook_configs(
    manifest: Path,
    port: int,
    ca_pem: bytes,
    names: dict[str, str],
    pod_selector: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """Webhook configurations from ``manifest`` with service refs replaced by loopback URLs."""
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    bundle = base64.b64encode(ca_pem).decode()
    for doc in docs:
        doc["metadata"] = {"name": names[doc["kind"]]}
        for hook in doc.get("webhooks", []):
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            hook["timeoutSeconds"] = 10
            targets_pods = any(
                "pods" in rule.get("resources", []) for rule in hook.get("rules", [])
            )
            if targets_pods and pod_selector is not None:
                hook["objectSelector"] = pod_selector
    return docs


def _apply_webhooks(cluster: ClusterCore, docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        plural = (
            "mutatingwebhookconfigurations"
            if doc["kind"] == "MutatingWebhookConfiguration"
            else "validatingwebhookconfigurations"
        )
        doc["apiVersion"] = "admissionregistration.k8s.io/v1"
        cluster.apply(
            f"/apis/admissionregistration.k8s.io/v1/{plural}/{doc['metadata']['name']}", doc
        )


def _wait_healthy(cluster: ClusterCore, name: str, probe_port: int, timeout: float = 90.0) -> None:
    import urllib.error
    import urllib.request

    comp = cluster.component(name)

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{probe_port}/readyz", timeout=2) as resp:
                return int(resp.status) == 200
        except (OSError, urllib.error.URLError):
            return False

    cluster.wait_for(ready, timeout, f"{name} readyz on port {probe_port} (log: {comp.log_path})")


def _data_files(cluster: ClusterCore, name: str) -> tuple[list[Path], Path]:
    """The CRD files and webhook manifest the build copied for controller ``name``."""
    from kcover.testing.binaries import BinariesMissingError

    crds = cluster.binaries.crds(name)
    manifest = cluster.binaries.root / "webhooks" / name / "manifests.yaml"
    if not crds or not manifest.is_file():
        raise BinariesMissingError(
            f"the CRDs or webhook manifest of {name} are missing under {cluster.binaries.root} "
            "(crds/, webhooks/); run hack/test-cluster/build"
        )
    return crds, manifest


def _write_certs(folder: Path, pair: pki.KeyPair) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tls.crt").write_bytes(pair.cert_pem)
    (folder / "tls.key").write_bytes(pair.key_pem)
    (folder / "tls.key").chmod(0o600)


def _start_jobset(cluster: ClusterCore) -> None:
    from kcover.ports import free_port

    bins = cluster.binaries
    crds, manifest = _data_files(cluster, "jobset")
    cluster.install_crds(crds)
    ca = pki.new_ca("kcover-jobset-webhook-ca")
    webhook_port, probe_port = free_port(), free_port()
    cert_dir = cluster.workdir / "jobset" / "certs"
    _write_certs(
        cert_dir, ca.issue_server(["127.0.0.1", "jobset-webhook-service.jobset-system.svc"])
    )
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
    }
    config_path = cluster.workdir / "jobset" / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    cluster.start_process(
        "jobset",
        [
            str(bins.path("jobset")),
            f"--config={config_path}",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            "--zap-log-level=info",
        ],
        kubeconfig=cluster.component_kubeconfig("controllers"),
    )
    _wait_healthy(cluster, "jobset", probe_port)
    docs = _webhook_configs(
        manifest,
        webhook_port,
        ca.cert_pem,
        {
            "MutatingWebhookConfiguration": "kcover-test-jobset-mutating",
            "ValidatingWebhookConfiguration": "kcover-test-jobset-validating",
        },
        {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]},
    )
    _apply_webhooks(cluster, docs)


def _start_training_operator(cluster: ClusterCore) -> None:
    from kcover.ports import free_port

    bins = cluster.binaries
    crds, manifest = _data_files(cluster, "training-operator")
    cluster.install_crds(crds)
    ca = pki.new_ca(
        "training-operator-ca", use_rsa=True, validity=_YEAR, dns_names=("training-operator-ca",)
    )
    serving = ca.issue_server(["127.0.0.1", f"{_TO_SERVICE}.{_TO_NAMESPACE}.svc"], validity=_YEAR)
    cluster.create_namespace(_TO_NAMESPACE)

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    cluster.apply(
        f"/api/v1/namespaces/{_TO_NAMESPACE}/secrets/{_TO_SECRET}",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": _TO_SECRET, "namespace": _TO_NAMESPACE},
            "data": {
                "ca.crt": b64(ca.cert_pem),
                "ca.key": b64(ca.key_pem),
                "tls.crt": b64(serving.cert_pem),
                "tls.key": b64(serving.key_pem),
            },
        },
    )
    # The webhook server reads $TMPDIR/k8s-webhook-server/serving-certs; the
    # rotator only checks that the hard-coded /tmp path exists.
    _write_certs(cluster.files.tmp / "k8s-webhook-server" / "serving-certs", serving)
    if not _TO_MARKER.exists():
        _write_certs(_TO_MARKER.parent, serving)
        cluster.cleanup_paths.append(_TO_MARKER.parent.parent)
    webhook_port, probe_port = free_port(), free_port()
    docs = _webhook_configs(
        manifest,
        webhook_port,
        ca.cert_pem,
        {"ValidatingWebhookConfiguration": _TO_WEBHOOK_CONFIG},
        None,
    )
    _apply_webhooks(cluster, docs)
    cluster.start_process(
        "training-operator",
        [
            str(bins.path("training-operator")),
            "--enable-scheme=pytorchjob",
            f"--webhook-server-port={webhook_port}",
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            "--leader-elect=false",
            "--zap-log-level=info",
        ],
        kubeconfig=cluster.component_kubeconfig("controllers"),
        extra_env={"MY_POD_NAMESPACE": _TO_NAMESPACE},
    )
    _wait_healthy(cluster, "training-operator", probe_port)


def start_controllers(cluster: ClusterCore, names: Sequence[str]) -> None:
    """Start the named optional controllers (``jobset``, ``training-operator``)."""
    from kcover.testing.binaries import BinariesMissingError

    for name in names:
        if name not in KNOWN:
            raise ValueError(f"unknown controller {name!r}; known: {', '.join(KNOWN)}")
        if not cluster.binaries.has(name):
            raise BinariesMissingError(cluster.binaries.why_missing(name))
    running = {comp.name for comp in cluster.components}
    for name in names:
        if name in running:
            continue
        if name == "jobset":
            _start_jobset(cluster)
        else:
            _start_training_operator(cluster)
