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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcover.testing._process import ComponentDiedError
    from kcover.testing._rest import ApiError
    from kcover.testing.binaries import Binaries, BinariesMissingError, find_binaries
    from kcover.testing.cluster import ClusterStartError, Credentials, TestCluster
    from kcover.testing.logs import LogLine, write_container_log

# Imported lazily so that ``python -m kcover.testing.cluster`` does not import
# the module twice (runpy warns about that).
_WHERE = {
    "ComponentDiedError": "_process",
    "ApiError": "_rest",
    "Binaries": "binaries",
    "BinariesMissingError": "binaries",
    "find_binaries": "binaries",
    "ClusterStartError": "cluster",
    "Credentials": "cluster",
    "TestCluster": "cluster",
    "LogLine": "logs",
    "write_container_log": "logs",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"kcover.testing.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'kcover.testing' has no attribute {name!r}")


__all__ = [
    "ApiError",
    "Binaries",
    "BinariesMissingError",
    "ClusterStartError",
    "ComponentDiedError",
    "Credentials",
    "LogLine",
    "TestCluster",
    "find_binaries",
    "write_container_log",
]
