"""One acting replica: leader election with a coordination.k8s.io Lease.

Every replica watches and keeps its cache warm; only the holder of the Lease
acts.  The holder renews it every ``duration / 3`` seconds; another replica
takes it over once it has not been renewed for ``duration`` seconds.  Takeover
is a conditional update (resourceVersion), so two replicas never both win.
Acting is safe across a takeover because every restart is a saga recorded on
the job itself (see :mod:`kcover.k8s.operator.actuate`).
"""

from __future__ import annotations

import datetime as dt

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kcover.timestamps import rfc3339


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LeaderElection:
    def __init__(self, api: client.ApiClient, namespace: str, identity: str, name: str = "kcover-operator",
                 duration: float = 15.0) -> None:
        self.coordination = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.identity = identity
        self.name = name
        self.duration = duration
        self.leader = False

    def tick(self) -> bool:
        """Acquire or renew the Lease; returns whether this replica leads now."""
        try:
            self.leader = self._tick()
        except ApiException:
            self.leader = False
        return self.leader

    def _tick(self) -> bool:
        now = _now()
        spec: dict[str, object] = {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, int(self.duration)),
                "renewTime": rfc3339(now, "microseconds")}
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            body = {"metadata": {"name": self.name}, "spec": {**spec, "acquireTime": spec["renewTime"]}}
            try:
                self.coordination.create_namespaced_lease(self.namespace, body)
            except ApiException as create_error:
                if create_error.status == 409:
                    return False
                raise
            return True
        holder = lease.spec.holder_identity
        renewed = lease.spec.renew_time
        expired = renewed is None or (now - renewed).total_seconds() > (lease.spec.lease_duration_seconds or 15)
        if holder != self.identity and not expired:
            return False
        if holder != self.identity:
            spec["acquireTime"] = spec["renewTime"]
        body = {"metadata": {"name": self.name, "resourceVersion": lease.metadata.resource_version}, "spec": spec}
        try:
            self.coordination.replace_namespaced_lease(self.name, self.namespace, body)
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        return True
