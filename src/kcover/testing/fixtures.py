"""pytest plugin: one real test cluster per session, shared by the tests that ask for it.

Use it from a ``conftest.py`` with ``pytest_plugins = ["kcover.testing.fixtures"]``
(root conftest only) or by importing the fixtures. Fixtures:

* ``test_cluster`` (session): a started :class:`~kcover.testing.TestCluster`
  with two fake GPU nodes (8 ``nvidia.com/gpu`` each); stopped at the end of
  the session.
* ``jobset_controller`` / ``training_operator`` (session): start that
  controller in ``test_cluster`` on first use; skip with the recorded build
  error if that optional program could not be built.
* ``k8s_api`` (session): a ``kubernetes.client.ApiClient`` for the admin
  kubeconfig (needs the ``kubernetes`` package).
* ``test_namespace`` (function): a fresh namespace, deleted afterwards.
* ``real_nodes`` (session): two real nodes (containerd + runc + kubelet, see
  :mod:`kcover.testing.realnodes`) added to ``test_cluster`` on first use;
  stopped at the end of the session, failing it if anything was left on the
  machine. Tests that use it carry the ``real_node`` marker.

Tests that use ``test_cluster`` run after all the others, and before the first
of them the plugin runs ``hack/test-cluster/build`` when there is a checkout
(outside the tests' time limit): it builds nothing when the programs are built,
and waits when a build is already running — ``make test`` starts one in the
background at the lowest CPU priority, so the cluster compiles while the tests
that do not need it run.
Missing binaries fail the session with the command that builds them; they
skip instead only when ``KCOVER_TEST_CLUSTER_ALLOW_SKIP=1``.
``KCOVER_TEST_CLUSTER_KEEP=1`` keeps the cluster's temp dir (component logs
in ``logs/``) after the session, for debugging. After each test
that used the cluster, a component that died fails the session
(``pytest.exit``) with its last log lines.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from kcover.testing._process import ComponentDiedError
from kcover.testing.binaries import cache_dir, find_binaries, hack_dir
from kcover.testing.cluster import TestCluster
from kcover.testing.controllers import start_controllers
from kcover.testing.realnodes import RealNodePool, missing_prerequisites

__all__ = [
    "jobset_controller",
    "k8s_api",
    "real_nodes",
    "test_cluster",
    "test_namespace",
    "training_operator",
]

ALLOW_SKIP = "KCOVER_TEST_CLUSTER_ALLOW_SKIP"
KEEP = "KCOVER_TEST_CLUSTER_KEEP"


_CLUSTER_BUILT = pytest.StashKey[bool]()


def _needs_cluster(item: pytest.Item) -> bool:
    return "test_cluster" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that use the cluster go last (in their order), giving its build the most time."""
    items.sort(key=_needs_cluster)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Before the first test that uses the cluster, outside its time limit: finish the cluster's build."""
    if _needs_cluster(item) and not item.config.stash.get(_CLUSTER_BUILT, False):
        item.config.stash[_CLUSTER_BUILT] = True
        _finish_cluster_build(item.config)
    yield


def _finish_cluster_build(config: pytest.Config) -> None:
    """Run the build script (it waits for a build in progress); its failure is reported by ``test_cluster``."""
    try:
        script = hack_dir() / "build"
    except FileNotFoundError:
        return  # an installed kcover: the programs are where KCOVER_TEST_CLUSTER_CACHE says, or missing
    log = cache_dir() / "logs" / "pytest-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    began = time.monotonic()
    with log.open("w") as out:
        result = subprocess.run([str(script)], stdout=out, stderr=subprocess.STDOUT, check=False)
    if reporter is not None:
        reporter.write_line(f"\ntest cluster build finished (exit {result.returncode}) after "
                            f"{time.monotonic() - began:.0f} s of waiting; log: {log}")


@pytest.fixture(scope="session")
def test_cluster() -> Iterator[TestCluster]:
    """A real control plane for the whole session (see module docstring)."""
    binaries = find_binaries()
    missing = binaries.missing()
    if missing:
        message = (
            f"test-cluster binaries missing in {binaries.bin}: {', '.join(missing)}; "
            "build them with hack/test-cluster/build"
        )
        if os.environ.get(ALLOW_SKIP) == "1":
            pytest.skip(message + f" ({ALLOW_SKIP}=1)")
        pytest.fail(message + f" (or set {ALLOW_SKIP}=1 to skip these tests)", pytrace=False)
    cluster = TestCluster(binaries, keep=os.environ.get(KEEP) == "1")
    cluster.start()
    try:
        cluster.create_nodes(2)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def real_nodes(test_cluster: TestCluster) -> Iterator[RealNodePool]:
    """Two real nodes in ``test_cluster`` (see module docstring); their names are ``pool.nodes``."""
    kubelet = test_cluster.binaries.path("kubelet") if test_cluster.binaries.has("kubelet") else None
    missing = missing_prerequisites(kubelet)
    if missing:
        message = "real nodes cannot run here: " + "; ".join(missing)
        if os.environ.get(ALLOW_SKIP) == "1":
            pytest.skip(message + f" ({ALLOW_SKIP}=1)")
        pytest.fail(message + f" (or set {ALLOW_SKIP}=1 to skip these tests)", pytrace=False)
    test_cluster.add_real_nodes(2)
    pool = test_cluster.real_node_pool
    assert pool is not None
    try:
        yield pool
    finally:
        test_cluster.real_node_pool = None
        left = pool.stop()
        if left:
            pytest.fail("real nodes left this behind:\n" + "\n".join(left), pytrace=False)


@pytest.fixture(autouse=True)
def _test_cluster_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the session, showing its log, if a cluster component died during a test."""
    yield
    if "test_cluster" not in request.fixturenames:
        return
    cluster: TestCluster = request.getfixturevalue("test_cluster")
    try:
        cluster.check()
    except ComponentDiedError as err:
        pytest.exit(str(err), returncode=3)


@pytest.fixture(scope="session")
def k8s_api(test_cluster: TestCluster) -> Iterator[Any]:
    """``kubernetes.client.ApiClient`` for the admin kubeconfig."""
    kubernetes = pytest.importorskip("kubernetes")
    client = kubernetes.config.new_client_from_config(config_file=str(test_cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def test_namespace(test_cluster: TestCluster) -> Iterator[str]:
    """A fresh namespace for one test; deletion is left to the namespace controller."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    test_cluster.create_namespace(name)
    yield name
    test_cluster.api.request("DELETE", f"/api/v1/namespaces/{name}")


def _controller(cluster: TestCluster, name: str) -> TestCluster:
    if not cluster.binaries.has(name):
        pytest.skip(
            f"optional controller {name} is not available: {cluster.binaries.why_missing(name)}"
        )
    start_controllers(cluster, [name])
    return cluster


@pytest.fixture(scope="session")
def jobset_controller(test_cluster: TestCluster) -> TestCluster:
    """``test_cluster`` with the real JobSet controller (and its webhooks) running."""
    return _controller(test_cluster, "jobset")


@pytest.fixture(scope="session")
def training_operator(test_cluster: TestCluster) -> TestCluster:
    """``test_cluster`` with the Kubeflow training-operator (PyTorchJob) running."""
    return _controller(test_cluster, "training-operator")
