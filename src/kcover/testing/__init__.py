"""Test support for kcover: a real Kubernetes control plane on loopback.

``hack/test-cluster/build`` compiles etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, KWOK (and optionally kubectl, helm,
the JobSet controller and the Kubeflow training-operator) from pinned Go
modules into ``~/.cache/kcover-test-cluster/<k8s version>/``.
:class:`TestCluster` runs them as child processes with certificates, tokens
and RBAC made on the fly; KWOK plays the kubelet for fake GPU nodes.

Public surface:

* :class:`TestCluster` - start/stop a cluster, create fake nodes, fail a pod
  with an exit code, make users and service accounts bound to roles, write CRI
  container logs (:mod:`kcover.testing.logs`).
* :func:`find_binaries` / :class:`Binaries` - where the programs are and why
  one is missing.
* :mod:`kcover.testing.fixtures` - the pytest plugin (session fixture
  ``test_cluster``); ``python -m kcover.testing.cluster up`` for manual work.
"""

from kcover.testing._process import ComponentDied
from kcover.testing._rest import ApiError
from kcover.testing.binaries import Binaries, BinariesMissing, find_binaries
from kcover.testing.cluster import ClusterStartError, Credentials, TestCluster
from kcover.testing.logs import LogLine, write_container_log

__all__ = [
    "ApiError",
    "Binaries",
    "BinariesMissing",
    "ClusterStartError",
    "ComponentDied",
    "Credentials",
    "LogLine",
    "TestCluster",
    "find_binaries",
    "write_container_log",
]
