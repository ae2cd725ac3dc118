"""Rehearsed faults on Kubernetes: the agent's side of ``kcover inject NS/JOB KIND@TARGET``.

The request is a ``FaultInjection`` (kcover.io/v1alpha1) in kcover's own
namespace (:func:`kcover_namespace`), which only those whose RBAC lets them
create one there may write — cluster admins; the chart grants nobody else,
and the agent itself may only read them and patch their status.  A pod, or a
user who can edit the job or its pods, cannot forge one, and the agent never
takes an injection from a log.

``kcover inject`` resolves the target to a pod and its node, and writes what
must happen into the request: ``spec.line`` (the kernel line ``kcover run
--inject`` writes for an ``xid79``/``xid48``) or ``spec.order`` (``crash``,
``hang``, ``oom``: the order for ``kcover pod``, :mod:`kcover.launcher.pod_inject`).
Every :data:`POLL_SECONDS` the agent of that node (:class:`InjectionDesk`,
called from :meth:`Agent.poll_once <kcover.k8s.agent.loop.Agent.poll_once>`)
lists the requests labelled with its node and answers each new one once:

- a kernel line goes through the agent's own kernel-log path (the callable
  ``kernel``, :meth:`Agent._kernel <kcover.k8s.agent.loop.Agent._kernel>`), exactly as a
  line read from ``/dev/kmsg``: the node condition, a fault on every opted-in pod of the node;
- an order is written on the pod (annotation :data:`ORDER_ANNOTATION`), whose ``kcover pod``
  reads it through the downward API; a pod that does not run ``kcover pod`` with that
  file is refused (:func:`why_not_process_target`).

The answer is the request's status: ``phase`` Done or Failed, ``at``, the
``line`` (or order) and a ``message``.  A request older than :data:`MAX_AGE`
seconds is refused as expired, so an agent that starts late never fires an old one.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kcover.collect.lines import clean_block
from kcover.k8s.agent.pods import PodInfo
from kcover.k8s.names import INJECT, POD_STATE
from kcover.k8s.wire import PodStatus

GROUP, VERSION, PLURAL, KIND = "kcover.io", "v1alpha1", "faultinjections", "FaultInjection"
DEFAULT_NAMESPACE = "kcover-system"
NODE_LABEL = "kcover.io/node"  # on a FaultInjection: the node whose agent answers it (see node_label)
ORDER_ANNOTATION = INJECT  # on a pod: the order its kcover pod reads (downward API)
KERNEL_KINDS = ("xid79", "xid48")
PROCESS_KINDS = ("crash", "hang", "oom")
POLL_SECONDS = 1.0
MAX_AGE = 120.0
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
log = logging.getLogger("kcover.agent.inject")

Kernel = Callable[[bytes, dict[str, PodInfo]], int]


def kcover_namespace(env: Mapping[str, str] | None = None, account_file: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """Where kcover runs, and so where injection requests are obeyed: ``POD_NAMESPACE``, the pod's service
    account namespace, else ``kcover-system``."""
    value = (os.environ if env is None else env).get("POD_NAMESPACE")
    if value:
        return value
    try:
        return account_file.read_text().strip() or DEFAULT_NAMESPACE
    except OSError:
        return DEFAULT_NAMESPACE


def node_label(node: str) -> str:
    """The label value naming ``node`` (a node name too long for a label value becomes a digest)."""
    if _LABEL_VALUE.match(node):
        return node
    return "sha256-" + hashlib.sha256(node.encode()).hexdigest()[:56]


@dataclass(frozen=True)
class InjectionRequest:
    """A ``FaultInjection``: the one reader and writer of its spec."""

    kind: str
    job_kind: str
    job_namespace: str
    job_name: str
    pod: str
    pod_uid: str
    node: str
    rank: int | None
    line: str | None = None
    order: str | None = None
    name: str = ""
    uid: str = ""
    created: datetime | None = None
    phase: str | None = None

    def for_storage(self, namespace: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"kind": self.kind, "job": {"kind": self.job_kind, "namespace": self.job_namespace,
                                                           "name": self.job_name},
                                "pod": self.pod, "podUID": self.pod_uid, "node": self.node}
        spec.update({key: value for key, value in (("rank", self.rank), ("line", self.line), ("order", self.order))
                     if value is not None})
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": {"generateName": "inject-", "namespace": namespace,
                             "labels": {NODE_LABEL: node_label(self.node)}},
                "spec": spec}

    @classmethod
    def from_storage(cls, body: Mapping[str, Any]) -> InjectionRequest | None:
        """The request in a stored object; None when it is not one (the schema makes that rare)."""
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        job = spec.get("job") or {}
        try:
            created = datetime.fromisoformat(str(meta["creationTimestamp"]).replace("Z", "+00:00"))
            return cls(str(spec["kind"]), str(job["kind"]), str(job["namespace"]), str(job["name"]), str(spec["pod"]),
                       str(spec["podUID"]), str(spec["node"]), _rank(spec.get("rank")), spec.get("line"),
                       spec.get("order"),
                       str(meta["name"]), str(meta["uid"]), created, (body.get("status") or {}).get("phase"))
        except (KeyError, TypeError, ValueError):
            return None


def _rank(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def why_not_process_target(pod: Mapping[str, Any]) -> str | None:
    """Why ``crash``/``hang``/``oom`` cannot reach this pod (a serialized Pod), or None when they can."""
    meta = pod.get("metadata") or {}
    name = meta.get("name", "?")
    if PodStatus.decode((meta.get("annotations") or {}).get(POD_STATE)) is None:
        return (f"pod {name} does not run `kcover pod` (it has no {POD_STATE} annotation), so nobody in it can "
                "act on a process fault; only xid79 and xid48 reach pods without it")
    if not _projects_order(pod.get("spec") or {}):
        return (f"pod {name} runs `kcover pod` but does not project the annotation {ORDER_ANNOTATION}: add "
                f"{{path: inject, fieldRef: {{fieldPath: \"metadata.annotations['{ORDER_ANNOTATION}']\"}}}} "
                "to the downwardAPI volume that holds its generation file")
    return None


def _projects_order(spec: Mapping[str, Any]) -> bool:
    for volume in spec.get("volumes") or []:
        sources = [volume.get("downwardAPI") or {}]
        sources += [source.get("downwardAPI") or {} for source in (volume.get("projected") or {}).get("sources") or []]
        for source in sources:
            for item in source.get("items") or []:
                if ORDER_ANNOTATION in ((item.get("fieldRef") or {}).get("fieldPath") or ""):
                    return True
    return False


@dataclass(frozen=True)
class Answer:
    phase: str
    message: str
    line: str | None = None

    def status(self, now: datetime) -> dict[str, Any]:
        status = {"phase": self.phase, "at": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "message": self.message[:1024]}
        return {"status": {**status, "line": self.line[:1024]} if self.line else status}


class InjectionDesk:
    """The injection requests for one node, polled every :data:`POLL_SECONDS` and each answered once."""

    def __init__(self, api: client.ApiClient, node: str, namespace: str | None = None) -> None:
        self.node = node
        self.namespace = namespace or kcover_namespace()
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.answered: set[str] = set()
        self.polled = -POLL_SECONDS
        self.last_error = ""

    def serve(self, pods: dict[str, PodInfo], kernel: Kernel) -> int:
        """Answer the new requests for this node (at most every :data:`POLL_SECONDS`); new faults reported."""
        if time.monotonic() - self.polled < POLL_SECONDS:
            return 0
        self.polled = time.monotonic()
        new = 0
        for request in self._pending():
            self.answered.add(request.uid)
            try:
                answer, faults = self._answer(request, pods, kernel)
            except Exception as error:  # a 403 while reporting, say: the requester must hear of it, once
                log.exception("injection %s failed", request.name)
                what = f"{error.status} {error.reason}" if isinstance(error, ApiException) else str(error)
                answer, faults = Answer("Failed", f"the agent on node {self.node} failed: {what}"), 0
            new += faults
            self._record(request, answer)
        return new

    def _pending(self) -> list[InjectionRequest]:
        try:
            listed = self.custom.list_namespaced_custom_object(  # from the API server's cache: cheap at 1/s/node
                GROUP, VERSION, self.namespace, PLURAL, label_selector=f"{NODE_LABEL}={node_label(self.node)}",
                resource_version="0")
        except ApiException as error:  # no CRD yet, a role without it: say so once, keep serving the logs
            self._warn(f"cannot list FaultInjections in {self.namespace}: {error.status} {error.reason}")
            return []
        self.last_error = ""
        requests = (InjectionRequest.from_storage(item) for item in listed.get("items") or [])
        return [r for r in requests if r is not None and r.node == self.node and r.phase is None
                and r.uid not in self.answered]

    def _answer(self, request: InjectionRequest, pods: dict[str, PodInfo], kernel: Kernel) -> tuple[Answer, int]:
        age = (datetime.now(UTC) - request.created).total_seconds() if request.created else 0.0
        if age > MAX_AGE:
            return Answer("Failed", f"expired: created {age:.0f} s ago, and requests are answered within "
                                    f"{MAX_AGE:.0f} s only"), 0
        if request.kind in KERNEL_KINDS and request.line:
            faults = kernel(clean_block(request.line.encode("utf-8", "replace") + b"\n"), pods)
            told = (f"{faults} new fault(s) reported" if faults else
                    "a repeat of a fault this agent already reported: counted, not reported again")
            log.info("injection %s: kernel line fed on node %s (%s)", request.name, self.node, told)
            return Answer("Done", f"kernel line fed to the agent on node {self.node}: {told}", request.line), faults
        if request.kind in PROCESS_KINDS and request.order:
            return self._order(request), 0
        return Answer("Failed", f"nothing to do for kind {request.kind!r} without its line or order"), 0

    def _order(self, request: InjectionRequest) -> Answer:
        """Write the order on the pod, if it is still the same pod, on this node, with ``kcover pod``."""
        try:
            pod = self.core.api_client.sanitize_for_serialization(
                self.core.read_namespaced_pod(request.pod, request.job_namespace))
        except ApiException as error:
            return Answer("Failed", f"cannot read pod {request.job_namespace}/{request.pod}: {error.status} "
                                    f"{error.reason}")
        meta = pod.get("metadata") or {}
        if meta.get("uid") != request.pod_uid or (pod.get("spec") or {}).get("nodeName") != self.node:
            return Answer("Failed", f"pod {request.pod} is no longer the target: it was replaced or moved off "
                                    f"node {self.node}")
        why_not = why_not_process_target(pod)
        if why_not is not None:
            return Answer("Failed", why_not)
        patch = {"metadata": {"annotations": {ORDER_ANNOTATION: request.order}}}
        try:
            self.core.patch_namespaced_pod(request.pod, request.job_namespace, patch)
        except ApiException as error:
            return Answer("Failed", f"cannot write the order on pod {request.pod}: {error.status} {error.reason}")
        log.info("injection %s: order %s written on pod %s", request.name, request.order, request.pod)
        return Answer("Done", f"order written on pod {request.pod}; its kcover pod acts on it once the kubelet "
                              "updates the file", request.order)

    def _record(self, request: InjectionRequest, answer: Answer) -> None:
        try:
            self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, request.name,
                                                              answer.status(datetime.now(UTC)))
        except ApiException as error:
            log.warning("injection %s: cannot record the answer (%s): %s %s", request.name, answer.phase,
                        error.status, error.reason)

    def _warn(self, message: str) -> None:
        if message != self.last_error:
            log.warning("%s", message)
        self.last_error = message
