"""Training frameworks' own verdicts: their health checks and notices name the layer, not the exit.

Cases from the audit of DeepSpeed, Megatron-LM, NeMo, nvidia-resiliency-ext, Lightning,
transformers and accelerate: a node refused by the in-job health check is excluded, a trainer
that saved and exited on the scheduler's signal was preempted, a hang the rank monitor saw loses
to the fault that hung the rank, and an incomplete checkpoint is storage.
"""

from __future__ import annotations

import pytest

from kcover import Action, Category, explain

EXIT = "[rank: 1] Child process with PID 48213 terminated with code 1. Forcefully terminating all other processes\n"


@pytest.mark.parametrize(
    ("line", "category"),
    [
        ("Agent .run() raised UnhealthyNodeException: Node gpu-node-a17_48213_0 has an unhealthy GPU.",
         Category.GPU_HARDWARE),
        ("NIC link state health check failed for node gpu-node-a17_48213_0: Node gpu-node-a17_48213_0 has "
         "unhealthy NIC link(s).", Category.NETWORK_INFINIBAND),
        ("ERROR:megatron.core.rerun_state_machine:Rank 13, node gpu-node-a17, device 5, iteration #12001: First "
         "rerun: unexpected result is not reproducible within the tolerance (tensor(2.3811, device='cuda:5') != "
         "tensor(nan, device='cuda:5')). Possible transient error!", Category.GPU_HARDWARE),
    ],
    ids=["nvrx-gpu", "nvrx-nic", "megatron-transient"],
)
def test_a_node_the_framework_found_broken_is_excluded(line: str, category: Category) -> None:
    verdict = explain(line + "\n" + EXIT)
    assert (verdict.category, verdict.node_at_fault) == (category, True)
    assert verdict.action is Action.RESTART_EXCLUDING_NODES


def test_a_trainer_that_saved_on_sigterm_was_preempted_not_failed() -> None:
    verdict = explain("[NeMo I 2026-08-14 05:59:30 preemption:67] Preemption detected, saving checkpoint and exiting\n"
                      + EXIT)
    assert (verdict.category, verdict.rule) == (Category.INFRA_K8S, "train.preemption-notice")
    assert verdict.action is Action.RESTART


def test_the_rank_monitors_timeout_loses_to_what_hung_the_rank() -> None:
    monitor = ("[2026-08-14 05:02:11,418] [WARNING] [RankMonServer48213@gpu-node-a17:13] [Cycle 0] Did not get "
               "subsequent heartbeat. Waited 300.00 seconds.\n")
    assert explain(monitor).category is Category.COLLECTIVE_TIMEOUT_HANG
    cause = "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    assert explain(cause + monitor).category is Category.CUDA_SOFTWARE


def test_an_unfinished_checkpoint_is_storage_not_the_users_value_error() -> None:
    verdict = explain("ValueError: Last checkpoint is unfinished and cannot be used to resume the training. Please "
                      "remove the checkpoint manually to avoid unexpected cosequences\n")
    assert (verdict.category, verdict.rule) == (Category.STORAGE_IO, "storage.checkpoint-corrupt")
