"""Unknown fatal text is still a verdict: a log that ends in failure no rule names is ``other``.

Real-looking text in both directions: logs that end in an error no catalog
rule names must give ``other`` (rule ``job.unrecognised-failure``) with the
failing line as evidence and a restart within the user-code retry budget;
benign logs (warnings, retried errors, NCCL noise, progress bars, a caught
traceback followed by more steps) must give no fault at all; and verdicts that
a rule explains never change.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kcover import Action, Category, explain, explain_paths
from kcover.classify.fallback import TAIL_BYTES, Kind, Tail, TailKeeper, failure_line
from kcover.decide.policy import AttemptEnd, DecisionKind, RecoveryPolicy, RecoveryState, decide
from kcover.faults import UNRECOGNISED_FAILURE_RULE, Severity

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/workspace/train.py", line 212, in <module>\n'
    "    main(cfg)\n"
    '  File "/workspace/train.py", line 198, in main\n'
    "    trainer.fit(model, loader)\n"
)
STEPS = "".join(f"step {n} | loss {2.5 - n / 100:.3f} | lr 3.0e-04 | tokens/s 41233\n" for n in range(100, 104))
TORCHRUN_SUMMARY = (
    "E0601 12:00:05.123000 140213 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: 1) "
    "local_rank: 0 (pid: 2201) of binary: /usr/bin/python\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/local/bin/torchrun", line 8, in <module>\n'
    "    sys.exit(main())\n"
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    "============================================================\n"
    "train.py FAILED\n"
    "------------------------------------------------------------\n"
    "Failures:\n"
    "  <NO_OTHER_FAILURES>\n"
    "------------------------------------------------------------\n"
    "Root Cause (first observed failure):\n"
    "[0]:\n"
    "  time      : 2024-06-01_12:00:05\n"
    "  host      : gpu-node-7\n"
    "  rank      : 0 (local_rank: 0)\n"
    "  exitcode  : 1 (pid: 2201)\n"
    "  error_file: <N/A>\n"
    "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
    "============================================================\n"
)

FAILURES = {
    "bare-exception": (
        STEPS + TRACEBACK + "Exception: tokenizer vocabulary does not match the checkpoint (32000 vs. 32001)\n",
        "Exception: tokenizer vocabulary does not match the checkpoint (32000 vs. 32001)",
    ),
    "lowercase-exception-then-a-dump": (
        STEPS + "pipelineError: stage 3 produced no output for shard 17\n"
        "stage_outputs = {'stage1': 4096, 'stage2': 4096, 'stage3': 0}\n",
        "pipelineError: stage 3 produced no output for shard 17",
    ),
    "any-name-closing-a-traceback": (
        STEPS + TRACEBACK + "StopIteration\n",
        "StopIteration",
    ),
    "system-exit-non-zero": (
        TRACEBACK + "SystemExit: 2\n",
        "SystemExit: 2",
    ),
    "glog-fatal": (
        "I0601 12:00:00.000000  4242 loader.cc:88] opened 64 shards\n"
        "F0601 12:00:01.000000  4242 loader.cc:131] Check failed: shard_index < num_shards (64 vs. 64)\n"
        "*** Check failure stack trace: ***\n"
        "    @     0x7f1c2a3b4c5d  google::LogMessage::Fail()\n",
        "F0601 12:00:01.000000  4242 loader.cc:131] Check failed: shard_index < num_shards (64 vs. 64)",
    ),
    "python-logging-critical": (
        STEPS + "2024-06-01 12:00:00,123 - trainer - CRITICAL - cannot open dataset shard 17, giving up\n",
        "2024-06-01 12:00:00,123 - trainer - CRITICAL - cannot open dataset shard 17, giving up",
    ),
    "loguru-critical": (
        "2024-06-01 12:00:00.123 | INFO     | train:main:40 - epoch 3\n"
        "2024-06-01 12:00:09.456 | CRITICAL | train:main:52 - tokenizer vocabulary does not match the checkpoint\n",
        "2024-06-01 12:00:09.456 | CRITICAL | train:main:52 - tokenizer vocabulary does not match the checkpoint",
    ),
    "error-level-beside-an-exit-status": (
        "INFO:trainer:epoch 1 done\nERROR:trainer:dataset shard 17 is unreadable\n+ exit 3\n",
        "ERROR:trainer:dataset shard 17 is unreadable",
    ),
    "abort-banner": (
        STEPS + "Floating point exception (core dumped)\n",
        "Floating point exception (core dumped)",
    ),
    "log-stops-inside-a-traceback": (
        STEPS + TRACEBACK,
        "Traceback (most recent call last):",
    ),
    "torchrun-summary-after-the-worker-error": (
        "[rank0]: " + TRACEBACK.replace("\n", "\n[rank0]: ").removesuffix("[rank0]: ")
        + "[rank0]: Exception: dataset shard 17 is unreadable\n" + TORCHRUN_SUMMARY,
        "Exception: dataset shard 17 is unreadable",
    ),
    "cri-prefixed": (
        "2024-06-01T12:00:00.000000001Z stdout F step 7 loss 2.1\n"
        "2024-06-01T12:00:01.000000001Z stderr F Exception: dataset shard 17 is unreadable\n",
        "Exception: dataset shard 17 is unreadable",
    ),
}

BENIGN = {
    "caught-and-logged-then-more-steps": (
        STEPS + "ERROR:trainer:could not upload metrics, will try again at the next step\n" + TRACEBACK
        + "Exception: metrics endpoint answered 503\n" + STEPS
    ),
    "caught-traceback-then-steps-no-log-line": (
        STEPS + TRACEBACK + "pipelineError: stage 3 produced no output for shard 17\n" + STEPS
    ),
    "nccl-info-and-warn-noise": (
        "gpu-node-7:2201:2201 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>\n"
        "gpu-node-7:2201:2201 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: "
        "No such file or directory No plugin found (libnccl-net.so), using internal implementation\n"
        "gpu-node-7:2201:2260 [0] NCCL INFO Channel 00/02 :    0   1   2   3   4   5   6   7\n"
        "gpu-node-7:2201:2260 [0] NCCL INFO Connected all rings\n"
        "gpu-node-7:2201:2260 [0] NCCL INFO comm 0x55d5c0 rank 0 nranks 8 cudaDev 0 busId 18000 - Init COMPLETE\n"
    ),
    "deprecation-warnings": (
        STEPS
        + "/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:429: UserWarning: "
        "torch.utils.checkpoint: please pass in use_reentrant=True or use_reentrant=False explicitly.\n"
        "  warnings.warn(\n"
        "/usr/local/lib/python3.10/dist-packages/transformers/deepspeed.py:23: FutureWarning: "
        "transformers.deepspeed module is deprecated and will be removed in a future version.\n"
        "DeprecationWarning: `np.float` is a deprecated alias for the builtin `float`.\n"
    ),
    "tqdm-bars": (
        "Epoch 1:  45%|████▌     | 450/1000 [01:23<01:42,  5.37it/s, loss=2.31, v_num=3]\r"
        "Epoch 1:  46%|████▌     | 460/1000 [01:25<01:40,  5.37it/s, loss=2.30, v_num=3]\n"
        "Validation DataLoader 0:  10%|█         | 5/50 [00:01<00:09,  4.91it/s]\n"
    ),
    "retried-error": "ERROR:root:connection to the parameter server lost, retrying in 5s\n",
    "error-level-line-alone": STEPS + "ERROR:root:could not reach the metrics server\n",
    "user-pressed-ctrl-c": STEPS + TRACEBACK + "KeyboardInterrupt\n",
    "clean-system-exit": TRACEBACK + "SystemExit: 0\n",
    "side-service-unreachable": STEPS + TRACEBACK + "ConnectionRefusedError: [Errno 111] Connection refused\n",
    "old-error-then-ordinary-chatter": (
        "Exception: could not read the optional config overlay\n"
        "Using cache found in /root/.cache/torch/hub\n"
        "Data loaded: there are 1281167 images.\n"
        "Model built: resnet50.\n"
        "Optimizer ready.\n"
        "Evaluation set ready.\n"
    ),
    "tensorflow-startup-e-lines": (
        "2024-06-01 12:00:00.100000: E external/local_xla/xla/stream_executor/cuda/cuda_dnn.cc:9261] Unable to "
        "register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been "
        "registered\n"
        "2024-06-01 12:00:00.100000: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow binary "
        "is optimized to use available CPU instructions in performance-critical operations.\n"
    ),
    "git-probe-at-startup": (
        "fatal: not a git repository (or any parent up to mount point /)\n"
        "Stopping at filesystem boundary (GIT_DISCOVERY_ACROSS_FILESYSTEM not set).\n"
        "Starting training!\n"
    ),
    "exit-code-zero": "worker 0 exited with code 0\n",
}


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_a_log_ending_in_unknown_failure_is_other(name: str) -> None:
    text, line = FAILURES[name]
    verdict = explain(text)
    assert verdict.category is Category.OTHER, verdict.reason
    assert verdict.rule == UNRECOGNISED_FAILURE_RULE
    assert verdict.action is Action.RESTART
    assert verdict.root is not None
    assert verdict.root.evidence.line == line
    number = verdict.root.evidence.line_number
    assert number is not None and text.splitlines()[number - 1].endswith(line)


def tail_of(text: str) -> Tail:
    data = text.encode()
    keeper = TailKeeper()
    keeper.add(data, data.count(b"\n"))
    return keeper.tail()


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_benign_logs_stay_without_fault(name: str) -> None:
    text = BENIGN[name]
    assert failure_line(tail_of(text)) is None
    verdict = explain(text)
    assert verdict.rule != UNRECOGNISED_FAILURE_RULE
    if name != "side-service-unreachable":  # a catalog rule may name that one; the fallback never does
        assert verdict.root is None, verdict.reason
        assert verdict.action is Action.NONE


@pytest.mark.parametrize(
    ("text", "category", "rule"),
    [
        (TRACEBACK + "KeyError: 'labels'\n", Category.USER_CODE, "python.exception"),
        ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n", Category.GPU_MEMORY_OOM, None),
        ("Segmentation fault (core dumped)\n", Category.HOST_SYSTEM, "host.segfault"),
    ],
)
def test_a_rule_that_explains_the_end_is_never_overridden(text: str, category: Category, rule: str | None) -> None:
    verdict = explain(STEPS + text + "ERROR:root:shutting down\n+ exit 1\n")
    assert verdict.category is category
    assert rule is None or verdict.rule == rule


def test_a_degraded_sign_does_not_hide_a_failed_end_but_stays_named() -> None:
    degraded = "NVRM: Xid (PCI:0000:3b:00): 92, High single-bit ECC error rate\n"
    alone = explain(STEPS + degraded)
    assert alone.root is not None and alone.root.severity is Severity.DEGRADED and alone.action is Action.NONE
    verdict = explain(STEPS + degraded + TRACEBACK + "Exception: boom\n")
    assert verdict.rule == UNRECOGNISED_FAILURE_RULE and verdict.action is Action.RESTART
    assert "xid.92.high-sbe-rate" in [fault.rule for fault in verdict.faults]
    went_on = explain(STEPS + degraded + TRACEBACK + "Exception: boom\n" + STEPS)  # caught, and training went on
    assert went_on.rule == "xid.92.high-sbe-rate" and went_on.action is Action.NONE


@pytest.mark.parametrize(
    "degraded_end",
    [
        "NVRM: Xid (PCI:0000:18:00): 161, pid='<unknown>', name=<unknown>, Channel retirement failure\n",
        "NVRM: Xid (PCI:0000:18:00): 157, pid='<unknown>', name=<unknown>, Resource retirement failure\n",
    ],
)
def test_a_degraded_sign_with_failure_words_is_never_raised_to_a_failure(degraded_end: str) -> None:
    # a rule named the line as a degraded sign: the end-of-log readings pass over it
    verdict = explain(STEPS + degraded_end)
    assert verdict.action is Action.NONE
    assert all(not fault.is_fatal for fault in verdict.faults)
    after_failure = explain(STEPS + TRACEBACK + "Exception: boom\n" + degraded_end)
    assert after_failure.rule == UNRECOGNISED_FAILURE_RULE  # the failure before it still counts


XID_92 = "NVRM: Xid (PCI:0000:3b:00): 92, pid=1, name=python, High single-bit ECC error rate\n"


def test_a_degraded_sign_after_a_pasted_failure_line_neither_hides_it_nor_renames_it() -> None:
    pasted = "EFA device rdmap16s27 reported a fatal completion error\n"
    assert explain(STEPS + pasted).category is Category.NETWORK_INFINIBAND
    verdict = explain(STEPS + pasted + XID_92)
    assert verdict.rule == UNRECOGNISED_FAILURE_RULE and verdict.action is Action.RESTART
    assert verdict.category is Category.NETWORK_INFINIBAND
    plain = explain(STEPS + TRACEBACK + "Exception: boom\n" + XID_92)
    assert plain.rule == UNRECOGNISED_FAILURE_RULE and plain.category is Category.OTHER  # the Xid's words are not its


def test_only_the_failing_rank_is_implicated(tmp_path: Path) -> None:
    (tmp_path / "rank0.log").write_text(STEPS)
    (tmp_path / "rank1.log").write_text(STEPS + TRACEBACK + "Exception: dataset shard 17 is unreadable\n")
    verdict = explain_paths([tmp_path])
    assert verdict.rule == UNRECOGNISED_FAILURE_RULE
    assert verdict.ranks == (1,)
    assert verdict.nodes == ()
    assert verdict.root is not None and verdict.root.evidence.rank == 1


def test_only_the_tail_of_a_long_log_is_kept_and_line_numbers_hold() -> None:
    benign = STEPS * 20_000  # about 1 MB: several scanner blocks
    verdict = explain(benign + TRACEBACK + "Exception: dataset shard 17 is unreadable\n")
    assert verdict.root is not None
    assert verdict.root.evidence.line_number == benign.count("\n") + TRACEBACK.count("\n") + 1
    keeper = TailKeeper()
    lines = 0
    for block in [b"x" * 100 + b"\n"] * 3 + [b"y\n"] * TAIL_BYTES + [b"Exception: boom\n"]:  # line by line
        lines += block.count(b"\n")
        keeper.add(block, lines)
    tail = keeper.tail()
    assert len(tail.data) == TAIL_BYTES and tail.cut and tail.lines == lines
    found = failure_line(tail)
    assert found is not None
    assert found[0].text == "Exception: boom" and found[1] == lines and found[2] is Kind.EXCEPTION


def test_a_settled_tail_is_held_once_and_the_stream_may_go_on() -> None:
    """A job of thousands of logs: each ended log keeps TAIL_BYTES once, not twice that plus a copy per verdict."""
    keeper = TailKeeper()
    keeper.add(b"step\n" * (TAIL_BYTES // 5 + 1000), TAIL_BYTES // 5 + 1000)  # 1.3x the tail: kept whole till now
    keeper.settle()
    first, second = keeper.tail(), keeper.tail()
    assert first.data is second.data and len(first.data) == TAIL_BYTES and first.cut  # one copy, handed out
    assert len(keeper._data) == 0  # nothing else held
    keeper.add(b"Exception: boom\n", TAIL_BYTES // 5 + 1001)  # the log goes on (its rotated file was read first)
    tail = keeper.tail()
    assert tail.data.endswith(b"step\nException: boom\n") and tail.lines == TAIL_BYTES // 5 + 1001
    short = TailKeeper()
    short.add(b"one line\n", 1)
    short.settle()
    assert short.tail() == Tail(b"one line\n", 1, cut=False)


def test_unrecognised_failures_spend_the_user_code_retry_budget() -> None:
    verdict = explain(TRACEBACK + "Exception: dataset shard 17 is unreadable\n")
    policy = RecoveryPolicy(max_restarts=5, user_code_retries=1)
    first, state = decide(policy, RecoveryState(), AttemptEnd(verdict, ("node-0",)))
    assert first.kind is DecisionKind.RESTART
    second, _ = decide(policy, state, AttemptEnd(verdict, ("node-0",)))
    assert second.kind is DecisionKind.FAIL
    assert "no rule recognises, seen 2 times" in second.reason


BARE_TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 288, in <module>\n    save(state, step)\n'


def test_a_bare_traceback_takes_its_layer_from_the_message_logged_right_before_it() -> None:
    # the log stops inside the traceback: the header says nothing, the line before it says what failed
    verdict = explain(STEPS + "saving a checkpoint for step 104\ncheckpoint save failed 3 times, exiting\n"
                      + BARE_TRACEBACK)
    assert verdict.rule == UNRECOGNISED_FAILURE_RULE
    assert verdict.category is Category.STORAGE_IO
    assert verdict.root is not None and verdict.root.evidence.line == "Traceback (most recent call last):"
    # a step, an INFO line or a retry notice right before the traceback is no message about it
    assert explain(STEPS + BARE_TRACEBACK).category is Category.OTHER
    for before in ("node-0:811:902 [0] NCCL INFO comm 0x55d1 rank 0 nranks 8 cudaDev 0 busId 1b000 - Init COMPLETE",
                   "INFO waiting for all ranks at barrier (timeout 1800s)",
                   "Loading NFS dataset shard 3 from /mnt/nfs/data",
                   "checkpoint write failed, retrying (1/3)"):
        assert explain(STEPS + before + "\n" + BARE_TRACEBACK).category is Category.OTHER, before
    # an exception line reads only itself
    assert explain("save failed 3 times, exiting\n" + TRACEBACK + "ValueError: bad shape\n").category \
        is Category.USER_CODE
