"""A fault the program logged and survived: a rule's ``unless_after`` lines, and torchelastic's exit barrier.

torchelastic's agent waits at an exit barrier after its workers finished; past
the timeout it logs the store's ``Socket Timeout`` traceback with
``logger.exception`` and returns success.  That store timeout is no fault
(``torch.store-timeout`` names ``Error waiting on exit barrier`` in
``unless_after``); the barrier itself is a degraded sign with no action.  The
same timeout without that line, after it by more than the window, or before it,
is still a fault; a user catalog's ``unless_after`` pattern is held to the
linear-time check like any other.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from tests.classify.test_fallback import STEPS

from kcover import Action, Category, explain
from kcover.classify.collector import MAX_EXCUSED_REPEATS, FaultCollector
from kcover.classify.fallback import TAIL_BYTES, TAIL_LINES
from kcover.classify.matcher import default_matcher
from kcover.classify.rules import UNLESS_AFTER_LINES
from kcover.collect.sources import SourceInfo, find_sources
from kcover.explain import explain_paths, scan_stream
from kcover.faults import Severity

BARRIER = (
    "INFO:torch.distributed.elastic.agent.server.api:Local worker group finished (WorkerState.SUCCEEDED). "
    "Waiting 300 seconds for other agents to finish\n"
    "ERROR:torch.distributed.elastic.agent.server.api:Error waiting on exit barrier. Elapsed: 300.048 seconds\n"
    "Traceback (most recent call last):\n"
    '  File "/opt/torch/distributed/elastic/agent/server/api.py", line 906, in _exit_barrier\n'
    "    store_util.barrier(\n"
    '  File "/opt/torch/distributed/elastic/utils/store.py", line 78, in barrier\n'
    "    synchronize(store, data, rank, world_size, key_prefix, barrier_timeout)\n"
)
TIMEOUTS = ["torch.distributed.DistStoreError: Socket Timeout\n", "RuntimeError: Socket Timeout\n"]


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["DistStoreError", "RuntimeError"])
def test_the_exit_barriers_store_timeout_is_no_fault(timeout: str) -> None:
    verdict = explain(STEPS + BARRIER + timeout)
    assert verdict.rule == "torch.exit-barrier-timeout"
    assert verdict.root is not None and verdict.root.severity is Severity.DEGRADED
    assert verdict.action is Action.NONE
    assert all(fault.rule != "torch.store-timeout" for fault in verdict.faults)


@pytest.mark.parametrize("timeout", TIMEOUTS, ids=["DistStoreError", "RuntimeError"])
def test_the_same_store_timeout_elsewhere_is_a_fault(timeout: str) -> None:
    alone = explain(STEPS + timeout)
    assert alone.rule == "torch.store-timeout" and alone.action is Action.RESTART
    far = explain(STEPS + BARRIER + "".join(f"rank 0 exporting shard {n}\n" for n in range(UNLESS_AFTER_LINES))
                  + timeout)
    assert far.rule == "torch.store-timeout"
    before = explain(STEPS + timeout + BARRIER.splitlines(keepends=True)[1])
    assert before.rule == "torch.store-timeout"
    assert before.category is Category.COLLECTIVE_TIMEOUT_HANG


def test_a_fault_outside_the_kept_end_is_never_excused() -> None:
    filler = "".join(f"rank 0 exporting shard {n:08d} of the final model\n" for n in range(TAIL_BYTES // 40))
    text = STEPS + BARRIER + "RuntimeError: Socket Timeout\n" + filler
    assert explain(text).rule == "torch.store-timeout"  # its lines before are no longer kept: it stays a fault


def test_an_unexcused_occurrence_keeps_the_fault_and_excused_repeats_vanish() -> None:
    # (an excused occurrence followed by an unexcused one cannot fit in one kept end: the excuse
    # window is as long as the kept tail; the per-occurrence check covers it should they differ)
    timeout = "RuntimeError: Socket Timeout\n"
    real_then_excused = STEPS + timeout + "rank 0 saving the final model\n" * 20 + BARRIER + timeout
    verdict = explain(real_then_excused)
    assert verdict.rule == "torch.store-timeout" and verdict.action is Action.RESTART
    both_excused = STEPS + BARRIER + timeout + BARRIER + timeout
    assert explain(both_excused).rule == "torch.exit-barrier-timeout"


def test_a_flood_of_the_same_fault_is_never_excused() -> None:
    barrier_line = BARRIER.splitlines(keepends=True)[1]
    flood = (barrier_line + "RuntimeError: Socket Timeout\n") * (MAX_EXCUSED_REPEATS + 2)
    assert len(flood) < TAIL_BYTES and flood.count("\n") < TAIL_LINES  # all kept: only the count refuses
    assert explain(STEPS + flood).rule == "torch.store-timeout"


def test_the_fallback_does_not_take_back_an_excused_line() -> None:
    # the log ends in the excused traceback: the end-of-log fallback must not call it a failure
    verdict = explain(STEPS + BARRIER + "torch.distributed.DistStoreError: Socket Timeout\n")
    assert verdict.action is Action.NONE
    assert all(fault.severity is Severity.DEGRADED for fault in verdict.faults)


CATALOG = """
rules:
  - id: my.rule
    title: mine
    category: storage_io
    severity: fatal
    retriable: true
    node_at_fault: false
    role: root
    remediation: fix it
    patterns: ['shard \\d+ unreadable']
    unless_after: [{unless_after}]
"""


def _explain(tmp_path: Path, unless_after: str, log_text: str) -> subprocess.CompletedProcess[str]:
    catalog = tmp_path / "mine.yaml"
    catalog.write_text(CATALOG.format(unless_after=unless_after), encoding="utf-8")
    log = tmp_path / "x.log"
    log.write_text(log_text, encoding="utf-8")
    command = [sys.executable, "-m", "kcover", "explain", "--json", "--catalog", str(catalog), str(log)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_a_user_catalog_can_excuse_a_fault_the_program_survives(tmp_path: Path) -> None:
    excused = _explain(tmp_path, "'retrying the read of shard'", "retrying the read of shard 7\nshard 7 unreadable\n")
    assert excused.returncode == 0, excused.stderr
    assert '"my.rule"' not in excused.stdout
    counted = _explain(tmp_path, "'retrying the read of shard'", "shard 7 unreadable\n")
    assert '"my.rule"' in counted.stdout


def test_a_backtracking_unless_after_pattern_is_refused_naming_the_field(tmp_path: Path) -> None:
    done = _explain(tmp_path, "'(a+)+$'", "shard 7 unreadable\n")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "field 'unless_after'" in done.stderr and "'my.rule'" in done.stderr


def test_each_container_of_a_pod_is_its_own_source_and_one_cannot_excuse_the_other(tmp_path: Path) -> None:
    # /var/log/pods/<namespace>_<pod>_<uid>/<container>/0.log: both files are the same pod's. The trainer's
    # timeout is real; the exporter's, at the same line number, follows the exit barrier and is excused
    pod = tmp_path / "pods" / "train_job-worker-0_0f6a3c2e-1b2d-4c5e-9f00-123456789abc"
    timeout = "RuntimeError: Socket Timeout\n"
    exporter = STEPS + BARRIER + timeout
    trainer = STEPS + "".join(f"rank 0 exporting shard {n}\n" for n in range(BARRIER.count("\n"))) + timeout
    for container, text in (("a-trainer", trainer), ("b-exporter", exporter)):
        (pod / container).mkdir(parents=True)
        (pod / container / "0.log").write_text(text)
    sources, _ = find_sources([tmp_path / "pods"])
    assert sorted(source.info.name for source in sources) == [
        "train/job-worker-0/a-trainer/0.log", "train/job-worker-0/b-exporter/0.log"]
    verdict = explain_paths([tmp_path / "pods"])
    assert verdict.rule == "torch.store-timeout" and verdict.action is Action.RESTART
    assert verdict.root is not None and verdict.root.evidence.source == "train/job-worker-0/a-trainer/0.log"


def test_two_sources_of_one_name_excuse_nothing() -> None:
    # no reader names two sources alike today; should one, the kept end that holds the excuse is unknown
    matcher = default_matcher()
    collector = FaultCollector()
    for rank in (0, 1):
        text = STEPS + BARRIER + "RuntimeError: Socket Timeout\n"
        scan_stream(matcher, io.BytesIO(text.encode()), SourceInfo(name="worker.log", rank=rank), collector)
    assert any(fault.rule == "torch.store-timeout" for fault in collector.faults)
    alone = FaultCollector()
    scan_stream(matcher, io.BytesIO((STEPS + BARRIER + "RuntimeError: Socket Timeout\n").encode()),
                SourceInfo(name="worker.log", rank=0), alone)
    assert all(fault.rule != "torch.store-timeout" for fault in alone.faults)


def test_a_pod_recreated_under_its_name_and_two_runs_rank0_logs_stay_apart(tmp_path: Path) -> None:
    # both describe as train/job-worker-0/trainer/0.log (or rank0.log): named by their paths instead
    old = tmp_path / "pods" / "train_job-worker-0_11111111-1b2d-4c5e-9f00-123456789abc" / "trainer"
    new = tmp_path / "pods" / "train_job-worker-0_22222222-1b2d-4c5e-9f00-123456789abc" / "trainer"
    timeout = "torch.distributed.DistStoreError: Socket Timeout\n"
    for folder, text in ((old, STEPS + "rank 0 saving\n" * BARRIER.count("\n") + timeout), (new, STEPS + BARRIER)):
        folder.mkdir(parents=True)
        (folder / "0.log").write_text(text)
    sources, _ = find_sources([tmp_path / "pods", old / "0.log"])  # the same file given twice is read once
    assert sorted(source.info.name for source in sources) == [str(old / "0.log"), str(new / "0.log")]
    assert explain_paths([tmp_path / "pods"]).rule == "torch.store-timeout"  # the new pod's barrier excuses nothing
    for run in ("runA", "runB"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "rank0.log").write_text(STEPS)
    runs, _ = find_sources([tmp_path / "runA", tmp_path / "runB"])
    assert len({source.info.name for source in runs}) == 2
