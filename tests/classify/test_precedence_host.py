"""Which fault is the root when host, scheduler and wrapper lines meet in one excerpt.

Each case is a multi-line excerpt as a worker's log shows it, classified by the real
``explain()``: a signal wins over the Python exception that merely reports it, the reason for a
kill (OOM killer, eviction, a Slurm time limit or node failure) wins over the kill, a corrected
hardware error or a recovering file server is no fault, and a wrapper's "the child failed" line
leaves the root to the child's own error.
"""

from __future__ import annotations

import pytest

from kcover import Action, Category, explain
from kcover.faults import Role

CALLED_PROCESS = (
    "Traceback (most recent call last):\n"
    '  File "/usr/local/bin/accelerate", line 8, in <module>\n'
    "    sys.exit(main())\n"
    '  File "/usr/lib/python3.10/subprocess.py", line 526, in run\n'
    "    raise CalledProcessError(retcode, process.args,\n"
    "subprocess.CalledProcessError: Command '['/usr/bin/python', 'train.py', '--bf16']' {ending}\n"
)


def _called(ending: str) -> str:
    return CALLED_PROCESS.format(ending=ending)


def test_sigkill_wrapped_in_called_process_error_is_the_signal_not_user_code() -> None:
    verdict = explain("step 1200 loss 2.31\n" + _called("died with <Signals.SIGKILL: 9>."))
    assert verdict.rule == "host.sigkill"
    assert verdict.category is Category.HOST_SYSTEM
    assert verdict.action is Action.RESTART


def test_negative_exit_status_in_called_process_error_is_the_signal() -> None:
    verdict = explain(_called("returned non-zero exit status -9."))
    assert verdict.rule == "host.sigkill"
    verdict = explain(_called("died with <Signals.SIGSEGV: 11>."))
    assert verdict.rule == "host.segfault"
    assert verdict.category is Category.HOST_SYSTEM


def test_kernel_oom_kill_explains_the_sigkill_that_the_wrapper_reports() -> None:
    text = (
        "[88121.004] python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0\n"
        "[88121.119] Out of memory: Killed process 43121 (python) total-vm:98123456kB, anon-rss:81234567kB\n"
        + _called("died with <Signals.SIGKILL: 9>.")
    )
    verdict = explain(text)
    assert verdict.rule == "host.oom-killer"
    assert verdict.category is Category.HOST_SYSTEM


def test_child_error_is_the_root_and_the_wrapper_failure_only_a_cascade() -> None:
    child = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 88, in <module>\n'
        "    labels = batch['labels']\n"
        "KeyError: 'labels'\n"
    )
    verdict = explain(child + _called("returned non-zero exit status 1."))
    assert verdict.rule == "python.exception"
    assert verdict.category is Category.USER_CODE
    alone = explain(_called("returned non-zero exit status 1."))
    assert alone.rule == "python.subprocess-failed"
    assert alone.category is Category.OTHER
    assert alone.root is not None and alone.root.role is Role.CASCADE


def test_slurm_oom_kill_event_wins_over_the_task_killed_line() -> None:
    text = (
        "slurmstepd: error: Detected 1 oom_kill event in StepId=88231.0. Some of the step tasks have been OOM Killed.\n"
        "srun: error: gpu-a07: task 5: Killed\n"
        "srun: Terminating StepId=88231.0\n"
    )
    verdict = explain(text)
    assert verdict.rule == "host.oom-killer"


def test_slurm_time_limit_is_the_cause_of_the_kill_that_follows() -> None:
    text = (
        "step 88000 loss 1.92\n"
        "slurmstepd: error: *** STEP 9913321.0 ON gpu-h-017 CANCELLED AT 2024-09-21T00:00:07 DUE TO TIME LIMIT ***\n"
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
        "srun: error: gpu-h-017: tasks 0-7: Terminated\n"
        "srun: error: gpu-h-018: task 9: Killed\n"
    )
    verdict = explain(text)
    assert verdict.rule == "slurm.time-limit"
    assert verdict.category is Category.OTHER


def test_slurm_node_failure_wins_over_the_killed_tasks() -> None:
    text = (
        "srun: error: gpu-a05: task 4: Killed\n"
        "slurmstepd: error: *** JOB 4412 ON gpu-a03 CANCELLED AT 2025-02-11T03:14:07 DUE TO NODE FAILURE, "
        "SEE SLURMCTLD LOG FOR DETAILS ***\n"
    )
    verdict = explain(text)
    assert verdict.rule == "slurm.node-failure"
    assert verdict.category is Category.INFRA_K8S
    # the failed node is named in the line (gpu-a03), the log is the batch host's: blaming the log's node
    # would exclude a healthy one, so Slurm, which drains the failed node itself, is left to it
    assert not verdict.node_at_fault


def test_eviction_explains_the_exit_137_and_the_failed_training_job() -> None:
    text = (
        "Status:           Failed\n"
        "Reason:           Evicted\n"
        "Message:          The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki.\n"
        "    Last State:     Terminated\n"
        "      Exit Code:    137\n"
        "  Normal  PyTorchJobFailed  1m  pytorchjob-controller  "
        "PyTorchJob ml/llama-ft is failed because 1 Worker replica(s) failed.\n"
    )
    verdict = explain(text)
    assert verdict.rule == "k8s.evicted"
    assert verdict.category is Category.INFRA_K8S


def test_training_operator_failure_alone_is_a_cascade() -> None:
    verdict = explain("TFJob mnist-dist is failed because 2 Worker replica(s) failed.\n")
    assert verdict.rule == "k8s.training-job-failed"
    assert verdict.root is not None and verdict.root.role is Role.CASCADE


def test_not_ready_node_row_in_kubectl_output_blames_the_node() -> None:
    text = (
        "$ kubectl get nodes\n"
        "NAME          STATUS     ROLES    AGE   VERSION\n"
        "gpu-node-16   Ready      <none>   41d   v1.29.4\n"
        "gpu-node-17   NotReady   <none>   41d   v1.29.4\n"
    )
    verdict = explain(text)
    assert verdict.rule == "k8s.node-lost"
    assert verdict.node_at_fault


@pytest.mark.parametrize(
    "text",
    [
        "mce: [Hardware Error]: Machine check events logged\n"
        "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x12345)\n",
        "pcieport 0000:00:03.1: AER: Corrected error received: 0000:03:00.0\n"
        "pcieport 0000:00:03.1: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)\n",
        "[ 812.1] EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Opts: (null)\n"
        "nfs: server 10.0.0.2 OK\n",
        "Evicted entries from the KV cache to free 2.1 GiB\nstep 10 loss 2.31\n",
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
        "step 11 loss 2.29\n",
    ],
    ids=["mce-corrected", "aer-corrected", "fs-ok", "evicted-prose", "fp16-overflow-skip"],
)
def test_corrected_or_recovered_conditions_are_no_fault(text: str) -> None:
    assert explain(text).category is None


def test_uncorrected_memory_error_beats_the_sigbus_it_causes() -> None:
    text = (
        "[902211.004155] EDAC MC1: 1 UE memory read error on CPU_SrcID#1_MC#0_Chan#2_DIMM#0\n"
        "[902211.004201] Memory failure: 0x3f2a1c: Sending SIGBUS to python:43121 due to hardware memory corruption\n"
        "Bus error (core dumped)\n"
    )
    verdict = explain(text)
    assert verdict.rule == "host.machine-check"
    assert verdict.action is Action.RESTART_EXCLUDING_NODES


def test_nfs_server_not_responding_is_only_degraded_unless_the_call_fails() -> None:
    hard = explain("nfs: server 10.0.0.2 not responding, still trying\n")
    assert hard.rule == "storage.nfs-not-responding"
    assert hard.action is Action.NONE
    soft = explain(
        "nfs: server 10.0.0.2 not responding, still trying\n"
        "nfs: server 10.0.0.2 not responding, timed out\n"
        "OSError: [Errno 5] Input/output error: '/nfs/ckpt/step_1000/model.pt'\n"
    )
    assert soft.category is Category.STORAGE_IO
    assert soft.action is Action.RESTART


def test_loss_scale_abort_is_not_blindly_retried() -> None:
    text = (
        "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 210, in <module>\n'
        "    engine.step()\n"
        "Exception: Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n"
    )
    verdict = explain(text)
    assert verdict.rule == "train.numerical-divergence"
    assert verdict.action is Action.FAIL


def test_tensorflow_gpu_oom_is_gpu_memory_and_cpu_oom_is_host_memory() -> None:
    gpu = explain(
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
        "shape[64,256,56,56] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n"
    )
    assert gpu.category is Category.GPU_MEMORY_OOM
    cpu = explain(
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
        "shape[1000000,512] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu\n"
    )
    assert cpu.category is Category.HOST_SYSTEM


@pytest.mark.parametrize(
    ("host_line", "rule"),
    [
        ("[epilog] dmesg: [ 4411.220101] traps: python3[48211] general protection fault ip:7f8e5c2a1b40 "
         "sp:7ffc9a1e2f10 error:0 in libc.so.6[7f8e5c228000+195000]", "host.segfault"),
        ("[epilog] journalctl: May 01 10:02:11 gpu-node-a17 systemd-oomd[812]: Killed "
         "/system.slice/slurmstepd.scope/job_1234567/step_0 due to memory pressure for /system.slice "
         "being 81.42% > 60.00% for > 20s with reclaim activity", "host.oom-killer"),
        ("[epilog] dmesg: [ 9021.110101] Kernel panic - not syncing: Fatal exception", "host.kernel-panic"),
        ("[epilog] dmesg: [6011402.880114] thermal thermal_zone0: acpitz: critical temperature reached, shutting down",
         "host.hardware-protection"),
        ("[epilog] ipmitool sel list:   2f | 05/14/24 | 04:01:09 UTC | Processor #0x04 | IERR | Asserted",
         "host.hardware-protection"),
        ("[epilog] dmesg: [3310480.880702] pcieport 0000:3a:00.0: DPC: containment event, status:0x1f01 source:0x0000",
         "host.pcie-aer-fatal"),
    ],
    ids=["user-gpf", "systemd-oomd", "kernel-panic", "thermal-shutdown", "bmc-ierr", "dpc-containment"],
)
def test_a_host_kill_in_the_epilog_explains_the_peers_timeouts_and_remote_errors(host_line: str, rule: str) -> None:
    # Found by the host audit: without rules for these lines the verdict was the peers' cascade.
    cascade = (
        "[rank0]:[E501 10:12:13.004] [PG 0 Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=88211, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600084 milliseconds before timing out.\n"
        "[rank2]: ncclRemoteError: A call failed possibly due to a network error or a remote process "
        "exiting prematurely.\n"
    )
    for text in (cascade + host_line + "\n", host_line + "\n" + cascade):
        verdict = explain(text)
        assert (verdict.rule, verdict.category) == (rule, Category.HOST_SYSTEM)
