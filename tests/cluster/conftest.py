"""Fixtures for the tests that need the real test cluster (see kcover.testing.fixtures)."""

from kcover.testing.fixtures import (  # noqa: F401 - pytest finds fixtures by name
    _test_cluster_alive,
    jobset_controller,
    k8s_api,
    test_cluster,
    test_namespace,
    training_operator,
)
