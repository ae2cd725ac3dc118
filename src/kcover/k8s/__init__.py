"""Kubernetes mode: the node agent, the recovery operator and what they share.

``names`` holds the labels, annotations and taints (a public contract),
``kinds`` the supported job kinds, ``wire`` the fault records the agent writes
on pods and the operator reads back, ``agent`` and ``operator`` the two
programs.  Both use the same catalog and the same pure decision core as
``kcover run``.
"""
