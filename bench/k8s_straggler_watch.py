"""The operator's straggler watch at scale: what one look at a 2,000-pod job costs, and when it flags.

A job of ``--pods`` pods with ``--ranks-per-pod`` ranks each (16,000 ranks by default) runs
``--steps`` steps of 0.1 s compute with 5% noise; one rank turns 1.2x slower at 60% of them.  Every
``--every`` steps each pod's step times are rewritten as the agent writes them (the newest 32 steps
of each rank, ``kcover.io/step-times``), each pod view is built from that annotation as the kopf
watch builds it, and the operator looks at the job once.  Printed:

- the time of one look (:meth:`StragglerWatch.look`: feeding the new steps of every rank into the
  detector and judging them) against the baseline measured in the same run: building the same pod
  views from their annotations (what the operator's watch does anyway whenever the agents write them);
  and one :func:`~kcover.k8s.operator.assess.assess` of the job, for scale;
- the steps from the onset until the slow rank is flagged, and the flags on any other rank (target 0).
  Jobs of more than 1,024 ranks are judged in groups of steps (:data:`FULL_RANKS`): 16 at 16,000 ranks,
  so the detector's 30-value warm-up takes 480 steps there.

    python -m bench.k8s_straggler_watch [--pods 2000] [--ranks-per-pod 8] [--steps 1400] [--every 16]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from kcover.classify.matcher import default_matcher
from kcover.k8s import wire
from kcover.k8s.names import POD_STATE, STEP_TIMES
from kcover.k8s.operator.assess import assess
from kcover.k8s.operator.policy import JobPolicy
from kcover.k8s.operator.record import RecoveryRecord
from kcover.k8s.operator.stragglers import FULL_RANKS, StragglerWatch
from kcover.k8s.operator.views import job_view, pod_view
from kcover.podline import PodState

FACTOR = 1.2


def pod_body(index: int, times: dict[int, dict[int, float]]) -> dict[str, Any]:
    annotations = {POD_STATE: wire.PodStatus(0, PodState.RUNNING).encode(),
                   STEP_TIMES: wire.StepTimes(0, times).encode(), "kcover.io/faults": "[]"}
    return {"metadata": {"uid": f"uid-{index}", "namespace": "ns", "name": f"train-{index}",
                         "labels": {"batch.kubernetes.io/job-name": "train"}, "annotations": annotations},
            "spec": {"nodeName": f"node-{index}"}, "status": {"phase": "Running"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--ranks-per-pod", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1400)
    parser.add_argument("--every", type=int, default=16)
    args = parser.parse_args()
    ranks = args.pods * args.ranks_per_pod
    slow, onset = ranks // 2 + 3, int(args.steps * 0.6)
    rng = random.Random(1)
    seconds = [[0.1 * rng.lognormvariate(0, 0.05) * (FACTOR if r == slow and s >= onset else 1.0)
                for s in range(args.steps)] for r in range(ranks)]
    job = job_view("Job", {"metadata": {"name": "train", "namespace": "ns", "uid": "uid-train",
                                        "labels": {"kcover.io/cascading-recovery": "true"}}, "spec": {}})
    rules, policy, record = default_matcher().rules, JobPolicy().recovery, RecoveryRecord()
    watch = StragglerWatch()
    looks, builds, baselines = [], [], []
    flagged_at, others = None, set()
    for end in range(args.every, args.steps + 1, args.every):
        began = time.perf_counter()
        pods = []
        for index in range(args.pods):
            first = index * args.ranks_per_pod
            times = {r: {s: seconds[r][s] for s in range(max(0, end - 32), end)}
                     for r in range(first, first + args.ranks_per_pod)}
            pods.append(pod_view(json.loads(json.dumps(pod_body(index, times)))))
        built = time.perf_counter()
        news = watch.look(job, 1, pods)
        looked = time.perf_counter()
        assess(job, pods, rules, policy, record)
        assessed = time.perf_counter()
        builds.append(built - began)
        looks.append(looked - built)
        baselines.append(assessed - looked)
        for flagged in news.new:
            if flagged.rank == slow and flagged_at is None:
                flagged_at = end
            elif flagged.rank != slow:
                others.add(flagged.rank)
    look, assessed, build = statistics.median(looks), statistics.median(baselines), statistics.median(builds)
    group = max(1, -(-ranks // FULL_RANKS))
    print(f"{args.pods} pods x {args.ranks_per_pod} ranks = {ranks} ranks (judged in groups of {min(16, group)} "
          f"steps), {args.steps} steps, a look every {args.every} steps")
    worst = looks.index(max(looks))
    print(f"one look: median {look * 1000:.0f} ms (worst {max(looks) * 1000:.0f} ms, the look at step "
          f"{(worst + 1) * args.every}); building the {args.pods} pod "
          f"views from their annotations (baseline, same run): {build * 1000:.0f} ms; ratio {look / build:.2f}x; "
          f"one assess of the job: {assessed * 1000:.1f} ms")
    found = f"flagged {flagged_at - onset} steps after the onset" if flagged_at else "NOT flagged"
    print(f"rank {slow} slowed {FACTOR}x from step {onset}: {found}; other ranks flagged: {len(others)}")


if __name__ == "__main__":
    main()
