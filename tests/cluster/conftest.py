"""Fixtures for the tests that need the real test cluster come from kcover.testing.fixtures (root conftest)."""
