"""The rank a hang waited for, named from the numbers PyTorch's timeout lines carry.

The NCCL lines are PyTorch's own formats (``ProcessGroupNCCL.cpp``: the watchdog's
``WorkNCCL(SeqNum=…)``, ``Timeout at NCCL work``, the heartbeat monitor's
``Received a dump signal … Last enqueued NCCL work``), as real logs in the field
corpus show them: NCCL cannot run on these machines.  The gloo case runs for
real in ``tests/launcher/test_run.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

from kcover.classify.laggards import Progress, find_laggards, progress_of
from kcover.explain import explain, explain_paths
from kcover.faults import Action, Category

PG = "[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"


def watchdog(rank: int, seq: int) -> str:
    return (f"[rank{rank}]:[E ProcessGroupNCCL.cpp:563] [Rank {rank}] Watchdog caught collective operation timeout: "
            f"WorkNCCL(SeqNum={seq}, OpType=_ALLGATHER_BASE, NumelIn=131072512, NumelOut=524290048, "
            "Timeout(ms)=600000) ran for 600055 milliseconds before timing out.")


def timeout_at(rank: int, seq: int, enqueued: int, group: int = 0) -> str:
    return (f"[rank{rank}]:[E703 19:54:00.074837389 ProcessGroupNCCL.cpp:1537] [PG ID {group} PG GUID {group}"
            f"(default_pg) Rank {rank}] Timeout at NCCL work: {seq}, last enqueued NCCL work: {enqueued}, "
            f"last completed NCCL work: {seq - 1}.")


def dump_signal(rank: int, enqueued: int, completed: int, source: int = 7, group: int = 0) -> str:
    prefix = PG.format(rank=rank).replace("ID 0 PG GUID 0", f"ID {group} PG GUID {group}")
    return (f"[rank{rank}]:[E703 19:54:01.074837389 ProcessGroupNCCL.cpp:1987] {prefix} Received a dump "
            f"signal due to a collective timeout from  rank {source} and we will try our best to dump the debug info. "
            f"Last enqueued NCCL work: {enqueued}, last completed NCCL work: {completed}.This is most likely caused "
            "by incorrect usages of collectives, e.g., wrong sizes used across ranks.")


def test_ranks_that_issued_fewer_collectives_are_named_from_one_pasted_log() -> None:
    """Ranks 4 and 5 completed all they issued (56116) while rank 7 waited in 56117: they never reached it.

    The dump-signal lines of ranks 4, 5 and 6 are one shape: the verdict still reads each rank's numbers.
    """
    log = "\n".join([timeout_at(7, 56117, 56117), dump_signal(4, 56116, 56116), dump_signal(5, 56116, 56116),
                     dump_signal(6, 56117, 56116)])
    verdict = explain(log)
    assert verdict.category is Category.COLLECTIVE_TIMEOUT_HANG
    assert verdict.ranks == (4, 5)
    assert "ranks 4, 5 never reached collective 56117" in verdict.reason
    assert verdict.action is Action.RESTART and verdict.nodes == ()


def test_monitored_barrier_names_the_ranks_itself_not_its_coordinator() -> None:
    assert explain("RuntimeError: [Rank 0]: Ranks 4, 5, 6, 7 failed to pass monitoredBarrier in 2000000 ms").ranks \
        == (4, 5, 6, 7)
    # the other ranks' line names rank 0, the barrier's coordinator that threw: it did arrive
    waited = ("[rank1]:[E325 17:13:23.16 ProcessGroupGloo.cpp:145] Rank 1 successfully reached monitoredBarrier, but "
              "received errors while waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.")
    assert explain(waited).ranks == ()
    assert explain("[rank0]: RuntimeError: [Rank 0]: Ranks 2 failed to pass monitoredBarrier in 30000 ms\n"
                   + waited).ranks == (2,)


def test_a_rank_whose_log_shows_no_timeout_is_the_likely_laggard_never_excluded(tmp_path: Path) -> None:
    for node, ranks in (("node-a", (0, 1)), ("node-b", (2, 3))):
        (tmp_path / node).mkdir()
        for rank in ranks:
            text = f"[rank{rank}]: step 41 loss 1.9\n" + (watchdog(rank, 15037) + "\n" if rank else "")
            (tmp_path / node / f"rank{rank}.log").write_text(text)
    verdict = explain_paths([tmp_path])
    assert verdict.ranks == (0,)
    assert "rank 0 on node-a did not time out while ranks 1, 2, 3 timed out waiting in collective 15037" \
        in verdict.reason
    assert "likely laggard" in verdict.reason
    assert verdict.nodes == () and verdict.action is Action.RESTART


def test_each_process_group_counts_its_own_collectives() -> None:
    """PG 1 is stuck in 1580 and rank 3 issued only up to 1579 there; PG 0's larger numbers are another count."""
    log = "\n".join([timeout_at(0, 1580, 1582, group=1), timeout_at(1, 1580, 1581, group=1),
                     dump_signal(3, 1579, 1579, source=0, group=1),
                     timeout_at(2, 90000, 90004, group=0)])
    assert explain(log).ranks == (3,)


def test_no_rank_is_named_where_the_lines_cannot_tell(tmp_path: Path) -> None:
    same = "\n".join(timeout_at(rank, 23110, 23110) for rank in range(4))  # all waited in it: a GPU or a link
    assert explain(same).ranks == ()
    assert "left no sign" in explain(same).reason
    unranked = "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE) ran for 1 ms"
    assert explain(unranked).ranks == ()
    # a pasted log knows no ranks beyond its lines: rank 0 missing from it proves nothing
    assert explain("\n".join(watchdog(rank, 15037) for rank in (1, 2, 3))).ranks == ()
    # most ranks silent: more likely killed early than all lagging
    for rank in range(8):
        (tmp_path / f"rank{rank}.log").write_text(f"step 3\n{watchdog(rank, 9) if rank < 2 else 'step 4'}\n")
    assert explain_paths([tmp_path]).ranks == ()


def test_a_fault_of_its_own_outranks_any_laggard() -> None:
    log = "\n".join([watchdog(1, 77), watchdog(2, 77),
                     "[rank3]: NVRM: Xid (PCI:0000:3b:00): 79, pid=4821, GPU has fallen off the bus."])
    verdict = explain(log)
    assert verdict.category is Category.GPU_HARDWARE
    assert verdict.ranks == (3,)


def test_hostile_numbers_and_lines_are_bounded() -> None:
    huge = progress_of("Ranks 99999999999, 3 failed to pass monitoredBarrier", rank=0)
    assert huge.named == (3,)
    line = "[Rank 0] Ranks " + "1, " * 400_000 + "failed to pass monitoredBarrier"
    began = time.monotonic()
    progress_of(line, rank=0)
    explain(line)
    assert time.monotonic() - began < 5
    assert find_laggards([]) is None
    assert find_laggards([Progress(rank=None, group=None, waiting=5)]) is None
    negative = progress_of("[Rank 2] Timeout at NCCL work: 0, last enqueued NCCL work: -1", rank=2)
    assert negative.waiting == 0 and negative.enqueued is None


def test_numbers_that_cannot_be_a_laggards_name_nobody(tmp_path: Path) -> None:
    # a point-to-point counter is no collective number: rank 1's last work was a receive (#41)
    assert explain("\n".join([watchdog(0, 5000), dump_signal(1, 41, 40, source=0)])).ranks == ()
    # one rank ahead of all others issued a collective nobody else did: not seven laggards
    ahead = "\n".join([timeout_at(0, 11, 11)] + [dump_signal(rank, 10, 10, source=0) for rank in range(1, 8)])
    assert explain(ahead).ranks == ()


def test_a_group_local_rank_is_taken_for_the_logs_rank(tmp_path: Path) -> None:
    """``[PG ID 1 … Rank 1]`` is rank 1 of that group: in ``rank5.log`` it is the job's rank 5."""
    for node, ranks in (("node-a", range(0, 4)), ("node-b", range(4, 8))):
        (tmp_path / node).mkdir()
        for rank in ranks:
            text = "step 41 loss 1.9\n"
            if rank == 4:
                text += timeout_at(0, 100, 100, group=1).split(":", 1)[1] + "\n"
            if rank == 5:
                text += dump_signal(1, 99, 99, source=4, group=1).split(":", 1)[1] + "\n"
            (tmp_path / node / f"rank{rank}.log").write_text(text)
    verdict = explain_paths([tmp_path])
    assert verdict.ranks == (5,)
    assert "rank 5 on node-b never reached collective 100" in verdict.reason
    # pasted, with nothing but the group's own numbering: no rank of the job to name
    pasted = timeout_at(0, 100, 100, group=1).split(":", 1)[1] + "\n" + dump_signal(1, 99, 99, group=1).split(":", 1)[1]
    assert explain(pasted).ranks == ()


def test_a_long_timeout_line_keeps_where_its_rank_came_from(tmp_path: Path) -> None:
    """A line over the matcher's whole-line size (a runtime's 16 KiB cut line, rejoined) is read in windows."""
    for rank in (4, 5):
        text = "step 41 loss 1.9\n"
        if rank == 4:
            text += timeout_at(0, 100, 100, group=1).split(":", 1)[1] + "\n"
        else:
            text += dump_signal(1, 99, 99, source=4, group=1).split(":", 1)[1] + " flight recorder entry;" * 300 + "\n"
        (tmp_path / f"rank{rank}.log").write_text(text)
    assert explain_paths([tmp_path]).ranks == (5,)
