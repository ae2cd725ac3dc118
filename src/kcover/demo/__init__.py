"""``kcover demo``: a real DDP training recovered from injected faults, shown live."""
