"""The decision core shared by the local launcher and the Kubernetes operator.

``policy`` decides what to do after an attempt failed (restart, exclude nodes,
fail fast) as a pure function; ``lifecycle`` holds the job's explicit state
machine.  Neither does I/O or reads a clock: callers pass time in.
"""
