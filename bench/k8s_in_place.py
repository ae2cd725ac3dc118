"""In-place restart vs pod recreation on real nodes: a crashed rank → every rank stepping again.

``python -m bench.k8s_in_place --real-nodes 2 --trials 3``.  On the test control
plane with real nodes (containerd + runc + kubelet), a 2-rank gloo DDP job runs
``kcover pod -- python -m kcover.testing.trainer`` (one pod per node, a memory
snapshot every step, a disk checkpoint every 10), watched by the real operator
and one agent per node.  Each trial SIGKILLs one rank's trainer and times,
from the kill, until every rank has printed a step again.  Trials alternate
between the two ways kcover restarts the same job, set by the job's
``kcover.io/in-place`` annotation, so both meet the same machine load:

- **in place**: the pods stay; every ``kcover pod`` restarts its trainer for a
  new generation, which restores from the snapshot left in the pod's memory;
- **pods**: the job is suspended and resumed; its pods are deleted and new ones
  scheduled, started and restored from disk (kcover's restart before in-place);
  the old pods' stop is counted in the new pods' start (their logs go with them).

The split comes from the operator's record and the container logs' own
timestamps: detection (the agent's fault record), decision (the operator's
claim), stop (the last old worker stopped or failed), start (new workers, or new
containers, started), rendezvous (every rank joined the new process group),
restore (every rank resumed from its checkpoint) and first step.  The job's
RecoveryPolicy sets no backoff between restarts (the policy's growing backoff
would otherwise dominate both ways alike after a few trials).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.k8s_real_restart import live, start_kcover, wait
from kcover.testing import TestCluster, find_binaries
from kcover.testing.realjobs import kill_trainers_on, pod_log, pods_of, trainer_job
from kcover.testing.realnodes import RealNodePool

ROOT = Path(__file__).resolve().parents[1]
JOB = "train"
RANKS = 2
_LINE = re.compile(r"^(\S+) (?:stdout|stderr) F (.*)$", re.MULTILINE)
PHASES = ("detection", "decision", "stop", "start", "rendezvous", "restore", "first step")


def _epoch(stamp: str) -> float:
    """A CRI log timestamp (RFC 3339, nanoseconds) in seconds since the epoch."""
    head, _, fraction = stamp.rstrip("Z").partition(".")
    whole = dt.datetime.fromisoformat(head).replace(tzinfo=dt.UTC).timestamp()
    return whole + float(f"0.{fraction or '0'}")


def moments(text: str, since: float) -> dict[str, float]:
    """When a pod's log (after ``since``) first said each thing the split needs."""
    found: dict[str, float] = {}
    marks = (("stop", "state=stopped"), ("stop", "state=failed"), ("start", "state=running"),
             ("rendezvous", "joined the process group"), ("restore", "resumed from step"))
    for match in _LINE.finditer(text):
        at = _epoch(match.group(1))
        if at < since:
            continue
        line = match.group(2)
        for name, words in marks:
            if words in line and name not in found:
                found[name] = at
        if "restore" in found and line.startswith("step ") and "first step" not in found:
            found["first step"] = at
    return found


def record(cluster: TestCluster, namespace: str) -> dict[str, Any]:
    body = cluster.api.get(f"/apis/batch/v1/namespaces/{namespace}/jobs/{JOB}")
    return dict(json.loads((body["metadata"].get("annotations") or {}).get("kcover.io/recovery", "{}")))


def set_mode(cluster: TestCluster, namespace: str, in_place: bool) -> None:
    cluster.api.request("PATCH", f"/apis/batch/v1/namespaces/{namespace}/jobs/{JOB}",
                        {"metadata": {"annotations": {"kcover.io/in-place": str(in_place).lower()}}},
                        "application/merge-patch+json")


def stepping_since(cluster: TestCluster, pool: RealNodePool, namespace: str, since: float) -> dict[str, Any] | None:
    """Every live rank restored and stepped after ``since``: the moments of each pod, else None."""
    pods = live(cluster, namespace)
    if len(pods) != RANKS:
        return None
    seen = {p["metadata"]["name"]: moments(pod_log(pool, p), since) for p in pods}
    return seen if all("first step" in m for m in seen.values()) else None


def steady(cluster: TestCluster, pool: RealNodePool, namespace: str) -> bool:
    """Every live rank printed a step in the last second."""
    pods = live(cluster, namespace)
    recent = time.time() - 1.0
    return len(pods) == RANKS and all(
        any(_epoch(m.group(1)) > recent and m.group(2).startswith("step ") for m in _LINE.finditer(pod_log(pool, p)))
        for p in pods)


def faults_text(cluster: TestCluster, namespace: str) -> str:
    return "".join(sorted((p["metadata"].get("annotations") or {}).get("kcover.io/faults", "")
                          for p in pods_of(cluster, namespace, JOB)))


def one_trial(cluster: TestCluster, pool: RealNodePool, namespace: str, trial: int, in_place: bool) -> list[float]:
    """Kill one rank; the seconds of each phase (see :data:`PHASES`) and the total."""
    set_mode(cluster, namespace, in_place)
    wait(lambda: steady(cluster, pool, namespace))
    time.sleep(10)  # the agents and operator see the annotation; the warm workers have done their imports
    before, attempt = faults_text(cluster, namespace), int(record(cluster, namespace).get("attempt", 1))
    victim = sorted(live(cluster, namespace), key=lambda p: p["metadata"]["name"])[trial % RANKS]
    began = time.time()
    assert kill_trainers_on(pool, victim["spec"]["nodeName"]), "no trainer to kill"
    detected = wait(lambda: faults_text(cluster, namespace) != before) - time.monotonic() + time.time()
    decided = wait(lambda: int(record(cluster, namespace).get("attempt", 1)) > attempt) - time.monotonic() + time.time()
    pods: dict[str, Any] = {}

    def stepped_again() -> bool:
        found = stepping_since(cluster, pool, namespace, began)
        pods.update(found or {})
        return found is not None

    wait(stepped_again)
    state = record(cluster, namespace)
    assert (state.get("method") == "in-place") is in_place, (state, [
        (p["metadata"]["name"], p["status"].get("phase"), (p["metadata"].get("annotations") or {})
         .get("kcover.io/pod-state")) for p in pods_of(cluster, namespace, JOB)])
    if not in_place:  # the old pods' logs are gone with them: their stop counts in the new pods' start
        for moments_of_pod in pods.values():
            moments_of_pod.pop("stop", None)
    last = {name: max(m.get(name, decided) for m in pods.values()) for name in PHASES[2:]}
    ends = [detected, decided, last["stop"], last["start"], last["rendezvous"], last["restore"], last["first step"]]
    split, previous = [], began
    for end in ends:
        split.append(max(0.0, end - previous))
        previous = max(previous, end)
    return [*split, last["first step"] - began]


def run(real_nodes: int, trials: int) -> None:
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as folder, TestCluster(find_binaries()) as cluster:
        root = Path(folder)
        nodes = cluster.add_real_nodes(real_nodes)
        pool = cluster.real_node_pool
        assert pool is not None
        namespace = cluster.create_namespace("bench")
        cluster.install_crds([ROOT / "charts" / "kcover" / "crds" / "recoverypolicies.kcover.io.yaml"])
        cluster.api.post(f"/apis/kcover.io/v1alpha1/namespaces/{namespace}/recoverypolicies", {
            "apiVersion": "kcover.io/v1alpha1", "kind": "RecoveryPolicy", "metadata": {"name": "default"},
            "spec": {"backoffSeconds": 0, "maxRestarts": 1000}})
        processes = start_kcover(cluster, pool, nodes, namespace, root)
        job = trainer_job(JOB, namespace, pool, RANKS, checkpoints=root / "ckpt", opted_in=True, in_place=True,
                          project_root=ROOT, env={"STEPS": "1000000", "PERSIST_EVERY": "10", "STEP_SECONDS": "0.1"})
        try:
            cluster.api.post(f"/apis/batch/v1/namespaces/{namespace}/jobs", job)
            rows: dict[bool, list[list[float]]] = {True: [], False: []}
            for trial in range(trials):
                for in_place in (True, False):
                    rows[in_place].append(one_trial(cluster, pool, namespace, trial, in_place))
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=20)
    print(f"{RANKS}-rank gloo DDP job under kcover pod on {real_nodes} real nodes, {trials} trials of each "
          f"way, alternating ({time.monotonic() - began:.0f} s in all); a SIGKILLed rank -> every rank stepping "
          "again (s)")
    print("way        trial  " + "  ".join(f"{p:>10}" for p in PHASES) + "       total")
    for in_place, name in ((True, "in place"), (False, "pods")):
        for index, row in enumerate(rows[in_place]):
            print(f"{name:<9}  {index:5d}  " + "  ".join(f"{v:10.2f}" for v in row[:-1]) + f"  {row[-1]:10.2f}")
    fast = statistics.median(r[-1] for r in rows[True])
    slow = statistics.median(r[-1] for r in rows[False])
    print(f"median in place {fast:.2f} s, pods recreated {slow:.2f} s: ratio {fast / slow:.2f} (target <= 0.25)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real-nodes", type=int, default=2)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    if args.real_nodes < RANKS or args.trials < 1:
        raise SystemExit(f"--real-nodes must be at least {RANKS} and --trials at least 1")
    run(args.real_nodes, args.trials)


if __name__ == "__main__":
    main()
