"""Unit tests of the test-cluster harness pieces that need no Kubernetes binaries.

They cover the bad-input and fault paths of the issue: a component that dies
is reported with its last log lines, a port found taken is retried on another
port, missing binaries produce a message naming the build command, plus the
CRI log writer and the certificates.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from kcover.ports import free_port
from kcover.testing import _core as cluster_mod
from kcover.testing import pki
from kcover.testing._core import _Files
from kcover.testing._process import Component, ComponentDiedError
from kcover.testing.binaries import Binaries, BinariesMissingError
from kcover.testing.cluster import ClusterStartError, TestCluster
from kcover.testing.logs import LogLine, write_container_log


def test_dead_component_reports_its_last_log_lines(tmp_path: Path) -> None:
    script = "import sys; print('starting'); print('fatal: etcd cluster unreachable'); sys.exit(3)"
    comp = Component("fake", [sys.executable, "-c", script], tmp_path / "fake.log", {}, tmp_path)
    comp.start()
    assert comp.proc is not None
    comp.proc.wait(10)
    with pytest.raises(ComponentDiedError) as info:
        comp.check()
    assert "status 3" in str(info.value)
    assert "fatal: etcd cluster unreachable" in str(info.value)


def test_stopped_component_is_not_reported_dead(tmp_path: Path) -> None:
    comp = Component(
        "sleeper",
        [sys.executable, "-c", "import time; time.sleep(60)"],
        tmp_path / "s.log",
        {},
        tmp_path,
    )
    comp.start()
    assert comp.alive()
    comp.stop(timeout=5)
    assert not comp.alive()
    comp.check()


_SERVER = """
import socket, sys, time
port = int(sys.argv[1])
s = socket.socket()
try:
    s.bind(("127.0.0.1", port))
except OSError:
    print(f"listen tcp 127.0.0.1:{port}: bind: address already in use", flush=True)
    sys.exit(1)
s.listen()
print(f"serving on {port}", flush=True)
time.sleep(60)
"""


def test_port_in_use_is_retried_on_another_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ports = iter([busy])
    monkeypatch.setattr(cluster_mod, "free_port", lambda: next(ports, None) or free_port())
    harness = TestCluster(Binaries(tmp_path / "cache"), tmp_path / "work")
    harness._files = _Files(tmp_path / "work")
    log_path = tmp_path / "work" / "logs" / "fake-server.log"

    def serving(port: int) -> bool:  # the fake's own word, not just "something listens"
        return f"serving on {port}" in log_path.read_text()

    try:
        port = harness._launch(
            "fake-server", lambda p: [sys.executable, "-c", _SERVER, str(p)], serving, timeout=10
        )
        assert port != busy
        log = log_path.read_text()
        assert f"port {busy} was taken; retrying" in log
    finally:
        harness.stop()
        taken.close()
    assert not (tmp_path / "work").exists()


def test_component_that_fails_to_start_names_itself(tmp_path: Path) -> None:
    harness = TestCluster(Binaries(tmp_path / "cache"), tmp_path / "work")
    harness._files = _Files(tmp_path / "work")
    script = "print('error: unknown flag --bogus'); raise SystemExit(2)"
    with pytest.raises(
        ClusterStartError, match=r"'broken' exited with status 2(.|\n)*unknown flag --bogus"
    ):
        harness._launch(
            "broken", lambda p: [sys.executable, "-c", script], lambda p: False, timeout=10
        )
    harness.stop()


def test_missing_binaries_say_how_to_build_them(tmp_path: Path) -> None:
    binaries = Binaries(tmp_path)
    with pytest.raises(BinariesMissingError, match="hack/test-cluster/build"):
        binaries.require()
    (tmp_path / "unavailable").mkdir()
    (tmp_path / "unavailable" / "jobset.txt").write_text(
        "go build of sigs.k8s.io/jobset failed:\nboom\n"
    )
    assert "boom" in binaries.why_missing("jobset")
    assert "not built" in binaries.why_missing("helm")


def test_cri_log_lines_and_layout(tmp_path: Path) -> None:
    path = write_container_log(
        tmp_path,
        "ns",
        "pod-0",
        "uid-1",
        "trainer",
        ["hello", LogLine("oops", "stderr"), "y" * 10],
        max_record=4,
    )
    assert path == tmp_path / "ns_pod-0_uid-1" / "trainer" / "0.log"
    records = [line.split(" ", 3) for line in path.read_text().splitlines()]
    assert [r[1:] for r in records[:2]] == [["stdout", "P", "hell"], ["stdout", "F", "o"]]
    assert records[2][1:] == ["stderr", "F", "oops"]
    assert [r[2] for r in records[3:]] == ["P", "P", "F"]
    assert all(
        r[0].endswith("Z") and len(r[0]) == len("2024-01-01T00:00:00.000000000Z") for r in records
    )
    times = [r[0] for r in records]
    assert times == sorted(times)


def test_client_certificate_carries_user_and_groups() -> None:
    ca = pki.new_ca()
    pair = ca.issue_client("alice", ("team-a", "team-b"))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "alice"
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    assert orgs == ["team-a", "team-b"]
    assert cert.issuer == ca.cert.subject


def test_shipped_kwok_stages_parse_and_match_the_harness() -> None:
    import yaml

    from kcover.testing.binaries import hack_dir
    from kcover.testing.cluster import FAIL_ANNOTATION, SUCCEED_ANNOTATION

    text = (hack_dir() / "stages" / "stages.yaml").read_text()
    stages = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(text)}
    assert set(stages) == {
        "node-ready",
        "node-heartbeat",
        "pod-running",
        "pod-fail",
        "pod-succeed",
        "pod-delete",
    }
    for stage in stages.values():
        assert stage["apiVersion"] == "kwok.x-k8s.io/v1alpha1"
        assert stage["kind"] == "Stage"
        assert stage["spec"]["resourceRef"]["kind"] in ("Node", "Pod")
        assert "statusTemplate" in stage["spec"]["next"] or stage["spec"]["next"].get("delete")
    assert FAIL_ANNOTATION in str(stages["pod-fail"]["spec"]["selector"])
    assert SUCCEED_ANNOTATION in str(stages["pod-succeed"]["spec"]["selector"])
