"""Read one Kubernetes job into a :class:`~kcover.runreport.model.RunData`, for ``kcover report --job``.

On a cluster kcover keeps no history database; what happened to a job is
spread over the records the operator and the agents leave on the API server:

- the job's ``kcover.io/recovery`` annotation (read only through
  :meth:`~kcover.k8s.operator.record.RecoveryRecord.from_annotation`): how many
  attempts and restarts, the past failures, the last verdict, excluded nodes;
- the operator's Events on the job: each ``KcoverRestart`` marks when an
  attempt ended and the next one began (a restart replayed by a new leader
  repeats the same message and counts once; the second Event of a restart that
  created a batch Job again does not count);
- the agents' ``KcoverFault`` Events on the job's pods: one fault each, placed
  on the pod's node (the pod's own when it still exists, else the Event's
  ``source.host``) and in the attempt that was running when it was seen;
- the evidence ConfigMaps ``kcover-evidence-<job>-<attempt>``: the verdict of
  each failed attempt and the log lines kept from its failing pods.

Kubernetes records no training steps, checkpoints or productive time, so the
report leaves those out and says so in one line; Events expire (an hour by
default), so older attempts may have no times, and the page says that too.
Everything read is bounded (:data:`MAX_EVENTS`, :data:`MAX_CONFIGMAPS`), and
lists are read as raw JSON, page by page, which is several times faster than the
client's models for thousands of Events.
"""

from __future__ import annotations

import bisect
import datetime as dt
import json
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from kcover.classify.rules import CatalogError, load_catalog_files, shipped_catalog_files
from kcover.exit_codes import ExitCode
from kcover.k8s.kinds import BATCH_JOB, JOBSET, PYTORCHJOB, JobKind
from kcover.k8s.names import EVIDENCE_LABEL, OPT_IN_LABEL, OPT_IN_VALUE, REASON, RECOVERY
from kcover.k8s.operator.record import FailureSummary, RecoveryPhase, RecoveryRecord
from kcover.k8s.status import read_job
from kcover.runreport.build import write_report
from kcover.runreport.model import AttemptRow, FaultRow, RunData
from kcover.runreport.output import ReportError, check_target
from kcover.timestamps import parse_rfc3339

MAX_EVENTS = 10_000
"""Events read per kind of Event (the job's own, the faults on its pods); beyond, the page says so."""
PAGE = 500
MAX_CONFIGMAPS = 200
"""Evidence ConfigMaps read (one per restart)."""
KEPT_HEAD, KEPT_TAIL = 10, 20
"""Lines of each pod's kept log shown: the first ones (the fault lines) and the last ones (the log's tail)."""
MAX_KEPT_PODS = 8
OPERATOR, AGENT = "kcover-operator", "kcover-agent"
NOT_RECORDED = ("Kubernetes does not record training steps, checkpoints or productive time, so ETTR, step "
                "progress and where the time went are not shown.")
SEARCH_ORDER = (JOBSET, PYTORCHJOB, BATCH_JOB)
"""Kinds looked up for a name, the opted-in one winning (a JobSet's child Jobs carry other names)."""
FAULT_MESSAGE = re.compile(r"([a-z0-9_]+) \(([^()\s]+)\): (.*)", re.DOTALL)
"""The agent's Event message: ``<category> (<rule>): <line>``."""


def report_job(api: client.ApiClient, namespace: str, name: str, target: Path | None, png: bool = False
               ) -> list[Path]:
    """Write the report of job ``namespace/name`` to ``target`` (default ``./report-<ns>-<name>.html``).

    Returns the files written.  Raises :class:`ReportError` with one line to show: a usage error for a job
    that does not exist or is not opted in, or a bad target; a failure for a cluster that cannot be reached
    or read.
    """
    target = target or Path(f"report-{namespace}-{name}.html")
    check_target(target)
    host = str(api.configuration.host)
    try:
        run = load_job(api, namespace, name)
    except ApiException as exc:
        raise ReportError(f"cannot read {namespace}/{name} from the Kubernetes API at {host}: "
                          f"{exc.status} {exc.reason}") from None
    except (HTTPError, OSError) as exc:
        why = str(getattr(exc, "reason", None) or exc)
        raise ReportError(f"cannot reach the Kubernetes API server at {host}: {why[:300]}") from None
    return write_report(run, f"the Kubernetes API at {host}", target, png)


def load_job(api: client.ApiClient, namespace: str, name: str, now: dt.datetime | None = None) -> RunData:
    """The report's model of job ``namespace/name`` (any kind kcover recovers).

    Raises :class:`ReportError` (usage) for a job that does not exist or is not opted in; API errors and
    connection errors pass through (the caller says the cluster could not be read).
    """
    kind, body = _find(api, namespace, name)
    moment = (now or dt.datetime.now(dt.UTC)).timestamp()
    return _Reader(api, kind, body, moment).run()


def _find(api: client.ApiClient, namespace: str, name: str) -> tuple[JobKind, dict[str, Any]]:
    found = [(kind, body) for kind in SEARCH_ORDER if (body := read_job(api, kind, namespace, name)) is not None]
    if not found:
        kinds = ", ".join(k.kind for k in SEARCH_ORDER)
        raise ReportError(f"--job {namespace}/{name}: no such job (looked for a {kinds})", ExitCode.USAGE)
    for kind, body in found:
        if (_meta(body).get("labels") or {}).get(OPT_IN_LABEL) == OPT_IN_VALUE:
            return kind, body
    kind = found[0][0]
    raise ReportError(f"--job {namespace}/{name}: the {kind.kind} is not opted in to kcover (it has no label "
                      f"{OPT_IN_LABEL}={OPT_IN_VALUE}), so kcover kept no record of it", ExitCode.USAGE)


@dataclass(frozen=True)
class _Kept:
    attempt: int
    verdict: dict[str, Any]
    logs: tuple[tuple[str, str], ...]


class _Reader:
    """Reads one job's records and maps them into the report's model (one instance per report)."""

    def __init__(self, api: client.ApiClient, kind: JobKind, body: dict[str, Any], now: float) -> None:
        self.core = client.CoreV1Api(api)
        self.kind, self.body, self.now = kind, body, now
        meta = _meta(body)
        self.namespace, self.name = str(meta.get("namespace")), str(meta.get("name"))
        self.annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
        self.created = _epoch(meta.get("creationTimestamp")) or now
        self.notes: list[str] = [NOT_RECORDED]

    def run(self) -> RunData:
        text = self.annotations.get(RECOVERY)
        record = RecoveryRecord.from_annotation(text)
        if text and record == RecoveryRecord() and not record.extra:
            self.notes.append(f"The recovery record ({RECOVERY}) on the job could not be read; attempts and "
                              "restarts are taken from the Events alone.")
        pods = self._pods()
        kept = self._evidence()
        restarts = self._restarts()
        seen = self._fault_events(pods, {pod for k in kept.values() for pod, _ in k.logs})
        # a Job kcover created again is younger than its history: the first attempt began at the earliest record
        first = min([self.created, *restarts[:1], *(at for _, at in seen if at is not None)])
        starts = self._starts(record, first, restarts)
        attempts = self._attempts(record, starts, pods, kept)
        faults = self._faults(seen, pods, starts)
        attempts = _with_fault_nodes(attempts, faults)
        return RunData(
            run_id=0, started=first, ended=max(first, attempts[-1].ended or self.now),
            status=self._status(record), command=f"{self.kind.kind} {self.namespace}/{self.name}",
            restarts=max(record.restarts, len(restarts)), ettr=None, reason=self._reason(record), run_dir=None,
            nproc_per_node=None, excluded=tuple(dict.fromkeys((*record.excluded, *record.quarantine))),
            attempts=attempts, faults=faults, title=f"{self.kind.kind} {self.namespace}/{self.name}",
            notes=tuple(self.notes), progress_recorded=False,
        )

    # -- reading ---------------------------------------------------------------------------------
    def _list(self, call: Any, what: str, limit: int = MAX_EVENTS, **query: Any) -> list[dict[str, Any]]:
        """Every item of a list call, as raw JSON, page by page, at most ``limit`` (the page says when cut)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            response = call(self.namespace, limit=min(PAGE, limit - len(items)), _continue=token,
                            _preload_content=False, **query)
            page = json.loads(response.data)
            items += [i for i in page.get("items") or [] if isinstance(i, dict)]
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return items
            if len(items) >= limit:
                self.notes.append(f"Only the first {limit:,} {what} were read.")
                return items

    def _pods(self) -> dict[str, str]:
        """The job's pods that still exist, name → node."""
        listed = self._list(self.core.list_namespaced_pod, "pods", label_selector=self.kind.selector(self.name))
        return {str(_meta(p).get("name")): str((p.get("spec") or {}).get("nodeName") or "") for p in listed}

    def _evidence(self) -> dict[int, _Kept]:
        """The evidence ConfigMaps of the job, by the number of the attempt whose failure they keep."""
        listed = self._list(self.core.list_namespaced_config_map, "evidence ConfigMaps", limit=MAX_CONFIGMAPS,
                            label_selector=f"{EVIDENCE_LABEL}={self.name[:63]}")
        prefix = f"kcover-evidence-{self.name}-"
        kept: dict[int, _Kept] = {}
        for item in listed:
            number = str(_meta(item).get("name") or "").removeprefix(prefix)
            data = item.get("data") or {}
            if number.isdigit() and isinstance(data, dict):
                kept[int(number)] = _kept(int(number), data)
        return kept

    @cached_property
    def job_events(self) -> list[dict[str, Any]]:
        """The operator's Events on the job (read once)."""
        listed = self._list(self.core.list_namespaced_event, "Events on the job",
                            field_selector=f"involvedObject.name={self.name}")
        return [e for e in listed if (e.get("involvedObject") or {}).get("kind") == self.kind.kind
                and (e.get("source") or {}).get("component") == OPERATOR]

    def _restarts(self) -> list[float]:
        """When each restart began, from the operator's ``KcoverRestart`` Events (replays counted once)."""
        seen: dict[str, float] = {}
        for event in self.job_events:
            message, moment = str(event.get("message") or ""), _event_time(event)
            if event.get("reason") != "KcoverRestart" or message.startswith("created again") or moment is None:
                continue
            seen[message] = min(moment, seen.get(message, moment))
        return sorted(seen.values())

    # -- mapping ---------------------------------------------------------------------------------
    def _starts(self, record: RecoveryRecord, first: float, restarts: list[float]) -> list[float]:
        """The start of every attempt: the job's creation, then each restart (older ones' Events expired)."""
        count = max(record.attempt, len(restarts) + 1)
        missing = count - 1 - len(restarts)
        if missing > 0:
            self.notes.append(f"The Events of {missing} earlier restart{'s' if missing > 1 else ''} have expired "
                              f"(Kubernetes keeps Events for about an hour): attempt{'s' if missing > 1 else ''} "
                              f"2–{missing + 1} are drawn at the job's start, without duration.")
        return [first] * (missing + 1) + restarts

    def _attempts(self, record: RecoveryRecord, starts: list[float], pods: dict[str, str],
                  kept: dict[int, _Kept]) -> tuple[AttemptRow, ...]:
        last = len(starts)
        verdicts = _verdicts(record, last)
        rows = []
        for number, started in enumerate(starts, start=1):
            ended = starts[number] if number < last else self._end(record)
            evidence = kept.get(number)
            verdict = evidence.verdict if evidence and evidence.verdict else verdicts.get(number, {})
            outcome = self._outcome(record) if number == last else "failed"
            nodes = sorted({n for n in pods.values() if n}) if number == last else []
            rows.append(AttemptRow(
                number=number, started=started, ended=ended, nodes=tuple(nodes), outcome=outcome, verdict=verdict,
                decision=str(verdict.get("decision") or ("" if outcome != "failed" else "none recorded")),
                reason="", moments={}, kept=evidence.logs if evidence else (),
            ))
        return tuple(rows)

    def _fault_events(self, pods: dict[str, str], kept: set[str]) -> list[tuple[dict[str, Any], float | None]]:
        """The agents' ``KcoverFault`` Events on the job's pods, with when each was seen."""
        listed = self._list(self.core.list_namespaced_event, "fault Events", field_selector="reason=KcoverFault")
        return [(e, _event_time(e)) for e in listed if (e.get("source") or {}).get("component") == AGENT
                and self._owns(str((e.get("involvedObject") or {}).get("name") or ""), pods, kept)]

    def _faults(self, seen: list[tuple[dict[str, Any], float | None]], pods: dict[str, str], starts: list[float]
                ) -> tuple[FaultRow, ...]:
        """A fault per Event, in the attempt running when it was seen, on its pod's node (else the agent's)."""
        rows = []
        for event, at in seen:
            pod = str((event.get("involvedObject") or {}).get("name") or "")
            attempt = max(1, bisect.bisect_right(starts, at)) if at is not None else len(starts)
            node = pods.get(pod) or str((event.get("source") or {}).get("host") or "") or None
            rows.append(_fault(event, attempt, node, pod, at))
        return tuple(sorted(rows, key=lambda f: (f.at if f.at is not None else self.now, f.attempt)))

    def _owns(self, pod: str, pods: dict[str, str], kept: set[str]) -> bool:
        """A pod of this job: one that exists with the job's label, one whose log the operator kept, or one
        gone whose name the job's controller gave it (``<job>-…``)."""
        return pod in pods or pod in kept or pod.startswith(f"{self.name}-")

    def _end(self, record: RecoveryRecord) -> float:
        status = self.body.get("status") or {}
        done = _epoch(status.get("completionTime")) if isinstance(status, dict) else None
        if done is not None:
            return done
        if record.phase is not RecoveryPhase.FAILED:
            return self.now
        failed = [t for e in self.job_events if e.get("reason") == "KcoverFailed" and (t := _event_time(e)) is not None]
        return max(failed, default=self.now)

    def _outcome(self, record: RecoveryRecord) -> str:
        condition = _condition(self.body)
        if condition in ("Complete", "Completed", "Succeeded"):
            return "succeeded"
        if condition == "Failed" or record.phase is RecoveryPhase.FAILED:
            return "failed"
        return "restarting" if record.phase is RecoveryPhase.RESTARTING else "running"

    def _status(self, record: RecoveryRecord) -> str:
        outcome = self._outcome(record)
        return "running" if outcome == "restarting" else outcome

    def _reason(self, record: RecoveryRecord) -> str:
        return self.annotations.get(REASON) or (record.last.decision if record.last else "")


def _verdicts(record: RecoveryRecord, attempts: int) -> dict[int, dict[str, Any]]:
    """What the record says about failed attempts: its past failures, aligned to the newest failed attempt,
    and its last verdict in full."""
    newest = attempts if record.phase is RecoveryPhase.FAILED else attempts - 1
    found: dict[int, dict[str, Any]] = {}
    for offset, failure in enumerate(reversed(record.failures)):
        if newest - offset >= 1:
            category = failure.category.value if failure.category else None
            found[newest - offset] = FailureSummary(category=category, rule=failure.rule).to_dict()
    if record.last is not None and newest >= 1:
        found[newest] = record.last.to_dict()
    return found


def _kept(number: int, data: dict[str, Any]) -> _Kept:
    try:
        verdict = json.loads(str(data.get("verdict.json") or "{}"))
    except (ValueError, RecursionError):
        verdict = {}
    logs = sorted((str(k).removesuffix(".log"), str(v)) for k, v in data.items() if str(k).endswith(".log"))
    excerpts = [(pod, _excerpt(text)) for pod, text in logs[:MAX_KEPT_PODS]]
    if len(logs) > MAX_KEPT_PODS:
        excerpts.append((f"{len(logs) - MAX_KEPT_PODS} more pods", f"see ConfigMap kcover-evidence-…-{number}"))
    return _Kept(number, verdict if isinstance(verdict, dict) else {}, tuple(excerpts))


def _excerpt(text: str) -> str:
    lines = text.splitlines()
    if len(lines) <= KEPT_HEAD + KEPT_TAIL:
        return "\n".join(lines)
    skipped = len(lines) - KEPT_HEAD - KEPT_TAIL
    return "\n".join([*lines[:KEPT_HEAD], f"… {skipped:,} lines …", *lines[-KEPT_TAIL:]])


def _fault(event: dict[str, Any], attempt: int, node: str | None, pod: str, at: float | None) -> FaultRow:
    message = str(event.get("message") or "")
    parsed = FAULT_MESSAGE.fullmatch(message)
    category, rule, line = parsed.groups() if parsed else ("other", "unknown", message)
    severity, role = _rule_kind(rule)
    if severity is None:
        severity = "fatal" if event.get("type") == "Warning" else "info"
    count = event.get("count")
    return FaultRow(attempt=attempt, rule=rule, category=category, severity=severity, role=role or "root",
                    rank=None, node=node, count=count if isinstance(count, int) and count > 0 else 1,
                    source=f"pod {pod}", line_number=None, line=line, at=at)


def _rule_kind(rule: str) -> tuple[str | None, str | None]:
    spec = _catalog().get(rule)
    return (spec[0], spec[1]) if spec else (None, None)


@lru_cache(maxsize=1)
def _catalog() -> dict[str, tuple[str, str]]:
    """Severity and role of each shipped rule (an Event carries only the rule's id)."""
    try:
        rules = load_catalog_files(shipped_catalog_files())
    except CatalogError:
        return {}
    return {r.id: (r.spec.severity.value, r.spec.role.value) for r in rules}


def _with_fault_nodes(attempts: tuple[AttemptRow, ...], faults: tuple[FaultRow, ...]) -> tuple[AttemptRow, ...]:
    """Each attempt's nodes: its pods' (the current attempt), those its faults came from, those its verdict
    blamed."""
    seen: dict[int, dict[str, None]] = {a.number: dict.fromkeys(a.nodes) for a in attempts}
    for fault in faults:
        if fault.node and fault.attempt in seen:
            seen[fault.attempt].setdefault(fault.node)
    rows = []
    for attempt in attempts:
        blamed = attempt.verdict.get("nodes")
        nodes = seen[attempt.number]
        nodes.update(dict.fromkeys(str(n) for n in blamed if n) if isinstance(blamed, list) else {})
        rows.append(AttemptRow(**{**attempt.__dict__, "nodes": tuple(nodes)}))
    return tuple(rows)


def _condition(body: dict[str, Any]) -> str | None:
    """The job's terminal condition (``Complete``, ``Completed``, ``Succeeded``, ``Failed``) if it has one."""
    status = body.get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for condition in conditions if isinstance(conditions, list) else []:
        if isinstance(condition, dict) and condition.get("status") == "True" and condition.get("type") in (
                "Complete", "Completed", "Succeeded", "Failed"):
            return str(condition["type"])
    return None


def _meta(body: dict[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _event_time(event: dict[str, Any]) -> float | None:
    """When an Event was first seen: ``eventTime``, ``firstTimestamp``, ``lastTimestamp`` or its creation."""
    for key in ("eventTime", "firstTimestamp", "lastTimestamp"):
        moment = _epoch(event.get(key))
        if moment is not None:
            return moment
    return _epoch(_meta(event).get("creationTimestamp"))


def _epoch(text: object) -> float | None:
    moment = parse_rfc3339(text)
    return moment.timestamp() if moment is not None else None
