"""Root cause across ranks: the cases the issue names, on real per-rank log files.

Each test writes one log per rank (as a launcher or ``kubectl logs`` would leave
them) and checks the verdict: category, action, and that only the root-cause
node is blamed, never the ranks that merely logged cascade symptoms.
"""

from __future__ import annotations

from pathlib import Path

from kcover import Action, Category, explain, explain_paths

BENIGN = "step {step} loss 2.31 lr 3e-4\n[rank{rank}] NCCL INFO Channel 00/02 : 0 1 2 3 4 5 6 7\n"
NCCL_REMOTE = (
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:1414] [PG 0 Rank {rank}] Process group watchdog thread "
    "terminated with exception: NCCL error: remote process exited or there was a network error\n"
)
WATCHDOG = (
    "[rank{rank}]:[E ProcessGroupNCCL.cpp:563] [Rank {rank}] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
    "for 600081 milliseconds before timing out.\n"
)


def write_job(root: Path, logs: dict[tuple[str, int], str]) -> Path:
    for (node, rank), text in logs.items():
        folder = root / node
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{rank}.log").write_text(text)
    return root


def test_xid_on_one_node_blames_only_that_node(tmp_path: Path) -> None:
    logs = {}
    for rank in range(8):
        node = f"node-{rank // 2}"
        text = BENIGN.format(step=10, rank=rank)
        if rank == 3:
            text += "NVRM: Xid (PCI:0000:3b:00): 79, pid=991, name=python, GPU has fallen off the bus.\n"
            text += "RuntimeError: CUDA error: unspecified launch failure\n"
        else:
            text += (NCCL_REMOTE if rank % 2 else WATCHDOG).format(rank=rank)
        logs[(node, rank)] = text
    verdict = explain_paths([write_job(tmp_path, logs)])
    assert verdict.category is Category.GPU_HARDWARE
    assert verdict.action is Action.RESTART_EXCLUDING_NODES
    assert verdict.nodes == ("node-1",)
    assert verdict.ranks == (3,)
    cascades = {f.evidence.node for f in verdict.faults if f.category is not Category.GPU_HARDWARE}
    assert "node-0" in cascades  # the victims were seen, and still not blamed


def test_same_key_error_on_every_rank_fails_fast(tmp_path: Path) -> None:
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 88, in <module>\n'
        "    loss = model(batch['labels'])\n"
        "KeyError: 'labels'\n"
    )
    logs = {(f"node-{r // 4}", r): BENIGN.format(step=1, rank=r) + traceback for r in range(8)}
    verdict = explain_paths([write_job(tmp_path, logs)])
    assert verdict.category is Category.USER_CODE
    assert verdict.action is Action.FAIL
    assert verdict.nodes == ()
    assert verdict.ranks == tuple(range(8))


def test_oom_killed_rank_is_root_and_timeouts_are_cascade(tmp_path: Path) -> None:
    logs = {(f"node-{r // 2}", r): BENIGN.format(step=5, rank=r) + WATCHDOG.format(rank=r)
            for r in range(4) if r != 2}
    logs[("node-1", 2)] = BENIGN.format(step=5, rank=2) + (
        "[  811.21] Out of memory: Killed process 4242 (python) total-vm:9000000kB, anon-rss:8000000kB\n"
    )
    verdict = explain_paths([write_job(tmp_path, logs)])
    assert verdict.category is Category.HOST_SYSTEM
    assert verdict.action is Action.RESTART
    assert verdict.ranks == (2,)
    assert verdict.nodes == ()


def test_only_cascades_restart_without_blame() -> None:
    verdict = explain(WATCHDOG.format(rank=0) + WATCHDOG.format(rank=1))
    assert verdict.category is Category.COLLECTIVE_TIMEOUT_HANG
    assert verdict.action is Action.RESTART
    assert verdict.nodes == ()
    assert "cascade" in verdict.reason


def test_benign_log_has_no_fault() -> None:
    text = "".join(BENIGN.format(step=s, rank=0) for s in range(100))
    text += "NCCL_ASYNC_ERROR_HANDLING=1 NCCL_TIMEOUT=1800\nWARNING: retrying in 5s (attempt 1/3)\n"
    verdict = explain(text)
    assert verdict.category is None
    assert verdict.action is Action.NONE
    assert verdict.faults == ()


def test_degraded_only_names_the_fault_but_takes_no_action() -> None:
    verdict = explain("NVRM: Xid (PCI:0000:1b:00): 63, pid=1, name=python, Row Remapper: New row marked\n")
    assert verdict.category is Category.GPU_HARDWARE
    assert verdict.action is Action.NONE


def test_flood_is_counted_not_stored() -> None:
    line = "[{i}.5] NVRM: Xid (PCI:0000:3b:00): 79, pid={i}, name=python, GPU has fallen off the bus.\n"
    verdict = explain("".join(line.format(i=i) for i in range(100_000)))
    assert len(verdict.faults) == 1
    assert verdict.faults[0].count == 100_000
    assert verdict.faults[0].evidence.line_number == 1


def test_traceback_frames_do_not_count_only_the_final_exception() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/torch/cuda/nccl.py", line 10, in all_reduce\n'
        "    raise RuntimeError('NCCL error: unhandled system error')\n"
        "ValueError: batch size 0 is not allowed\n"
    )
    verdict = explain(text)
    assert verdict.category is Category.USER_CODE
    assert [f.rule for f in verdict.faults] == ["python.exception"]


def test_specific_exception_beats_generic_user_code() -> None:
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
    assert explain(text).category is Category.GPU_MEMORY_OOM
    nccl_usage = "RuntimeError: NCCL error in: x.cpp:1, invalid usage, NCCL version 2.19.3\n"
    assert explain(nccl_usage).action is Action.FAIL


def test_rank_and_host_are_read_from_the_line() -> None:
    verdict = explain("gpu-b02:881:930 [3] NCCL WARN NET/IB : Got async event : port error\n")
    assert verdict.root is not None
    assert verdict.root.node == "gpu-b02"
    assert verdict.nodes == ("gpu-b02",)
    ranked = explain("[rank5]: KeyError: 'x'\n")
    assert ranked.ranks == (5,)
