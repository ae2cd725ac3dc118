"""Fixtures for the tests that need the real test cluster (see kcover.testing.fixtures)."""

from kcover.testing.fixtures import (  # noqa: F401 - pytest finds fixtures by name
    _test_cluster_alive,
    jobset_controller,
    k8s_api,
    namespace,
    test_cluster,
    training_operator,
)
