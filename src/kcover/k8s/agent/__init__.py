"""The node agent (``kcover agent``, a DaemonSet): classify where the logs are written.

``tail`` follows CRI container logs and the kernel log with saved offsets,
``pods`` knows which pods on the node belong to opted-in jobs, ``report``
writes Events, pod fault records and the node condition, and ``loop`` ties
them together.
"""
