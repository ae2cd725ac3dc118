"""Every label, annotation, taint and condition kcover reads or writes on Kubernetes objects.

A job opts in with the original project's label, so its users switch without
relabelling.  Per-job overrides are annotations on the job; kcover's own
bookkeeping lives in annotations it owns (``kcover.io/recovery`` on the job,
``kcover.io/faults`` on pods).  The node marks of a quarantine (taint, annotations,
the ``KcoverHealthy`` condition) are defined with the quarantine itself, in
:mod:`kcover.health.quarantine.policy`.
"""

from __future__ import annotations

OPT_IN_LABEL = "kcover.io/cascading-recovery"
OPT_IN_VALUE = "true"

# per-job overrides (annotations on the job)
MAX_RESTARTS = "kcover.io/max-restarts"
USER_CODE_RETRIES = "kcover.io/user-code-retries"
EXCLUDE_NODES = "kcover.io/exclude-nodes"
GRACE_PERIOD = "kcover.io/grace-period"
HANG_TIMEOUT = "kcover.io/hang-timeout"  # read by the node agent: seconds without a new step = hung
IN_PLACE = "kcover.io/in-place"  # "false": never restart this job's workers in place, always its pods
STRAGGLER_ACTION = "kcover.io/straggler-action"  # "report" (default) or "replace": restart without a slow node
TOTAL_STEPS = "kcover.io/total-steps"  # the job's last step: what a straggler's replacement would gain
IN_PLACE_TIMEOUT = "kcover.io/in-place-timeout"  # seconds an in-place restart may take before pods are restarted
STANDBY = "kcover.io/standby"  # how many of the job's pods are warm standbys (the others run its ranks)

# kcover's own records
RECOVERY = "kcover.io/recovery"
STATE = "kcover.io/state"
STRAGGLERS = "kcover.io/stragglers"  # on a job: the ranks the operator finds slow now (read by `kcover status`)
REASON = "kcover.io/reason"
POD_FAULTS = "kcover.io/faults"
POD_STATE = "kcover.io/pod-state"  # the agent's record of what ``kcover pod`` reported (generation, state, step)
PROGRESS = "kcover.io/progress"  # the agent's record of a pod's run: first step, newest checkpoint (ETTR)
STEP_TIMES = "kcover.io/step-times"  # the agent's record of each rank's newest compute seconds (stragglers)
GENERATION = "kcover.io/generation"  # on a pod, written by the operator: the generation its workers must run
RANK = "kcover.io/rank"  # on a pod (annotation and label), written by the operator: its rank, "standby" or "done"
INJECT = "kcover.io/inject"  # on a pod, written by the agent for ``kcover inject``: the order its kcover pod reads
EVIDENCE_LABEL = "kcover.io/evidence-for"

FIELD_MANAGER = "kcover"
