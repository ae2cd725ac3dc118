"""``kcover check --node``: ask a node's kcover agent to run a health suite now, and wait for the answer.

The request is the node annotation ``kcover.io/health-request: <suite>/<id>``;
the agent (:mod:`kcover.k8s.agent.health`) watches its node, runs the suite,
writes the results with that id into ``kcover.io/health`` and removes the
request.  A request nobody answers in time is withdrawn, so an agent that
starts later does not run it.  Needs the ``k8s`` extra.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kcover.health.quarantine.policy import ANNOTATION_HEALTH, ANNOTATION_HEALTH_REQUEST

NOT_FOUND, UNPROCESSABLE = 404, 422


class NoSuchNodeError(LookupError):
    """The node named in the request does not exist."""


def withdraw_request(core: client.CoreV1Api, node: str, value: str) -> None:
    """Remove the request annotation if it still holds ``value`` (a JSON patch "test", so a newer one stays)."""
    path = "/metadata/annotations/" + ANNOTATION_HEALTH_REQUEST.replace("~", "~0").replace("/", "~1")
    try:
        core.patch_node(node, [{"op": "test", "path": path, "value": value}, {"op": "remove", "path": path}])
    except ApiException as exc:
        if exc.status not in (UNPROCESSABLE, NOT_FOUND):
            raise


def health_record(annotations: Mapping[str, str] | None) -> dict[str, Any] | None:
    """The agent's last health record on a node (annotation ``kcover.io/health``), or None."""
    try:
        record = json.loads((annotations or {})[ANNOTATION_HEALTH])
    except (KeyError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _answer(core: client.CoreV1Api, node: str, request: str) -> dict[str, Any] | None:
    record = health_record(core.read_node(node).metadata.annotations)
    return record if record is not None and record.get("request") == request else None


def request_suite(api: client.ApiClient, node: str, suite: str, timeout: float,
                  poll: float = 0.5) -> dict[str, Any] | None:
    """Ask the agent on ``node`` to run ``suite``; its record (``checks``, ``status``, ``at``), or None on timeout."""
    core = client.CoreV1Api(api)
    try:
        core.read_node(node)
    except ApiException as exc:
        if exc.status == NOT_FOUND:
            raise NoSuchNodeError(f"no node named {node!r}") from None
        raise
    request = uuid.uuid4().hex[:12]
    value = f"{suite}/{request}"
    core.patch_node(node, {"metadata": {"annotations": {ANNOTATION_HEALTH_REQUEST: value}}})
    deadline = time.monotonic() + timeout
    while True:
        record = _answer(core, node, request)
        if record is not None:
            return record
        if time.monotonic() >= deadline:
            withdraw_request(core, node, value)
            return None
        time.sleep(poll)
