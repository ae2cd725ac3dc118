"""Projected ETTR at scale: the Llama 3 405B interruption mix against kcover's recovery paths (issue 15, item 6).

What a faster restart is worth depends on how often a job is interrupted and by what. Meta reported
both for the Llama 3 405B pre-training: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs,
by root cause (The Llama 3 Herd of Models, arXiv 2407.21783, §3.3.4 and Table 5). This bench plays
that trace, scaled linearly with the GPU count (1,024, 16,384 and 100,000 GPUs), against the
recovery time of each path, for checkpoint intervals from one training step to 60 minutes, and
prints the effective training time ratio (ETTR = productive time / wall time) per scale, interval
and recovery strategy.

The trace is played in expectation. Per interruption of category ``c`` the job loses

    hang detection (hang categories only) + restart + restore + half a checkpoint cycle

where a checkpoint cycle is the compute between two saves plus the save's blocking time; the saves
themselves cost ``save / cycle`` of the remaining time. So, with ``rate`` interruptions per second,

    ETTR = (1 - rate * mean loss per interruption) * compute / (compute + save)      (clipped to [0, 1])

A fault that blames a node (a GPU, its memory, the host) needs that node replaced: warm standby
where a strategy has it, else a restart excluding the node. A fault that blames no node (a software
bug, a dependency, a switch or cable, an NCCL watchdog timeout) is recovered in place. Table 5
prints 30.1% for its 148 faulty-GPU interruptions, which are 35.3% of 419; the counts add up to
419 and are used here.

Every number comes from ``bench/recovery_inputs.json`` (or ``--inputs FILE``): seconds, where it came
from, measured here or quoted. A path whose figure is ``null`` ("not measured yet") prints "not
measured"; no figure is ever made up. The recovery times were measured on 2-3 nodes and are not
scaled with the job: at 16k GPUs a restart's rendezvous and scheduling take longer, so the
projected ETTRs are upper bounds for every strategy alike.

    python -m bench.ettr_projection [--inputs FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

INPUTS = Path(__file__).with_name("recovery_inputs.json")
REFERENCE_GPUS = 16_384
SCALES = (1_024, 16_384, 100_000)
INTERVALS_MINUTES = (1, 5, 15, 30, 60)
KINDS = ("measured", "quoted")
SOURCE = "Llama 3 paper (arXiv 2407.21783), Table 5"


class Blame(StrEnum):
    """What an interruption needs: a node replaced, or a restart in place (after a hang surfaced or not)."""

    NODE = "node"
    NONE = "none"
    HANG = "hang"


@dataclass(frozen=True)
class Category:
    name: str
    count: int
    blame: Blame


TRACE: tuple[Category, ...] = (
    Category("faulty GPU", 148, Blame.NODE),
    Category("GPU HBM3 memory", 72, Blame.NODE),
    Category("software bug", 54, Blame.NONE),
    Category("network switch/cable", 35, Blame.NONE),
    Category("host maintenance", 32, Blame.NODE),
    Category("GPU SRAM memory", 19, Blame.NODE),
    Category("GPU system processor", 17, Blame.NODE),
    Category("NIC", 7, Blame.NODE),
    Category("NCCL watchdog timeout", 7, Blame.HANG),
    Category("silent data corruption", 6, Blame.NODE),
    Category("GPU thermal interface/sensor", 6, Blame.NODE),
    Category("SSD", 3, Blame.NODE),
    Category("power supply", 3, Blame.NODE),
    Category("server chassis", 2, Blame.NODE),
    Category("IO expansion board", 2, Blame.NODE),
    Category("dependency", 2, Blame.NONE),
    Category("CPU", 2, Blame.NODE),
    Category("system memory", 2, Blame.NODE),
)


@dataclass(frozen=True)
class RecoveryPath:
    """One way back to training: the inputs whose sum is fault → every rank stepping again, state restored."""

    name: str
    keys: tuple[str, ...]


IN_PLACE = RecoveryPath("in-place restart", ("kcover_in_place_restart", "kcover_memory_restore"))
STANDBY = RecoveryPath("warm standby (lost rank from disk)", ("kcover_standby_restart", "torch_load_restore"))
RECREATE = RecoveryPath("pod recreation excluding the node", ("kcover_pod_recreation_restart", "torch_load_restore"))
KCOVER_RUN = RecoveryPath("kcover run restart",
                          ("kcover_run_restart", "process_start_to_first_step", "kcover_memory_restore"))
KCOVER_RUN_SPARE = RecoveryPath("kcover run restart on a spare node",
                                ("kcover_run_restart", "process_start_to_first_step", "torch_load_restore"))
TORCHRUN = RecoveryPath("torchrun restart", ("torchrun_restart", "process_start_to_first_step", "torch_load_restore"))
MANUAL = RecoveryPath("manual restart excluding the node", ("manual_restart", "torch_load_restore"))

KCOVER_HANG = ("kcover_hang_timeout", "kcover_hang_detection_lag")


@dataclass(frozen=True)
class Strategy:
    """How a job is recovered: one path for faults that blame no node, one for node faults."""

    name: str
    in_place: RecoveryPath
    node: RecoveryPath
    hang: tuple[str, ...]
    save: str


STRATEGIES: tuple[Strategy, ...] = (
    Strategy("in-place+standby", IN_PLACE, STANDBY, KCOVER_HANG, "kcover_save_blocking"),
    Strategy("in-place", IN_PLACE, RECREATE, KCOVER_HANG, "kcover_save_blocking"),
    Strategy("recreate", RECREATE, RECREATE, KCOVER_HANG, "kcover_save_blocking"),
    Strategy("kcover run", KCOVER_RUN, KCOVER_RUN_SPARE, KCOVER_HANG, "kcover_save_blocking"),
    Strategy("torchrun", TORCHRUN, MANUAL, ("nccl_timeout",), "torch_save_blocking"),
    Strategy("manual", MANUAL, MANUAL, ("nccl_timeout",), "torch_save_blocking"),
)

RATE_KEY = "interruption_interval_16k"
STEP_KEY = "step_time"
POSITIVE = frozenset({RATE_KEY, STEP_KEY})
NULLABLE = frozenset({"kcover_in_place_restart", "kcover_standby_restart", "kcover_pod_recreation_restart",
                      "kcover_run_restart", "torchrun_restart", "manual_restart"})


# Every input, in the order they are listed: the trace, the restarts, hang detection, checkpoint save and restore.
INPUT_KEYS = (
    RATE_KEY, STEP_KEY, "kcover_in_place_restart", "kcover_standby_restart", "kcover_pod_recreation_restart",
    "kcover_run_restart", "torchrun_restart", "process_start_to_first_step", "manual_restart", "kcover_hang_timeout",
    "kcover_hang_detection_lag", "nccl_timeout", "torch_save_blocking", "kcover_save_blocking", "torch_load_restore",
    "kcover_memory_restore",
)


def strategy_keys() -> set[str]:
    """The inputs the strategies read (a test checks that each is one of INPUT_KEYS)."""
    return {key for s in STRATEGIES for key in (*s.in_place.keys, *s.node.keys, *s.hang, s.save)}


@dataclass(frozen=True)
class Input:
    value: float | None
    kind: str
    source: str


class InputError(Exception):
    """An inputs file that cannot be used; the message names the file and the key."""


def load_inputs(path: Path) -> dict[str, Input]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read it ({error})") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(document, dict):
        raise InputError(f"{path}: must hold one JSON object of inputs")
    return {key: check_entry(path, key, document.get(key)) for key in INPUT_KEYS}


def check_entry(path: Path, key: str, entry: object) -> Input:
    if entry is None:
        raise InputError(f"{path}: input '{key}' is missing")
    if not isinstance(entry, dict) or "value" not in entry:
        raise InputError(f"{path}: input '{key}' must be an object with value, kind and source")
    kind, source = entry.get("kind"), entry.get("source")
    if kind not in KINDS:
        raise InputError(f"{path}: input '{key}' kind must be 'measured' or 'quoted' (got {kind!r})")
    if not isinstance(source, str) or not source.strip():
        raise InputError(f"{path}: input '{key}' needs a source (got {source!r})")
    return Input(check_value(path, key, entry["value"]), kind, source)


def check_value(path: Path, key: str, value: object) -> float | None:
    if value is None and key in NULLABLE:
        return None
    least = "greater than 0" if key in POSITIVE else "at least 0"
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) \
            or value < 0 or (key in POSITIVE and value == 0):
        allowed = f"a number of seconds {least}" + (" or null (not measured)" if key in NULLABLE else "")
        raise InputError(f"{path}: input '{key}' must be {allowed} (got {json.dumps(value)})")
    return float(value)


def loss(keys: Sequence[str], values: Mapping[str, float | None]) -> float | None:
    """Sum of the inputs ``keys``; None when one of them is not measured."""
    parts = [values[key] for key in keys]
    return None if any(part is None for part in parts) else sum(part for part in parts if part is not None)


def recovery_seconds(strategy: Strategy, blame: Blame, values: Mapping[str, float | None]) -> float | None:
    """Seconds from the fault to every rank stepping again with its state restored."""
    path = strategy.node if blame is Blame.NODE else strategy.in_place
    keys = (*strategy.hang, *path.keys) if blame is Blame.HANG else path.keys
    return loss(keys, values)


def ettr(strategy: Strategy, values: Mapping[str, float | None], gpus: int, compute: float,
         trace: Sequence[Category] = TRACE) -> float | None:
    """Expected ETTR of a job of ``gpus`` GPUs saving a checkpoint after every ``compute`` seconds of training."""
    save = values[strategy.save]
    interval = values[RATE_KEY]
    if save is None or interval is None:
        return None
    cycle = compute + save
    total = sum(category.count for category in trace)
    lost = 0.0
    for category in trace:
        seconds = recovery_seconds(strategy, category.blame, values)
        if seconds is None:
            return None
        lost += category.count / total * (seconds + cycle / 2)
    rate = gpus / REFERENCE_GPUS / interval
    return min(1.0, max(0.0, (1 - rate * lost) * compute / cycle))


def intervals(step: float) -> list[tuple[str, float]]:
    return [(f"1 step ({step:g} s)", step)] + [(f"{minutes} min", minutes * 60.0) for minutes in INTERVALS_MINUTES]


def input_lines(inputs: Mapping[str, Input], path: Path) -> list[str]:
    lines = [f"Inputs ({path}), seconds:"]
    width = max(map(len, inputs))
    for key, entry in inputs.items():
        value = "not measured" if entry.value is None else f"{entry.value:g}"
        lines.append(f"  {key:<{width}}  {value:>12}  {entry.kind:<8}  {entry.source}")
    return lines


def trace_lines() -> list[str]:
    total = sum(category.count for category in TRACE)
    lines = [f"Interruption mix ({SOURCE}; 419 unexpected interruptions in 54 days, 16,384 H100 GPUs; shares"
             " from the counts, the paper prints 30.1% for faulty GPU's 148):"]
    for category in TRACE:
        lines.append(f"  {category.name:<29} {category.count:>4}  {category.count / total:6.1%}  "
                     f"{'node replaced' if category.blame is Blame.NODE else 'restart in place'}"
                     f"{' (a hang: detected after the hang timeout)' if category.blame is Blame.HANG else ''}")
    return lines


def strategy_lines() -> list[str]:
    lines = ["Strategies (faults that blame no node / faults that blame a node; hang detection; checkpoint save):"]
    for strategy in STRATEGIES:
        lines.append(f"  {strategy.name:<17} {strategy.in_place.name} / {strategy.node.name}; "
                     f"{' + '.join(strategy.hang)}; {strategy.save}")
    return lines


def table_lines(inputs: Mapping[str, Input]) -> list[str]:
    values = {key: entry.value for key, entry in inputs.items()}
    step, interval = values[STEP_KEY], values[RATE_KEY]
    assert step is not None and interval is not None  # never null: check_value refuses it
    header = f"{'GPUs':>7}  {'checkpoint every':<16}" + "".join(f"  {s.name:>16}" for s in STRATEGIES)
    lines = ["ETTR (productive time / wall time):", header, "-" * len(header)]
    for gpus in SCALES:
        every = interval * REFERENCE_GPUS / gpus / 3600
        lines.append(f"{gpus:>7,}  one interruption every {every:.2f} h")
        for label, compute in intervals(step):
            cells = [ettr(strategy, values, gpus, compute) for strategy in STRATEGIES]
            lines.append(f"{'':>7}  {label:<16}" + "".join(
                f"  {'not measured' if cell is None else f'{cell:.3f}':>16}" for cell in cells))
    return lines


CAVEATS = (
    "Recovery times were measured on 2-3 nodes and are not scaled with the job: at scale they are lower bounds, so"
    " every ETTR above is an upper bound.",
    "First-order model (as Meta's and the landscape notes' ETTR ≈ 1 - (R + W/2)/MTTF): where the loss per"
    " interruption nears the time between interruptions (100k GPUs, 30-60 min) the real ETTR is lower still.",
    "A checkpoint every step assumes kcover's background persist of the 2.15 GB state keeps up with the step;"
    " a save that finds the previous persist still running is skipped, which lengthens the interval.",
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=Path, default=INPUTS, help="JSON file of inputs (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        inputs = load_inputs(args.inputs)
    except InputError as error:
        print(f"bench.ettr_projection: {error}", file=sys.stderr)
        return 2
    lines = [*input_lines(inputs, args.inputs), "", *trace_lines(), "", *strategy_lines(), "", *table_lines(inputs),
             "", *CAVEATS]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
