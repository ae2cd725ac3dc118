"""``save(..., overlap=optimizer)``: large tensors are copied while training goes on, the optimizer waits.

The snapshot must be the state at ``save`` time even though ``save`` returned
before its large tensors were copied: small tensors (changed by forward
passes) are copied before it returns, and the optimizer's ``step()`` — the
only thing that changes the large ones — waits for the copy.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kcover.checkpoint import Checkpointer


def model_and_optimizer() -> tuple[dict[str, torch.Tensor], torch.optim.Optimizer]:
    weights = [torch.nn.Parameter(torch.full((16 << 20,), float(i))) for i in range(4)]  # 4 × 64 MiB
    for weight in weights:
        weight.grad = torch.ones_like(weight)
    state = {f"w{i}": w for i, w in enumerate(weights)} | {"running_mean": torch.zeros(8)}
    return state, torch.optim.SGD(weights, lr=1.0)


def test_the_snapshot_is_the_state_at_save_time_though_save_returned_early(tmp_path: Path, shm_dir: Path) -> None:
    state, optimizer = model_and_optimizer()
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False) as checkpointer:
        for round_ in range(3):
            before = {name: tensor.detach().clone() for name, tensor in state.items()}
            assert checkpointer.save(round_, state, overlap=optimizer)
            state["running_mean"].add_(1)  # the next forward pass changes a buffer…
            optimizer.step()  # …and the step changes every weight, once the copy is done
            assert checkpointer.wait(timeout=60)
            restored = checkpointer.load_latest()
            assert restored is not None and restored.step == round_
            for name, tensor in before.items():
                assert torch.equal(restored.state[name], tensor), (round_, name)
            del restored
        assert checkpointer.last_error is None
        assert torch.equal(state["w1"], torch.full((16 << 20,), 1.0 - 3))  # three real steps happened


def test_the_optimizer_waits_only_while_a_copy_is_in_flight(tmp_path: Path, shm_dir: Path) -> None:
    state, optimizer = model_and_optimizer()
    with Checkpointer(tmp_path, shared_memory=shm_dir, emergency_save=False) as checkpointer:
        checkpointer.save(1, state, overlap=optimizer, persist=False)
        checkpointer.save(2, state, overlap=optimizer, persist=False)  # one hook, however many saves
        assert len(optimizer._optimizer_step_pre_hooks) == 1
        assert checkpointer.wait(timeout=60)
    optimizer.step()  # after close: nothing to wait for
