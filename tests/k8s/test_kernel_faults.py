"""The agent's kernel faults: a flood is one occurrence, told once to each pod it concerns; the same fault
after a quiet spell is a new occurrence.

Real catalog, real kernel lines through the real matcher; only the clock is ours.
Before, an Xid 79 was reported once per node for the agent's whole life: a node
released by kcover that fell off the bus again (or a second ``kcover inject``
rehearsal) was never blamed, and a job restarted onto it ran on (found by
``bench.k8s_standby``: its second trial on a node restarted in place there).
"""

from __future__ import annotations

from collections.abc import Collection

from kcover.classify.matcher import default_matcher
from kcover.collect.lines import clean_block
from kcover.collect.sources import SourceInfo
from kcover.k8s.agent.kernel_faults import MAX_REMEMBERED, QUIET_SECONDS, KernelFaults, Sighting

SOURCE = SourceInfo(name="gpu-1/kmsg", node="gpu-1")
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."
XID48 = "NVRM: Xid (PCI:0000:3b:00): 48, pid={pid}, name=python, An uncorrectable double bit error"
MATCHER = default_matcher()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def feed(faults: KernelFaults, *lines: str, pods: Collection[str] = ("pod-a",)) -> list[Sighting]:
    block = clean_block("".join(line + "\n" for line in lines).encode())
    return [faults.add_hit(SOURCE, hit, pods) for hit in MATCHER.scan_block(block, 1)]


def reported(sightings: list[Sighting]) -> list[tuple[str, list[str]]]:
    """The new occurrences and the pods told, in order."""
    return [(s.fault.rule, s.tell) for s in sightings if s.new or s.tell]


def test_a_flood_is_one_occurrence_told_once_as_long_as_it_goes_on() -> None:
    clock = Clock()
    faults = KernelFaults(clock=clock)
    first = feed(faults, *(XID79.format(pid=p) for p in range(500)))
    assert reported(first) == [("xid.79.fallen-off-bus", ["pod-a"])] and first[0].new
    assert first[0].fault.node_at_fault and first[0].fault.evidence.node == "gpu-1"
    assert "pid=0" in first[0].fault.evidence.line
    for _ in range(30):  # one more line every 10 s for five minutes: never quiet, never reported again
        clock.now += 10
        assert reported(feed(faults, XID79.format(pid=7))) == []


def test_the_same_fault_after_a_quiet_spell_is_a_new_occurrence() -> None:
    clock = Clock()
    faults = KernelFaults(clock=clock)
    assert reported(feed(faults, XID79.format(pid=1))) == [("xid.79.fallen-off-bus", ["pod-a"])]
    clock.now += QUIET_SECONDS  # not yet quiet long enough
    assert reported(feed(faults, XID79.format(pid=2))) == []
    clock.now += QUIET_SECONDS + 0.001
    (again,) = feed(faults, XID79.format(pid=3))
    assert again.new and again.tell == ["pod-a"] and "pid=3" in again.fault.evidence.line


def test_a_pod_that_started_during_the_flood_is_told_too_and_only_once() -> None:
    """The job restarted onto the node while it still fails: its new pod must hear of it."""
    clock = Clock()
    faults = KernelFaults(clock=clock)
    feed(faults, XID79.format(pid=1), pods=["old"])
    clock.now += 5
    (later,) = feed(faults, XID79.format(pid=2), pods=["new"])  # "old" is gone, "new" started
    assert not later.new and later.tell == ["new"]
    assert "pid=1" in later.fault.evidence.line  # the occurrence's first line
    assert reported(feed(faults, XID79.format(pid=3), pods=["new"])) == []
    (back,) = feed(faults, XID79.format(pid=4), pods=["new", "old"])  # a uid forgotten when gone is told again
    assert back.tell == ["old"]


def test_two_faults_in_one_flood_are_each_their_own() -> None:
    faults = KernelFaults(clock=Clock())
    mixed = feed(faults, XID79.format(pid=1), XID79.format(pid=2), XID48.format(pid=3), XID48.format(pid=4))
    assert reported(mixed) == [("xid.79.fallen-off-bus", ["pod-a"]), ("xid.48.double-bit-ecc", ["pod-a"])]


def test_a_fault_with_no_pod_on_the_node_still_reports_the_node() -> None:
    (alone,) = feed(KernelFaults(clock=Clock()), XID79.format(pid=1), pods=())
    assert alone.new and alone.tell == []


def test_what_is_remembered_is_bounded_and_the_longest_unseen_is_forgotten_first() -> None:
    faults = KernelFaults(clock=Clock())
    feed(faults, XID79.format(pid=1))
    lines = [f"EXT4-fs error (device sd{chr(97 + i % 26)}{'x' * (i // 26)}): ext4_find_entry: reading directory "
             "lblock 0" for i in range(MAX_REMEMBERED + 50)]
    sightings = feed(faults, *lines)
    assert len(sightings) == MAX_REMEMBERED + 50 and all(s.new for s in sightings)  # the device names differ
    assert len(faults._seen) == MAX_REMEMBERED
    assert feed(faults, XID79.format(pid=2))[0].new  # forgotten: reported again rather than never


def test_a_one_mebibyte_kernel_line_is_one_occurrence_and_costs_one_entry() -> None:
    faults = KernelFaults(clock=Clock())
    huge = XID79.format(pid=1) + " " + "9" * (1 << 20)
    assert [s.new for s in feed(faults, huge, huge)] == [True, False]
    assert len(faults._seen) == 1
