"""Root cause across ranks: from all the faults of a job to one verdict.

When one GPU fails, every rank of the job logs something: the broken rank an
Xid or a CUDA error, all the others NCCL remote errors and watchdog timeouts.
Blaming every node that logged an error is the classic mistake (one Xid cascade
once flagged 77 nodes).  The rules here are few and explicit:

1. Only fatal faults can end a job; degraded ones are reported, never acted on.
   With degraded signs only, the worst of them is named but the action is ``none``.
2. A fault whose rule is a *root* candidate beats any *cascade* symptom; among
   roots the highest rule priority wins (hardware over software over user code,
   as set in the catalog), then the earliest observation.
3. The implicated ranks and nodes are those that show the root fault's rule;
   cascade reporters are never blamed.  Nodes are named for exclusion
   only when the root rule says the node is at fault.
4. With only cascade symptoms, the earliest of highest priority stands as the
   root, and nobody is blamed; for a collective timeout, the ranks it waited
   for are named when the timeout lines tell (:mod:`kcover.classify.laggards`),
   never as nodes to exclude.
5. When no rule explains the failure (no fatal fault, or only reports of a
   non-zero exit or of an uncaught C++ exception) but a source's log ends in
   failure, that source's last fatal-looking line is the root
   (:mod:`kcover.classify.fallback`: category ``other``, or the layer its words
   name); it never changes a verdict that a rule explains.

Pure computation: no I/O, no clock.  Used by ``kcover explain``, the local
launcher and the Kubernetes operator alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from kcover.classify.fallback import Tail, fallback_faults, unexplained
from kcover.classify.laggards import Progress, find_laggards, progress_of_faults
from kcover.collect.sources import SourceInfo
from kcover.faults import Action, Category, Fault, Role, Verdict

T = TypeVar("T")


def _order(fault: Fault, position: int) -> tuple[int, int, str, int]:
    """Sort key: roots first, then priority, then time (when stamped), then position seen."""
    stamp = fault.evidence.timestamp or "~"
    return (0 if fault.role is Role.ROOT else 1, -fault.priority, stamp, position)


def _action(root: Fault) -> Action:
    if not root.retriable:
        return Action.FAIL
    return Action.RESTART_EXCLUDING_NODES if root.node_at_fault else Action.RESTART


def _unique(values: Iterable[T | None]) -> list[T]:
    seen: list[T] = []
    for value in values:
        if value is not None and value not in seen:
            seen.append(value)
    return seen


def attribute(
    faults: Sequence[Fault],
    warnings: Sequence[str] = (),
    tails: Mapping[SourceInfo, Tail] | None = None,
    progress: Sequence[Progress] = (),
    ranks_read: Mapping[int, str | None] | None = None,
) -> Verdict:
    """The verdict for a job from every fault observed in it (and the tails of its logs, for rule 5).

    ``progress``: what collective-timeout lines told of each rank beyond the
    faults' evidence (:meth:`FaultCollector.progress`: lines of many ranks in
    one log count as one fault), for the laggards of rule 4; ``ranks_read``:
    the ranks whose logs were read, and their nodes (default: the tails'), for
    its suspects.
    """
    if tails and unexplained(faults):
        faults = [*faults, *fallback_faults(tails, beyond_exit=any(fault.is_fatal for fault in faults))]
    if not faults:
        return Verdict(root=None, action=Action.NONE, reason="no fault found", warnings=tuple(warnings))
    fatal = [(fault, position) for position, fault in enumerate(faults) if fault.is_fatal]
    if not fatal:
        worst, _ = min(((f, p) for p, f in enumerate(faults)), key=lambda item: _order(*item))
        return Verdict(
            root=worst,
            action=Action.NONE,
            faults=tuple(faults),
            reason=f"degraded, not fatal: {worst.title} ({worst.rule}); no action needed now",
            warnings=tuple(warnings),
        )
    root, _ = min(fatal, key=lambda item: _order(*item))
    if root.role is Role.CASCADE:
        laggards = None
        if root.category is Category.COLLECTIVE_TIMEOUT_HANG:
            if ranks_read is None:
                ranks_read = {source.rank: source.node for source in tails or () if source.rank is not None}
            laggards = find_laggards([*progress_of_faults(faults), *progress], dict(ranks_read))
        return Verdict(
            root=root,
            action=_action(root),
            faults=tuple(faults),
            ranks=laggards.ranks if laggards else (),
            reason=f"only cascade symptoms seen ({root.title}); "
            + (laggards.describe() if laggards else "the rank that failed first left no sign"),
            warnings=tuple(warnings),
        )
    implicated = [fault for fault, _ in fatal if fault.rule == root.rule]
    # a line naming the failed node outranks one of the same rule naming none (Slurm's "JOB … CANCELLED
    # DUE TO NODE FAILURE" before "Node failure on gpu-a05"), whatever their order
    root = next((fault for fault in implicated if fault.node_at_fault), root)
    ranks = sorted(_unique(fault.rank for fault in implicated))
    nodes = _unique(fault.node for fault in implicated if fault.node_at_fault)
    where = f" on {', '.join(nodes)}" if nodes else (f" on rank {ranks[0]}" if len(ranks) == 1 else "")
    return Verdict(
        root=root,
        action=_action(root),
        faults=tuple(faults),
        nodes=tuple(nodes),
        ranks=tuple(ranks),
        reason=f"{root.title}{where} ({root.rule})",
        warnings=tuple(warnings),
    )
