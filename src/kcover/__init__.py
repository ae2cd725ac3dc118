"""kcover: fault awareness and instant recovery for distributed AI training.

The public API is small and re-exported here:

- :func:`explain` classifies log text and returns a :class:`Verdict` (root cause,
  blamed nodes and ranks, recommended :class:`Action`);
- :func:`explain_paths` does the same for files and folders of per-rank logs;
- :func:`progress`, :func:`checkpointed`, :func:`step_time` and :func:`timed`,
  the optional worker-side SDK of ``kcover run`` (no-ops elsewhere);
- the vocabulary types :class:`Category`, :class:`Severity`, :class:`Role`,
  :class:`Fault`, :class:`Evidence`.

Everything else is internal and may change.
"""

from kcover.explain import explain, explain_paths
from kcover.faults import Action, Category, Evidence, Fault, Role, Severity, Verdict
from kcover.sdk import checkpointed, progress, step_time, timed

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Category",
    "Evidence",
    "Fault",
    "Role",
    "Severity",
    "Verdict",
    "__version__",
    "checkpointed",
    "explain",
    "explain_paths",
    "progress",
    "step_time",
    "timed",
]
