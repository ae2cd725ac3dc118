"""The operator reaches the API server at the address the pod's environment gives, not through cluster DNS."""

from __future__ import annotations

import kopf
import pytest

from kcover.k8s.operator.main import in_cluster_address

INFO = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t", ca_path="/ca.crt")


def test_the_service_environment_replaces_the_dns_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    info = in_cluster_address(INFO)
    assert info is not None and info.server == "https://10.96.0.1:443"
    assert (info.token, info.ca_path) == ("t", "/ca.crt")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    info = in_cluster_address(INFO)
    assert info is not None and info.server == "https://[fd00::1]:443"


def test_without_the_environment_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    assert in_cluster_address(INFO) is INFO
    assert in_cluster_address(None) is None
