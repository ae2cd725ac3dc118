"""One gloo rank of a job on simulated nodes, with snapshots replicated to a buddy (``replicas=1``).

Usage: ``replicas.py PHASE DIR RANK WORLD PER_NODE STORE SHM_ROOT [SCALE] [BANDWIDTH]``.  Rank ``r`` runs on
``node-{r // PER_NODE}`` (one node over with ``MOVED=1``: the job was laid out again), whose shared memory is
``SHM_ROOT/node-k`` (a lost node: the test empties it).

``save``: saves steps 1..``STEPS`` to memory (to disk too: the steps listed in ``PERSIST``), prints
``saved <step>`` after each save returns, and ``replicated <step>`` when the last one has reached the buddy.
``slow``: like ``save`` but the last step's replication is paced to BANDWIDTH bytes/s, and the rank then
waits to be killed.
``restore``: prints ``restored <step> <source>`` after checking every value.
``NO_SHM_RANK=r``: rank r has no shared-memory folder (so nobody replicates).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch.distributed as dist
from tests.checkpoint.states import assert_state, make_state

from kcover.checkpoint import Checkpointer

phase, directory, rank, world, per_node, store, shm_root = sys.argv[1:8]
scale = int(sys.argv[8]) if len(sys.argv) > 8 else 1
bandwidth = float(sys.argv[9]) if len(sys.argv) > 9 else None
rank_, world_ = int(rank), int(world)
nodes = world_ // int(per_node)
node = f"node-{(rank_ // int(per_node) + int(os.environ.get('MOVED', '0'))) % nodes}"  # MOVED=1: one node over
os.environ["KCOVER_NODE"] = node
shm = Path(shm_root) / node
shm.mkdir(parents=True, exist_ok=True)
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank_, world_size=world_)


def state(step: int) -> dict[str, object]:
    return make_state(step + 1000 * rank_, scale)


no_memory = os.environ.get("NO_SHM_RANK") == rank  # this rank's node has no shared-memory folder
checkpointer = Checkpointer(directory, rank=rank_, world_size=world_, shared_memory=None if no_memory else shm,
                            emergency_save=False,
                            replicas=1, replica_bandwidth=bandwidth if phase == "slow" else None)
if phase in ("save", "slow"):
    steps = int(os.environ.get("STEPS", "2"))
    persist = {int(s) for s in os.environ.get("PERSIST", "").split(",") if s}
    for step in range(1, steps + 1):
        if phase == "slow" and step == steps:
            checkpointer.wait()
            dist.barrier()  # every rank's previous replica is in place before the slow one starts
            assert checkpointer._replication is not None
            checkpointer._replication.bandwidth = bandwidth
        checkpointer.save(step, state(step), persist=step in persist)
        print(f"saved {step}", flush=True)
    if phase == "slow":
        time.sleep(600)  # killed by the test while the replica is in transfer
    checkpointer.wait()
    print(f"replicated {checkpointer._replication.replicated_step if checkpointer._replication else None}",
          flush=True)
    dist.barrier()
else:
    restored = checkpointer.load_latest()
    assert restored is not None
    assert_state(restored.state, state(restored.step))
    print(f"restored {restored.step} {restored.source}", flush=True)
    dist.barrier()
checkpointer.close()
dist.destroy_process_group()
