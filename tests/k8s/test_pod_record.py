"""The faults an agent records on a pod: repeats across agent restarts are counted, by the collector's line shape."""

from __future__ import annotations

from kcover.faults import Category, Evidence, Fault, Role, Severity
from kcover.k8s import wire
from kcover.k8s.agent.pods import PodInfo
from kcover.k8s.agent.report import PodRecord
from kcover.k8s.kinds import BATCH_JOB

POD = PodInfo(namespace="ml", name="train-0", uid="u", node="node-1", kind=BATCH_JOB, job="train", rank=0)


def fault(line: str, count: int = 1) -> Fault:
    return Fault("gpu.xid-79", Category.GPU_HARDWARE, Severity.FATAL, False, True, Role.ROOT, 90, "Xid 79", "",
                 Evidence(source="train-0/main", line=line, rank=0, node="node-1"), count)


def test_a_repeat_with_other_numbers_adds_to_the_earlier_agents_count() -> None:
    earlier = [wire.fault_record(fault("NVRM: Xid (PCI:0000:3b:00): 79, pid=11", count=3))]
    record = PodRecord(POD, earlier)
    repeat = fault("NVRM: Xid (PCI:0000:3b:00): 79, pid=4242", count=2)
    assert record.known(repeat)
    record.merge(repeat)
    [merged] = record.records()
    assert merged["count"] == 5


def test_lines_that_differ_after_200_characters_stay_two_faults_as_in_the_collector() -> None:
    head = "x" * 250
    earlier = [wire.fault_record(fault(head + " first"))]
    record = PodRecord(POD, earlier)
    other = fault(head + " second")
    assert not record.known(other)
    record.merge(other)
    assert [r["line"][-6:] for r in record.records()] == [" first", "second"]
