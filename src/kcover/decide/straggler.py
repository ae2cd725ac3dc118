"""Which rank is slow while the job runs: the pure straggler detector.

Every rank of a synchronous job waits for the slowest in each collective, so
waiting time shows nothing; compute time does.  :class:`StragglerDetector`
takes each rank's compute seconds per step (:meth:`~StragglerDetector.observe`)
and says which ranks are stragglers (:meth:`~StragglerDetector.stragglers`).
No I/O, no clock: the launcher feeds it as timings arrive, tests feed it
synthetic series.

The statistics, all in log time so that a factor is a difference:

1. Per step, each rank is compared with the **median of its peers** (the other
   ranks of that step): ``y = log t - median(log t of the others)``.  A step the
   whole job finds slow (a longer batch, a shared-filesystem pause) cancels out.
2. Each rank first learns **its own baseline**: the median of its first
   ``warmup`` values of ``y``.  Ranks uneven by design — rank 0 logging or
   evaluating every 10th step, the last pipeline stage, variable sequence
   lengths — are judged against themselves, not against their peers.  (The
   flip side: a rank slow from the very first step is learned as normal; the
   pairwise preflight test finds such nodes before training.)
3. The **noise** is learned in the same warm-up: the spread (MAD) of every
   rank's ``y`` around its baseline.
4. A rank's **score** is the median of ``y - baseline`` over its last
   ``window`` steps: one slow step in a window moves no median, a slowdown that
   holds for more than half the window does.  The rank is a straggler when its
   score stays above ``max(log(1 + min_slowdown), z × SE)`` for ``confirm``
   steps in a row, where SE is the standard error of a window median less a
   warm-up median, ``1.25 × noise × sqrt(1/window + 1/warmup)``; its slowdown is
   ``exp(score)``.

Bad timings (``nan``, infinities, zero or negative seconds, a step number far
beyond the newest, a step already judged) are dropped and counted; a step
with fewer than two valid ranks says nothing (one rank has no peers); a rank
that stopped reporting is judged only on steps it reported within the last
``window`` steps seen, so it is neither flagged from old data nor held
against the others.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

MAD_TO_SIGMA = 1.4826
"""Scales a median absolute deviation to the standard deviation of normal noise."""
MEDIAN_SE = 1.2533
"""The standard error of a median of n normal samples is about 1.2533 σ / √n."""
NOISE_FLOOR = 0.002
"""Smallest noise assumed (log units): a perfectly quiet warm-up must not make the threshold zero."""


@dataclass(frozen=True)
class StragglerConfig:
    """The detector's knobs; the defaults flag a 20% slowdown within about 12 steps at 5% step-time noise."""

    min_slowdown: float = 0.08
    """Never flag a rank less than this much slower than its own baseline (0.08 = 8%)."""
    warmup: int = 30
    """Steps (with peers) each rank needs before it is judged: its baseline and the noise come from them."""
    window: int = 16
    """Recent steps whose median is the score."""
    z: float = 5.0
    """How many standard errors of the score (window median less baseline median) count as slow."""
    confirm: int = 3
    """Steps in a row the score must stay above the threshold."""
    lag: int = 2
    """A step is judged once a step this much newer arrived, even if some rank never reported it."""
    max_jump: int = 100_000
    """A step this far beyond the newest one is refused: one bogus step number must not make every later
    timing look late."""


@dataclass(frozen=True)
class Straggler:
    """A rank judged slow: by how much (``slowdown``, 1.3 = 30% slower than its baseline) and since which step."""

    rank: int
    slowdown: float
    since_step: int
    score_steps: int


@dataclass
class _Rank:
    baseline_values: list[float] = field(default_factory=list)
    baseline: float | None = None
    recent: deque[tuple[int, float]] = field(default_factory=deque)
    above: int = 0
    flagged_since: int | None = None


class StragglerDetector:
    """Per-rank compute times in, stragglers out (see the module docstring for the statistics)."""

    def __init__(self, config: StragglerConfig | None = None) -> None:
        self.config = config or StragglerConfig()
        self.pending: dict[int, dict[int, float]] = {}
        self.ranks: dict[int, _Rank] = {}
        self.newest = -1
        self.judged = -1
        self.dropped = 0
        """Timings refused: not a positive finite number of seconds, or for a step already judged."""
        self.expected = 0
        """Ranks a step needs to be complete, when the caller knows (else: every rank seen so far)."""
        self._warm_residuals: list[float] = []
        self._noise: float | None = None
        self._noise_stale = False

    def observe(self, rank: int, step: int, seconds: float) -> None:
        """One rank's compute time of one step; bad values are counted in ``dropped`` and ignored."""
        valid = isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0
        jumped = self.newest >= 0 and step > self.newest + self.config.max_jump
        if not valid or step <= self.judged or jumped:
            self.dropped += 1
            return
        self.pending.setdefault(step, {})[rank] = float(seconds)
        self.newest = max(self.newest, step)
        self._judge_ready()

    def expect(self, ranks: int) -> None:
        """How many ranks report each step: a step is judged as soon as all have (without it the first steps
        wait ``lag`` newer steps, since no rank is known yet)."""
        self.expected = max(0, ranks)

    def stragglers(self) -> list[Straggler]:
        """The ranks flagged now, slowest first."""
        found = []
        for rank, state in self.ranks.items():
            if state.flagged_since is None or not self._fresh(state):
                continue
            score = _median([value for _, value in state.recent])
            found.append(Straggler(rank, math.exp(score), state.flagged_since, len(state.recent)))
        return sorted(found, key=lambda s: (-s.slowdown, s.rank))

    @property
    def noise(self) -> float | None:
        """The step-to-step spread of a rank's time relative to its peers (log units, σ); learned in warm-up."""
        if self._noise_stale:
            deviations = [abs(r) for r in self._warm_residuals]
            self._noise = max(NOISE_FLOOR, MAD_TO_SIGMA * _median(deviations))
            self._noise_stale = False
        return self._noise

    @property
    def threshold(self) -> float | None:
        """The score (log units) above which a rank is slow; ``None`` until the noise is learned."""
        noise = self.noise
        if noise is None:
            return None
        config = self.config
        error = MEDIAN_SE * noise * math.sqrt(1 / config.window + 1 / config.warmup)
        return max(math.log1p(config.min_slowdown), config.z * error)

    def _fresh(self, state: _Rank) -> bool:
        return bool(state.recent) and state.recent[-1][0] > self.newest - self.config.window

    def _judge_ready(self) -> None:
        expected = max(len(self.ranks), self.expected)
        for step in sorted(self.pending):
            times = self.pending[step]
            complete = expected > 1 and len(times) >= expected
            if not complete and step > self.newest - self.config.lag:
                break
            del self.pending[step]
            self.judged = step
            self._judge(step, times)

    def _judge(self, step: int, times: dict[int, float]) -> None:
        for rank in times:
            self.ranks.setdefault(rank, _Rank())
        if len(times) < 2:
            return
        for rank, value in _relative(times).items():
            self._add(rank, step, value)

    def _add(self, rank: int, step: int, value: float) -> None:
        state = self.ranks[rank]
        config = self.config
        if state.baseline is None:
            state.baseline_values.append(value)
            if len(state.baseline_values) >= config.warmup:
                state.baseline = _median(state.baseline_values)
                self._warm_residuals.extend(v - state.baseline for v in state.baseline_values)
                self._noise_stale = True
            return
        state.recent.append((step, value - state.baseline))
        while state.recent and (len(state.recent) > config.window or state.recent[0][0] <= step - config.window):
            state.recent.popleft()
        self._update_flag(state, step)

    def _update_flag(self, state: _Rank, step: int) -> None:
        threshold = self.threshold
        if threshold is None or len(state.recent) < self.config.window // 2 + 1:
            return
        score = _median([value for _, value in state.recent])
        if score > threshold:
            state.above += 1
            if state.above >= self.config.confirm and state.flagged_since is None:
                state.flagged_since = step
        elif score < threshold / 2:  # hysteresis: a flagged rank is cleared only well below the threshold
            state.above = 0
            state.flagged_since = None
        else:
            state.above = 0


def _relative(times: dict[int, float]) -> dict[int, float]:
    """Each rank's log time minus the median log time of the other ranks of the same step."""
    logs = {rank: math.log(seconds) for rank, seconds in times.items()}
    ordered = sorted(logs.values())
    return {rank: value - _median_without(ordered, value) for rank, value in logs.items()}


def _median_without(ordered: list[float], value: float) -> float:
    """The median of ``ordered`` (sorted) with one occurrence of ``value`` left out."""
    index = bisect.bisect_left(ordered, value)
    size = len(ordered) - 1

    def at(position: int) -> float:
        return ordered[position if position < index else position + 1]

    middle = size // 2
    return at(middle) if size % 2 else (at(middle - 1) + at(middle)) / 2


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
