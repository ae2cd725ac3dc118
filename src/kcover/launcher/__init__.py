"""The local launcher: ``kcover run`` supervises a multi-process training job on one machine.

``workers`` starts and stops worker process groups, ``output`` reads their
output and progress, ``hang`` detects the absence of progress, ``inject`` plays
faults for testing, ``history`` records runs in SQLite, and ``supervisor`` ties
them to the shared decision core in :mod:`kcover.decide`.
"""
