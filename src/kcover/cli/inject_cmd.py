"""``kcover inject NAMESPACE/JOB KIND@TARGET``: rehearse a fault on a running job, the twin of ``kcover run --inject``.

It resolves TARGET (``rankN``: the pod of that rank, the Job's completion
index or the PyTorchJob's replica index; or a node name: the lowest-ranked pod
of the job there) to a pod and its node, writes what must happen — the kernel
line of an ``xid79``/``xid48``, or the order for ``kcover pod`` of a
``crash``/``hang``/``oom`` — into a ``FaultInjection`` in kcover's namespace,
and waits for the agent of that node to answer it
(:mod:`kcover.k8s.agent.inject`, which says why only admins can inject).
Exit 0 when the agent did it, 1 when it refused or did not answer (the request
is then withdrawn), 2 for a mistake in the command (one line, nothing created).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from kcover.cli.usage import UsageError, seconds
from kcover.collect.printable import printable
from kcover.exit_codes import ExitCode
from kcover.launcher.inject import InjectError, InjectKind, kernel_line, parse_kind
from kcover.launcher.pod_inject import PROCESS_KINDS, Order

KINDS = (InjectKind.XID79, InjectKind.XID48, *PROCESS_KINDS)
MAX_ARGUMENT = 300
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_EXAMPLES = "e.g. xid79@rank0, crash@rank1 or hang@<node name>"
POLL_SECONDS = 0.2


def _shown(text: str) -> str:
    return printable(repr(text if len(text) <= 80 else text[:80] + "…"))


def parse_job(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` as its two parts; :class:`UsageError` says what is wrong."""
    if len(text) > MAX_ARGUMENT:
        raise UsageError(f"the job {_shown(text)} is too long ({len(text)} characters): give NAMESPACE/NAME")
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name:
        raise UsageError(f"give the job as NAMESPACE/NAME, e.g. training/llama (got {_shown(text)})")
    if not _NAMESPACE.match(namespace) or not _NAME.match(name):
        raise UsageError(f"{_shown(text)} is not NAMESPACE/NAME: a namespace and a job name are lowercase letters, "
                         "digits and '-' (a name may also hold '.')")
    return namespace, name


def parse_target(text: str) -> tuple[InjectKind, str]:
    """``KIND@TARGET`` as its kind and target (``rankN`` or a node name)."""
    if len(text) > MAX_ARGUMENT:
        raise UsageError(f"the injection {_shown(text)} is too long ({len(text)} characters): expected KIND@TARGET, "
                         f"{_EXAMPLES}")
    kind_text, at, target = text.partition("@")
    if not at or not kind_text or not target:
        raise UsageError(f"bad injection {_shown(text)}: expected KIND@TARGET, {_EXAMPLES}")
    if kind_text == InjectKind.SLOW.value:
        raise UsageError("slow is for kcover run only (its throttle runs in the launcher); on Kubernetes: "
                         + ", ".join(k.value for k in KINDS))
    try:
        kind = parse_kind(printable(text[:80]), kind_text, KINDS)
    except InjectError as error:
        raise UsageError(str(error)) from None
    if ":" in target:
        raise UsageError(f"bad injection {_shown(text)}: on Kubernetes an injection fires at once (step= and after= "
                         "are for kcover run)")
    if not re.fullmatch(r"rank\d{1,7}", target) and not _NAME.match(target):
        raise UsageError(f"bad target {_shown(target)}: give rankN (the pod's rank in the job) or a node's name")
    return kind, target


def inject(
    job: Annotated[str, typer.Argument(metavar="NAMESPACE/JOB", help="The job (a Job, JobSet or PyTorchJob).")],
    spec: Annotated[str, typer.Argument(metavar="KIND@TARGET",
                                        help="KIND: xid79, xid48 (a kernel line on the target's node, through its "
                                             "kcover agent), crash, hang, oom (a worker of the target's kcover pod). "
                                             "TARGET: rankN (the pod of that rank) or a node name.")],
    namespace: Annotated[str, typer.Option("--namespace", help="kcover's namespace, where the request is created.")]
    = "kcover-system",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the node's agent to answer.",
                                           callback=seconds())] = 30.0,
    kubeconfig: Annotated[Path | None, typer.Option(help="Kubeconfig (default: KUBECONFIG).")] = None,
) -> None:
    """Rehearse a fault on a running job through kcover's agent (cluster admins only)."""
    job_namespace, job_name = parse_job(job)
    kind, target = parse_target(spec)
    if not _NAMESPACE.match(namespace):
        raise UsageError(f"--namespace {_shown(namespace)} is not a namespace name")
    from kcover.cli.k8s_cmd import connect_kubernetes

    api = connect_kubernetes(kubeconfig)
    from kcover.k8s.agent.inject import InjectionRequest

    kind_of_job, pod = _resolve(api, job_namespace, job_name, kind, target)
    meta, node = pod["metadata"], pod["spec"]["nodeName"]
    rank = _rank(pod)
    if kind in PROCESS_KINDS and rank is None:
        raise UsageError(f"pod {meta['name']} has no rank (completion or replica index), which kcover pod needs to "
                         f"find the worker for {kind.value}")
    order = Order(kind, rank, uuid.uuid4().hex[:16]).text() if kind in PROCESS_KINDS and rank is not None else None
    request = InjectionRequest(kind.value, kind_of_job, job_namespace, job_name, meta["name"], meta["uid"], node,
                               rank, line=kernel_line(kind, 0) if kind not in PROCESS_KINDS else None, order=order)
    name = _create(api, namespace, request.for_storage(namespace))
    status = _wait(api, namespace, name, timeout)
    where = f"pod {meta['name']}" + (f" (rank {rank})" if rank is not None else "") + f" on node {node}"
    if status is None:
        typer.echo(f"kcover: no answer from the kcover agent on node {node} within {timeout:g} s (is it running "
                   f"there?); the request {namespace}/{name} was withdrawn", err=True)
        raise typer.Exit(ExitCode.FAILED)
    message = printable(str(status.get("message", "")))
    if status.get("phase") != "Done":
        typer.echo(f"kcover: {kind.value} on {where} refused by its agent: {message}", err=True)
        raise typer.Exit(ExitCode.FAILED)
    typer.echo(f"injected {kind.value} on {where} ({namespace}/{name}): {message}")


def _api_message(error: Any) -> str:
    try:
        return str(json.loads(error.body)["message"])
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


def _read_job(api: Any, namespace: str, name: str) -> tuple[str, dict[str, str]] | None:
    """The kind and labels of the job named so, trying every supported kind; None when there is none."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from kcover.k8s.kinds import BATCH_JOB, JOBSET, PYTORCHJOB

    for kind in (BATCH_JOB, JOBSET, PYTORCHJOB):
        try:
            if kind is BATCH_JOB:
                return kind.kind, dict(client.BatchV1Api(api).read_namespaced_job(name, namespace).metadata.labels
                                       or {})
            body = client.CustomObjectsApi(api).get_namespaced_custom_object(kind.group, kind.version, namespace,
                                                                             kind.plural, name)
            return kind.kind, dict((body.get("metadata") or {}).get("labels") or {})
        except ApiException as error:
            if error.status != 404:
                raise UsageError(f"cannot read {kind.kind} {namespace}/{name}: {_api_message(error)}") from None
    return None


def _resolve(api: Any, namespace: str, name: str, kind: InjectKind, target: str) -> tuple[str, dict[str, Any]]:
    """The job's kind and the target pod (serialized), or :class:`UsageError` saying why there is none."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from kcover.k8s.agent.inject import why_not_process_target
    from kcover.k8s.kinds import KINDS as JOB_KINDS
    from kcover.k8s.names import OPT_IN_LABEL, OPT_IN_VALUE

    found = _read_job(api, namespace, name)
    if found is None:
        raise UsageError(f"no Job, JobSet or PyTorchJob named {namespace}/{name}")
    if found[1].get(OPT_IN_LABEL) != OPT_IN_VALUE:
        raise UsageError(f"{found[0]} {namespace}/{name} has not opted in ({OPT_IN_LABEL}={OPT_IN_VALUE}): kcover "
                         "would not recover it, so there is nothing to rehearse")
    core = client.CoreV1Api(api)
    try:
        listed = core.list_namespaced_pod(namespace, label_selector=JOB_KINDS[found[0]].selector(name))
    except ApiException as error:
        raise UsageError(f"cannot list the pods of {namespace}/{name}: {_api_message(error)}") from None
    pods = [api.sanitize_for_serialization(p) for p in listed.items]
    running = sorted((p for p in pods if (p.get("status") or {}).get("phase") == "Running"
                      and (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")),
                     key=lambda p: (_rank(p) is None, _rank(p) or 0))
    if not running:
        raise UsageError(f"{found[0]} {namespace}/{name} has no running pod to inject into")
    pod = _pick(running, target, f"{namespace}/{name}")
    if kind in PROCESS_KINDS:
        why_not = why_not_process_target(pod)
        if why_not is not None:
            raise UsageError(f"cannot inject {kind.value}: {why_not}")
    return found[0], pod


def _pick(running: list[dict[str, Any]], target: str, job: str) -> dict[str, Any]:
    ranks = sorted({r for r in map(_rank, running) if r is not None})
    if re.fullmatch(r"rank\d+", target):
        wanted = int(target.removeprefix("rank"))
        pod = next((p for p in running if _rank(p) == wanted), None)
        if pod is not None:
            return pod
        known = f"{ranks[0]}–{ranks[-1]}" if ranks else "none"
        if not ranks or wanted > ranks[-1]:
            raise UsageError(f"rank {wanted} is out of range: the running pods of {job} have ranks {known}")
        raise UsageError(f"no running pod of rank {wanted} in {job} (running ranks: "
                         f"{', '.join(map(str, ranks))})")
    pod = next((p for p in running if p["spec"]["nodeName"] == target), None)
    if pod is None:
        nodes = sorted({p["spec"]["nodeName"] for p in running})
        raise UsageError(f"no running pod of {job} on node {_shown(target)} (its nodes: {', '.join(nodes[:10])}"
                         + (", …" if len(nodes) > 10 else "") + ")")
    return pod


def _rank(pod: dict[str, Any]) -> int | None:
    from kcover.k8s.operator.views import pod_view

    return pod_view(pod).rank


def _create(api: Any, namespace: str, body: dict[str, Any]) -> str:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from kcover.k8s.agent.inject import GROUP, PLURAL, VERSION

    try:
        created = client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                                               body)
    except ApiException as error:
        if error.status == 403:
            raise UsageError(f"not allowed to create FaultInjections in namespace {namespace}: only those whose role "
                             "allows it there may inject (cluster admins; the kcover chart grants nobody else)"
                             ) from None
        if error.status == 404 and "namespace" not in _api_message(error).lower():
            raise UsageError("the FaultInjection resource is not installed (its CRD is in charts/kcover/crds; "
                             "installing or upgrading the chart adds it)") from None
        raise UsageError(f"cannot create the request in namespace {namespace}: {_api_message(error)}") from None
    return str(created["metadata"]["name"])


def _wait(api: Any, namespace: str, name: str, timeout: float) -> dict[str, Any] | None:
    """The agent's answer (the request's status), or None after ``timeout`` (the request then deleted)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from kcover.k8s.agent.inject import GROUP, PLURAL, VERSION

    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout
    while True:
        body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        status = body.get("status") or {}
        if status.get("phase"):
            return dict(status)
        if time.monotonic() >= deadline:
            with contextlib.suppress(ApiException):
                custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
            return None
        time.sleep(POLL_SECONDS)
