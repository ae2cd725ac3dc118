"""The fault vocabulary: one set of names every part of kcover speaks.

A *fault* is one observed sign of trouble (a log line, an exit status, a
missing heartbeat) matched to a catalog rule.  A *verdict* is what kcover
concludes from all the faults of a job: the root cause, the nodes to blame and
the action to take.  The collectors produce faults, the classifier turns them
into a verdict, and the launcher and the Kubernetes operator act on verdicts.

These names are a public contract (users read them in ``--json`` output and in
Kubernetes Events), so the enum values never change once released.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

NO_PROGRESS_RULE = "job.no-progress"
"""The catalog rule of a hang: built directly by the hang detectors, never parsed back from text."""

UNRECOGNISED_FAILURE_RULE = "job.unrecognised-failure"
"""No catalog rule: a log that ends in failure no rule names (:mod:`kcover.classify.fallback`).
Category ``other``, restarted within the user-code retry budget."""

GENERIC_EXCEPTION_RULE = "python.exception"
"""The catalog's rule for an exception line no specific rule knows: user code, unless its words name
a layer (:mod:`kcover.classify.vocabulary`); either way restarted within the user-code retry budget."""

USER_BUDGET_RULES = frozenset({UNRECOGNISED_FAILURE_RULE, GENERIC_EXCEPTION_RULE})
"""Rules whose failures spend the user-code retry budget whatever category they were given."""


class Category(StrEnum):
    """What kind of fault this is; decides who must act (operator, vendor, user)."""

    GPU_HARDWARE = "gpu_hardware"
    GPU_MEMORY_OOM = "gpu_memory_oom"
    NCCL_COMMUNICATION = "nccl_communication"
    COLLECTIVE_TIMEOUT_HANG = "collective_timeout_hang"
    NETWORK_INFINIBAND = "network_infiniband"
    CUDA_SOFTWARE = "cuda_software"
    STORAGE_IO = "storage_io"
    USER_CODE = "user_code"
    HOST_SYSTEM = "host_system"
    INFRA_K8S = "infra_k8s"
    OTHER = "other"


class Severity(StrEnum):
    """How bad one fault is: ``fatal`` ends the job, ``degraded`` warns, ``info`` only records."""

    FATAL = "fatal"
    DEGRADED = "degraded"
    INFO = "info"


class Role(StrEnum):
    """Whether a fault can be the cause of a failure or is usually an echo of one elsewhere."""

    ROOT = "root"
    CASCADE = "cascade"


class Action(StrEnum):
    """What should happen to the job next."""

    NONE = "none"
    RESTART = "restart"
    RESTART_EXCLUDING_NODES = "restart_excluding_nodes"
    FAIL = "fail"


@dataclass(frozen=True)
class Evidence:
    """Where a fault was seen: the source (a file, a rank, ``exit``), the line and its position."""

    source: str
    line: str
    line_number: int | None = None
    timestamp: str | None = None
    rank: int | None = None
    node: str | None = None
    step: int | None = None  # the last training step reported, for a hang (a recurring hang is deterministic)


@dataclass(frozen=True)
class Fault:
    """One classified sign of trouble, with the rule that recognised it.

    ``count`` is how many times the same line (digits masked) repeated in this
    source; floods are counted, not stored.
    """

    rule: str
    category: Category
    severity: Severity
    retriable: bool
    node_at_fault: bool
    role: Role
    priority: int
    title: str
    remediation: str
    evidence: Evidence
    count: int = 1

    @property
    def rank(self) -> int | None:
        return self.evidence.rank

    @property
    def node(self) -> str | None:
        return self.evidence.node

    @property
    def is_fatal(self) -> bool:
        return self.severity is Severity.FATAL


@dataclass(frozen=True)
class Verdict:
    """The conclusion about a whole job: root cause, who is to blame, what to do.

    ``category`` is ``None`` when no fault was found; with degraded signs only it
    is the worst sign's, and ``action`` is ``none`` (the job is not stopped).
    ``nodes`` and ``ranks`` name only the implicated places, never the ranks that
    merely reported cascade symptoms.
    """

    root: Fault | None
    action: Action
    faults: tuple[Fault, ...] = ()
    nodes: tuple[str, ...] = ()
    ranks: tuple[int, ...] = ()
    reason: str = ""
    warnings: tuple[str, ...] = field(default=())

    @property
    def category(self) -> Category | None:
        return self.root.category if self.root else None

    @property
    def retriable(self) -> bool:
        return self.root.retriable if self.root else True

    @property
    def node_at_fault(self) -> bool:
        return bool(self.root and self.root.node_at_fault)

    @property
    def rule(self) -> str | None:
        return self.root.rule if self.root else None
