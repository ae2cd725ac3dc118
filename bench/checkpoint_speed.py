"""Benchmark of kcover.checkpoint against baselines measured in the same run, on the same disk.

Builds a state dict of mixed tensor sizes (a few 256 MiB tensors, many of
1–16 MiB, thousands of small ones, nested optimizer-like state with plain
Python leaves), then measures, in one process (each timing that the machine's
noise moves — saves, loads, copies — is the median of ``--repeats`` runs):

- ``torch.save`` of the state (no fsync: the kindest baseline) vs the time
  ``Checkpointer.save`` blocks the caller (first save, which reserves shared
  memory, and a steady-state save);
- ``dd bs=64M conv=fdatasync`` into the same dir, just before each persist
  (the virtual disk's speed drifts), vs the persist throughput;
- restoring into the model (``load_latest()`` from shared memory, as a
  restarted worker does, then copying every tensor into the live ones, which
  is what ``load_state_dict`` does) vs ``torch.load`` with a warm page cache
  plus the same copy, and vs a plain in-memory copy of the same bytes
  (``bytearray(memoryview)``); ``load_latest()`` alone returns copy-on-write
  views of the snapshot, so it is also reported on its own;
- peak extra resident memory (RSS, shared pages included) during save+persist,
  with two snapshots kept in shared memory (the default) and with one;
- with CUDA: device→host snapshot bandwidth vs ``tensor.to("cpu")``.

Run: ``python -m bench.checkpoint_speed --size-gb 2 --dir /path/on/disk``.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import torch

from bench.args import existing_dir
from kcover.checkpoint import Checkpointer, remove_snapshots

MIB = 1 << 20


def make_state(total_bytes: int) -> dict[str, Any]:
    """Mixed sizes and dtypes, nested like model + optimizer state, with plain Python leaves."""
    generator = torch.Generator().manual_seed(0)
    model: dict[str, torch.Tensor] = {}
    budget = total_bytes
    sizes = [256 * MIB] * 4 + [16 * MIB] * 24 + [MIB] * 96
    index = 0
    while budget > 0:
        size = sizes[index % len(sizes)] if index < len(sizes) else 4 * MIB
        size = min(size, budget)
        dtype = (torch.float32, torch.bfloat16, torch.float32, torch.int64)[index % 4]
        count = max(1, size // torch.empty(0, dtype=dtype).element_size())
        model[f"layer{index}.weight"] = torch.randint(0, 1000, (count,), generator=generator).to(dtype)
        budget -= count * model[f"layer{index}.weight"].element_size()
        index += 1
    small = {f"norm{i}.bias": torch.randn(64, generator=generator) for i in range(2000)}
    return {
        "model": {**model, **small},
        "optimizer": {"param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "params": list(range(10))}],
                      "state": {i: {"step": torch.tensor(100.0)} for i in range(10)}},
        "step": 100, "rng": torch.get_rng_state(),
    }


def state_bytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    return 0


class PeakRss:
    """Samples this process's RSS every few milliseconds on a thread."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.003)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def timed(action: Any) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def dd_throughput(folder: Path, size: int) -> float:
    target = folder / "dd.bin"
    count = max(1, size // (64 * MIB))
    began = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=64M", f"count={count}", "conv=fdatasync"],
                   check=True, capture_output=True)
    seconds = time.perf_counter() - began
    target.unlink()
    return count * 64 * MIB / seconds


def cuda_figures(size: int) -> list[tuple[str, str]]:
    if not torch.cuda.is_available():
        return [("device→host snapshot", "no CUDA device on this machine: not measured")]
    tensors = [torch.randn(size // 4 // 8, device="cuda") for _ in range(8)]
    torch.cuda.synchronize()
    plain = timed(lambda: [t.to("cpu") for t in tensors])
    with tempfile.TemporaryDirectory() as folder, Checkpointer(folder, emergency_save=False) as checkpointer:
        checkpointer.save(0, {"t": tensors}, persist=False)  # reserve and pin the buffer
        checkpointer.save(1, {"t": tensors}, persist=False)
        snap = checkpointer.last_blocking_seconds
        checkpointer.close(remove_snapshot=True)
    return [("device→host snapshot", f"{size / snap / 1e9:.2f} GB/s vs tensor.to('cpu') {size / plain / 1e9:.2f} "
             f"GB/s ({plain / snap:.2f}×)")]


def tensors_of(state: Any) -> list[torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in tensors_of(v)]
    if isinstance(state, list | tuple):
        return [t for v in state for t in tensors_of(v)]
    return []


def copy_into(destination: Any, source: Any) -> None:
    """What ``load_state_dict`` does: copy every restored tensor into the live one."""
    for live, restored in zip(tensors_of(destination), tensors_of(source), strict=True):
        live.copy_(restored)


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def measure_baselines(state: Any, folder: Path, nbytes: int, repeats: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    torch_file = folder / "torch.pt"
    saves, loads, loads_into = [], [], []
    for _ in range(repeats):
        saves.append(timed(lambda: torch.save(state, torch_file)))
        torch.load(torch_file)  # warm the page cache
        gc.collect()
        began = time.perf_counter()
        loaded = torch.load(torch_file)
        loads.append(time.perf_counter() - began)
        copy_into(state, loaded)
        loads_into.append(time.perf_counter() - began)
        loaded = None
        gc.collect()
    figures |= {"torch_save": median(saves), "torch_load": median(loads), "torch_load_into": median(loads_into)}
    torch_file.unlink()
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors_of(state)])
    figures["memcpy"] = median([timed(lambda: bytearray(flat.numpy().data)) for _ in range(repeats)])
    figures["memcpy_into"] = median([timed(lambda: _copy_flat(state, flat)) for _ in range(repeats)])
    flat = torch.empty(0)
    gc.collect()
    return figures


def _copy_flat(state: Any, flat: torch.Tensor) -> None:
    offset = 0
    for live in tensors_of(state):
        size = live.numel() * live.element_size()
        live.reshape(-1).view(torch.uint8).copy_(flat[offset : offset + size])
        offset += size


def measure_save(state: Any, ckpt_dir: Path, job: str, repeats: int) -> dict[str, float]:
    """Saves; before each steady one, ``dd`` writes the same bytes to the same disk (its speed drifts)."""
    rss_before = psutil.Process().memory_info().rss
    steady, persists, dd_rates = [], [], []
    with PeakRss() as peak:
        checkpointer = Checkpointer(ckpt_dir, job_id=job, emergency_save=False)
        checkpointer.save(1, state)
        first = checkpointer.last_blocking_seconds
        checkpointer.wait()
        for step in range(2, 2 + repeats):
            for tensor in tensors_of(state):  # a training step changes every tensor
                tensor.add_(1)
            dd_rates.append(dd_throughput(ckpt_dir, state_bytes(state)))
            checkpointer.save(step, state)
            steady.append(checkpointer.last_blocking_seconds)
            checkpointer.wait()
            persists.append(checkpointer.last_persist_seconds)
    image = (ckpt_dir / f"step-{1 + repeats:012d}" / "rank-00000.img").stat().st_size
    assert checkpointer.last_error is None, checkpointer.last_error
    figures = {"first": first, "steady": median(steady), "persist": median(persists), "dd": median(dd_rates),
               "persist_vs_dd": median([image / seconds / dd for seconds, dd in zip(persists, dd_rates, strict=True)]),
               "image": image, "extra": peak.peak - rss_before, "step": 1 + repeats}
    checkpointer.close()
    return figures


def measure_one_snapshot_rss(state: Any, ckpt_dir: Path, job: str) -> int:
    """Peak extra RSS of three saves with ``memory_snapshots=1`` (one file, written in place)."""
    rss_before = psutil.Process().memory_info().rss
    with PeakRss() as peak, Checkpointer(ckpt_dir, job_id=job, emergency_save=False, memory_snapshots=1) as saver:
        for step in (1, 2, 3):
            saver.save(step, state)
            saver.wait()
        saver.close(remove_snapshot=True)
    return peak.peak - rss_before


def measure_restore(state: Any, ckpt_dir: Path, job: str, step: int, repeats: int) -> dict[str, float]:
    """Each repetition is a restarted worker: a new Checkpointer maps the snapshot and restores into the model."""
    loads, loads_into = [], []
    for _ in range(repeats):
        expected = state["model"]["layer0.weight"].clone()  # what the last save held
        state["model"]["layer0.weight"].zero_()
        restarted = Checkpointer(ckpt_dir, job_id=job, emergency_save=False)
        began = time.perf_counter()
        restored = restarted.load_latest()
        loaded = time.perf_counter()
        assert restored is not None and restored.source == "memory" and restored.step == step
        copy_into(state, restored.state)
        loads.append(loaded - began)
        loads_into.append(time.perf_counter() - began)
        assert torch.equal(state["model"]["layer0.weight"], expected)
        del restored
        restarted.close()
        gc.collect()
    remove_snapshots(ckpt_dir, job_id=job)
    from_disk = Checkpointer(ckpt_dir, shared_memory=None, emergency_save=False)
    figures = {"shm_load": median(loads), "shm_load_into": median(loads_into), "shm_first_into": loads_into[0],
               "disk_load": median([timed(from_disk.load_latest) for _ in range(repeats)])}
    from_disk.close()
    return figures


class AddOne(torch.optim.Optimizer):
    """An optimizer whose step changes every tensor of the state (whatever its dtype)."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__(tensors, {})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for tensor in group["params"]:
                tensor.add_(1)


def measure_overlap(state: Any, ckpt_dir: Path, job: str, compute_s: float = 1.0) -> dict[str, float]:
    """A training step (``compute_s`` of matmuls as forward + backward, then the optimizer step changing every
    tensor): alone, after a plain ``save``, and after ``save(overlap=optimizer)``.  Each step's extra time includes
    the background persist competing for the CPU; "blocking" is what the training thread itself waits."""
    optimizer = AddOne(tensors_of(state))
    a = torch.randn(1024, 1024)
    timed(lambda: [a @ a for _ in range(10)])
    probe = timed(lambda: [a @ a for _ in range(20)]) / 20
    matmuls = max(1, int(compute_s / probe))

    def training_step() -> None:
        for _ in range(matmuls):
            a @ a
        optimizer.step()

    rows: dict[str, list[float]] = {"plain": [], "saved": [], "overlapped": [], "blocking": [], "blocking_overlap": []}
    with Checkpointer(ckpt_dir, job_id=job, emergency_save=False) as checkpointer:
        checkpointer.save(0, state)  # the first save reserves the buffer
        checkpointer.wait()
        def saved_step(step: int, overlap: torch.optim.Optimizer | None) -> None:
            checkpointer.save(step, state, overlap=overlap)
            training_step()

        for step in range(1, 4):
            rows["plain"].append(timed(training_step))
            rows["saved"].append(timed(lambda s=2 * step: saved_step(s, None)))
            rows["blocking"].append(checkpointer.last_blocking_seconds)
            checkpointer.wait()
            rows["overlapped"].append(timed(lambda s=2 * step + 1: saved_step(s, optimizer)))
            rows["blocking_overlap"].append(checkpointer.last_blocking_seconds + checkpointer.last_step_wait_seconds)
            checkpointer.wait()
        checkpointer.close(remove_snapshot=True)
    assert checkpointer.last_error is None, checkpointer.last_error
    return {name: sorted(values)[1] for name, values in rows.items()}


def run(size: int, folder: Path, repeats: int) -> list[tuple[str, str, str, bool]]:
    state = make_state(size)
    nbytes = state_bytes(state)
    print(f"state: {nbytes / 1e9:.2f} GB in {len(tensors_of(state))} tensors; dir {folder}", flush=True)
    base = measure_baselines(state, folder, nbytes, repeats)
    job = f"bench-{os.getpid()}"
    save = measure_save(state, folder / "ckpt", job, repeats)
    load = measure_restore(state, folder / "ckpt", job, int(save["step"]), repeats)
    overlap = measure_overlap(state, folder / "ckpt-overlap", job + "-overlap")
    one_snapshot = measure_one_snapshot_rss(state, folder / "ckpt-one", job + "-one")
    torch_save, torch_load, rate = base["torch_save"], base["torch_load"], save["image"] / save["persist"]
    return [
        ("save blocking, steady state", f"{save['steady']:.3f} s vs torch.save {torch_save:.2f} s",
         f"{save['steady'] / torch_save:.3f} (≤ 0.10)", save["steady"] / torch_save <= 0.10),
        ("save blocking, overlapped (save(overlap=opt))",
         f"{overlap['blocking_overlap']:.3f} s vs torch.save {torch_save:.2f} s",
         f"{overlap['blocking_overlap'] / torch_save:.3f} (≤ 0.10)", overlap["blocking_overlap"] / torch_save <= 0.10),
        ("  a 1 s training step, with the save", f"plain save +{overlap['saved'] - overlap['plain']:.2f} s, "
         f"overlapped +{overlap['overlapped'] - overlap['plain']:.2f} s (step alone {overlap['plain']:.2f} s; "
         "includes the persist's CPU)", "(reported)", True),
        ("save blocking, first save (reserves shm)", f"{save['first']:.3f} s vs torch.save {torch_save:.2f} s",
         f"{save['first'] / torch_save:.3f} (reported)", True),
        ("persist throughput", f"{rate / 1e9:.2f} GB/s vs dd fdatasync {save['dd'] / 1e9:.2f} GB/s (each dd "
         "just before a persist)", f"{save['persist_vs_dd']:.2f} (≥ 0.70)", save["persist_vs_dd"] >= 0.70),
        ("restore from shm into the model", f"{load['shm_load_into']:.3f} s vs torch.load (warm) + copy "
         f"{base['torch_load_into']:.2f} s", f"{base['torch_load_into'] / load['shm_load_into']:.1f}× faster (≥ 3×)",
         base["torch_load_into"] / load["shm_load_into"] >= 3),
        ("  the first restore after the save", f"{load['shm_first_into']:.3f} s vs torch.load (warm) + copy "
         f"{base['torch_load_into']:.2f} s", f"{base['torch_load_into'] / load['shm_first_into']:.1f}× (reported)",
         True),
        ("  same vs plain memcpy of the bytes",
         f"{load['shm_load_into']:.3f} s vs bytearray copy {base['memcpy']:.3f} s",
         f"{base['memcpy'] / load['shm_load_into']:.2f} of memcpy speed (≥ 0.50)",
         base["memcpy"] / load["shm_load_into"] >= 0.5),
        ("  same vs memcpy into the live tensors", f"{load['shm_load_into']:.3f} s vs {base['memcpy_into']:.3f} s",
         f"{base['memcpy_into'] / load['shm_load_into']:.2f} (reported)", True),
        ("load_latest() alone (zero-copy views)", f"{load['shm_load']:.3f} s vs torch.load {torch_load:.2f} s",
         f"{torch_load / load['shm_load']:.0f}× (reported)", True),
        ("peak extra RSS during save+persist", f"{save['extra'] / 1e9:.2f} GB for a {nbytes / 1e9:.2f} GB state "
         "(two snapshots in shm)", f"{save['extra'] / nbytes:.2f}× state (≤ 2× + 64 MiB)",
         save["extra"] <= 2 * nbytes + 64 * MIB),
        ("  with memory_snapshots=1", f"{one_snapshot / 1e9:.2f} GB", f"{one_snapshot / nbytes:.2f}× state "
         "(≤ 1× + 64 MiB)", one_snapshot <= nbytes + 64 * MIB),
        ("restore from disk, verified (warm)", f"{load['disk_load']:.2f} s vs torch.load {torch_load:.2f} s",
         f"{torch_load / load['disk_load']:.1f}× faster (reported)", True),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--dir", type=existing_dir, default=None, help="a folder on the disk to measure (default: ./)")
    parser.add_argument("--repeats", type=int, default=3, help="each noisy figure is the median of this many runs")
    args = parser.parse_args()
    size = int(args.size_gb * (1 << 30))
    parent = args.dir or Path.cwd()
    parent.mkdir(parents=True, exist_ok=True)
    free_disk = shutil.disk_usage(parent).free
    free_memory = psutil.virtual_memory().available
    if free_disk < 4 * size or free_memory < 6 * size:
        raise SystemExit(f"need 4× the state free on disk and 6× in memory: {free_disk / 1e9:.1f} GB disk, "
                         f"{free_memory / 1e9:.1f} GB memory free")
    folder = Path(tempfile.mkdtemp(prefix="kcover-bench-", dir=parent))
    try:
        rows = run(size, folder, max(1, args.repeats))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for name, figures, ratio, ok in rows:
        print(f"{name:42s} {figures:64s} ratio {ratio} {'ok' if ok else 'MISSED'}")
    for name, figures in cuda_figures(min(size, 1 << 30)):
        print(f"{name:42s} {figures}")


if __name__ == "__main__":
    main()
