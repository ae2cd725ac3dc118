"""Synthetic training logs for the benchmarks: realistic benign lines with rare real faults.

The benign lines copy the shapes real jobs print (Megatron/DeepSpeed iteration
lines, Hugging Face loss dicts, NCCL INFO set-up lines, tqdm bars with ``\\r``,
warnings); the fault lines are the catalog's own example lines.  Deterministic
for a given seed, so two runs scan the same bytes.
"""

from __future__ import annotations

import random
from pathlib import Path

from kcover.classify.rules import load_catalog_files, shipped_catalog_files

BENIGN_SHAPES = [
    "[2024-05-01 10:{m:02d}:{s:02d},{ms:03d}] [INFO] [trainer.py:612] iteration {i}/250000 | "
    "elapsed time per iteration (ms): {f:.1f} | lm loss: {f2:.4E} | grad norm: {f3:.3f}",
    "{host}:{pid}:{tid} [{g}] NCCL INFO Channel {c:02d}/24 : 0[0] -> 1[1] via P2P/NVLink/read",
    "{host}:{pid}:{tid} [{g}] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.{g}.3<0>",
    "{{'loss': {f2:.4f}, 'grad_norm': {f3:.3f}, 'learning_rate': 2e-05, 'epoch': {f3:.2f}}}",
    " {p}%|#####     | {i}/250000 [01:23<01:42,  5.38it/s]\r",
    "[rank{g}]:[W reducer.cpp:1360] Warning: find_unused_parameters=True was specified in DDP "
    "constructor, but did not find any unused parameters in the forward pass.",
    "step {i} | tokens/s {f:.1f} | mfu 0.{g}4 | mem_alloc 61.{g}GB | error_rate=0.0{g}",
    "INFO:root:saving checkpoint to /checkpoints/step_{i} (async) took {f3:.3f}s",
]


def benign_line(rng: random.Random) -> str:
    shape = rng.choice(BENIGN_SHAPES)
    return shape.format(
        m=rng.randrange(60), s=rng.randrange(60), ms=rng.randrange(1000), i=rng.randrange(250000),
        f=rng.uniform(100, 3000), f2=rng.uniform(1, 3), f3=rng.uniform(0, 1), host=f"node-{rng.randrange(64)}",
        pid=rng.randrange(1 << 16), tid=rng.randrange(1 << 16), g=rng.randrange(8), c=rng.randrange(24),
        p=rng.randrange(100),
    )


def fault_lines() -> list[str]:
    rules = load_catalog_files(shipped_catalog_files())
    return [example for rule in rules for example in rule.spec.examples]


def write_log(path: Path, size_bytes: int, fault_ratio: float = 0.001, seed: int = 7) -> int:
    """Write about ``size_bytes`` of log to ``path``; returns the number of fault lines written.

    A 4 MiB pattern of lines is generated once and repeated, so generating
    hundreds of megabytes stays fast.
    """
    rng = random.Random(seed)
    faults = fault_lines()
    lines: list[str] = []
    fault_count = 0
    size = 0
    while size < min(size_bytes, 4 << 20):
        if rng.random() < fault_ratio:
            line = rng.choice(faults)
            fault_count += 1
        else:
            line = benign_line(rng)
        lines.append(line)
        size += len(line) + 1
    chunk = ("\n".join(lines) + "\n").encode()
    repeats = max(1, size_bytes // len(chunk))
    with path.open("wb") as out:
        for _ in range(repeats):
            out.write(chunk)
    return fault_count * repeats
