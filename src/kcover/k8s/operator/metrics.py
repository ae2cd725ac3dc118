"""Prometheus metrics of the operator (scraped from ``--metrics-port``, default 8080)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

FAULTS = Counter("kcover_faults_total", "Root-cause faults acted on, by category and rule", ["category", "rule"])
RESTARTS = Counter("kcover_restarts_total", "Job restarts carried out", ["kind"])
IN_PLACE = Counter("kcover_in_place_restarts_total", "Restarts of the workers in their pods, by method (in-place, "
                   "or standby: a blamed node's ranks taken over by warm standby pods) and outcome (done, or "
                   "escalated to a restart of the pods)", ["method", "outcome"])
FAILED = Counter("kcover_failed_jobs_total", "Jobs kcover stopped recovering (fail fast or budget spent)",
                 ["category"])
QUARANTINED = Gauge("kcover_quarantined_nodes", "Nodes currently quarantined by kcover")
BREAKER = Counter("kcover_quarantine_refused_total", "Quarantines refused by the circuit breaker")
REACTION = Histogram("kcover_detection_to_restart_seconds",
                     "From the operator seeing a failure to the job's pods deleted for restart",
                     buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
STRAGGLER = Gauge("kcover_straggler_slowdown", "A rank computing slower than its own baseline (1.3 = 30% slower), "
                  "while it is flagged as a straggler", ["namespace", "job", "node", "rank"])
