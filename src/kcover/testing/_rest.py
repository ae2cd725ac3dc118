"""A minimal JSON client for the test cluster's API server (standard library only).

The harness must bootstrap the cluster (wait for ``/readyz``, create nodes,
install CRDs, bind RBAC roles, annotate pods) before any test code runs, and
must not depend on the optional ``kubernetes`` package to do it. This client
speaks just enough HTTPS + JSON for that: a verb, a path, an optional body.
Tests themselves use whichever client they like against the written
kubeconfig (the smoke test uses the official ``kubernetes`` package).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

__all__ = ["ApiError", "RestClient"]

JSON = dict[str, Any]


class ApiError(RuntimeError):
    """The API server answered with an HTTP error status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        try:
            detail = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            detail = body
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")


class RestClient:
    """Bearer-token HTTPS client bound to one server and CA."""

    def __init__(self, server: str, ca_pem_path: str, token: str) -> None:
        self.server = server.rstrip("/")
        self._token = token
        self._ctx = ssl.create_default_context(cafile=ca_pem_path)

    def raw(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> tuple[int, bytes]:
        """Send one request; return (status, body) for any HTTP status."""
        req = urllib.request.Request(self.server + path, data=body, method=method)
        req.add_header("Authorization", f"Bearer {self._token}")
        req.add_header("Accept", "application/json")
        if body is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=timeout) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as err:
            return int(err.code), bytes(err.read())

    def request(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> JSON:
        """Send JSON, return decoded JSON; raise :class:`ApiError` on status >= 400."""
        data = json.dumps(body).encode() if body is not None else None
        status, payload = self.raw(method, path, data, content_type, timeout)
        if status >= 400:
            raise ApiError(method, path, status, payload.decode("utf-8", "replace"))
        if not payload:
            return {}
        decoded = json.loads(payload)
        return decoded if isinstance(decoded, dict) else {"items": decoded}

    def get(self, path: str) -> JSON:
        return self.request("GET", path)

    def post(self, path: str, body: JSON) -> JSON:
        return self.request("POST", path, body)

    def delete(self, path: str) -> JSON:
        return self.request("DELETE", path)

    def merge_patch(self, path: str, body: JSON) -> JSON:
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def apply(self, path: str, body: JSON, field_manager: str = "kcover-test-cluster") -> JSON:
        """Server-side apply (create or update) of a whole object at ``path``."""
        sep = "&" if "?" in path else "?"
        return self.request(
            "PATCH",
            f"{path}{sep}fieldManager={field_manager}&force=true",
            body,
            "application/apply-patch+yaml",
        )
