"""A plain DDP training script (gloo) that knows nothing of kcover: kcover times its steps by itself.

Each step's "compute" runs inside the model's forward: 30 chunks of a small matmul and a 1 ms sleep
(like ``straggler_train.py``, so a SIGSTOP throttle slows it as it would slow real work); rank 0 does 30%
more every 10th step (uneven by design).  It prints ``step N`` after every step (kcover reads the steps
from the log), and at the end ``<variant>: params <sum>, hook calls <n>``.

STEPS (default 120) steps of each variant in VARIANTS (comma-separated, default one plain run), each a fresh
model from the same seed, in order; with MARK_FD set, ``variant <name>`` is written there before each.
  ``hook``        the script registers its own communication hook (it counts its calls) before the first step;
  ``late-hook``   the same, after step 2;
  ``builtin``     torch's built-in FP16 compression hook;
  ``twice``       two hooks: the second registration's error is printed and the job goes on;
  ``accumulate``  two micro-batches per step, the first under ``no_sync``;
  ``eval``        a ``no_grad`` forward before every step;
  ``compiled``    the DDP model under ``torch.compile`` (dynamo with the eager backend; it says its graph breaks);
  ``eval-mode``   an evaluation forward in ``eval()`` mode with gradients on (no backward) before every step;
  ``sync-later``  two micro-batches, ``no_sync`` around the first one's forward only (DDP decides at the forward);
  ``wait``        0.25 s of "waiting" (data, the optimizer) after each backward: not compute;
  ``two-models``  a second DDP model (a discriminator) trained in the same steps;
  ``copies``      the model is deep-copied and pickled after training;
  ``freed``       three DDP models built, trained a step and deleted: it says how many are still alive;
  ``sdk``         the script also times its steps itself with ``kcover.step_time`` (2× the real time; it
                  silences kcover's own timer for the rest of the process, so it goes last).
"""
import copy
import gc
import os
import pickle
import time
import weakref

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
calls = [0]


class Chunks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(32, 32)
        self.work = 30

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        for _ in range(self.work):
            batch = torch.tanh(self.layer(batch) * 0.01)
            time.sleep(0.001)
        return batch


def counted(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    calls[0] += 1
    return default_hooks.allreduce_hook(state, bucket)  # type: ignore[arg-type]


def register(model: DistributedDataParallel) -> None:
    try:
        model.register_comm_hook(None, counted)
    except RuntimeError as error:
        print(f"hook refused: {error}", flush=True)


def build_and_free() -> None:
    built = []
    for _ in range(3):
        spare = DistributedDataParallel(torch.nn.Linear(32, 32))
        spare(torch.randn(4, 32)).sum().backward()
        built.append(weakref.ref(spare))
        del spare
    gc.collect()
    print(f"freed: {sum(ref() is not None for ref in built)} still alive", flush=True)


def earlier_micro_batches(model: DistributedDataParallel, variant: str, batch: torch.Tensor) -> None:
    if variant == "eval":
        with torch.no_grad():
            model(batch)
    if variant == "accumulate":
        with model.no_sync():
            model(batch).sum().backward()
    if variant == "sync-later":
        with model.no_sync():
            early = model(batch)
        early.sum().backward()
    if variant == "eval-mode":
        model.eval()
        model(batch)
        model.train()


def train(variant: str) -> None:
    torch.manual_seed(0)
    calls[0] = 0
    if variant == "freed":
        build_and_free()
    inner = Chunks()
    model = DistributedDataParallel(inner)
    other = DistributedDataParallel(torch.nn.Linear(32, 1)) if variant == "two-models" else None
    if variant in ("hook", "twice"):
        register(model)
    if variant == "twice":
        register(model)
    if variant == "builtin":
        model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = torch.compile(model, backend="eager") if variant == "compiled" else model
    batch = torch.randn(4, 32)
    for step in range(int(os.environ.get("STEPS", "120"))):
        inner.work = 39 if rank == 0 and step % 10 == 0 else 30
        if variant == "late-hook" and step == 2:
            register(model)
        earlier_micro_batches(model, variant, batch)
        if variant == "sdk":
            import kcover
            began = time.perf_counter()
            model(batch).sum().backward()
            kcover.step_time(2 * (time.perf_counter() - began), step)
        else:
            run(batch).sum().backward()
        if other is not None:
            other(batch).sum().backward()
        if variant == "wait":
            time.sleep(0.25)
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}", flush=True)
    if variant == "copies":
        copy.deepcopy(model)
        pickle.dumps(model)
    if variant == "compiled":
        breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
        print(f"graph breaks {breaks}", flush=True)
    print(f"{variant or 'plain'}: params {sum(p.double().sum().item() for p in model.parameters())!r}, "
          f"hook calls {calls[0]}", flush=True)
    del model, run, other
    gc.collect()  # the next variant's model is the one timed (one at a time)


for name in os.environ.get("VARIANTS", "").split(","):
    if os.environ.get("MARK_FD"):  # the tests' own mark, to tell the variants' timings apart
        os.write(int(os.environ["MARK_FD"]), f"variant {name}\n".encode())
    train(name)
dist.destroy_process_group()
