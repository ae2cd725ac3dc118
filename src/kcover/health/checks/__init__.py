"""The built-in health checks; importing this package registers them all.

One module per area: ``gpu`` (NVML readings and the kernel's Xid history),
``dcgm`` (``dcgmi diag``), ``compute`` (matmul burn), ``collective``
(all-reduce bus bandwidth), ``storage`` (checkpoint path) and ``network``
(InfiniBand/RoCE ports from sysfs).  Each check needs only what it measures:
without a GPU or an InfiniBand device those checks say ``skipped`` and why.
"""

from kcover.health.checks import collective, compute, dcgm, gpu, network, storage

__all__ = ["collective", "compute", "dcgm", "gpu", "network", "storage"]
