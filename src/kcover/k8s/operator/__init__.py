"""The recovery operator (``kcover operator``, built on kopf).

``views`` turns pods and jobs into plain records, ``assess`` decides (pure: the
shared catalog, attribution and policy), ``policy`` resolves a job's recovery
policy from the RecoveryPolicy resource and annotations, ``actuate`` carries a
decision out through the API, ``leader`` elects one acting replica, and
``main`` wires kopf's watches to them.
"""
