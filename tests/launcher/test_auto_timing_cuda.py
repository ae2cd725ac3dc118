"""The CUDA side of kcover's DDP step timer, driven by a stand-in for ``torch.cuda`` events.

There is no GPU on these machines, so the real events cannot exist here; the stand-in keeps their contract
(``record``, ``query``: complete or not yet, ``elapsed_time`` in milliseconds) and the timer's logic around them
is what is tested: only the parameter whose gradient came last the step before records the end event, a step
whose order changed is not timed, events not complete yet wait (in order) without blocking, at most 8 wait,
and a nonsensical elapsed time is never sent.  The CPU side runs for real in ``test_auto_timing.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from kcover.launcher.workers import load_auto_timing


class Clock:
    """The GPU's time (ms) and which recorded events it has reached."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reached = 0.0
        self.recorded = 0


class Event:
    def __init__(self, clock: Clock, enable_timing: bool) -> None:
        assert enable_timing
        self.clock: Clock = clock
        self.at: float | None = None

    def record(self, stream: str) -> None:
        assert stream == "stream of cuda:3"  # the model's own device, not the current one
        self.at = self.clock.now
        self.clock.recorded += 1

    def query(self) -> bool:
        return self.at is not None and self.at <= self.clock.reached

    def elapsed_time(self, end: Event) -> float:
        assert self.at is not None and end.at is not None and self.query() and end.query()
        return end.at - self.at


@pytest.fixture
def pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    read, write = os.pipe()
    os.set_blocking(read, False)
    monkeypatch.setenv("KCOVER_PROGRESS_FD", str(write))
    yield read
    os.close(read)
    os.close(write)


def said(read: int) -> list[tuple[int, float]]:
    try:
        data = os.read(read, 65536).decode()
    except BlockingIOError:
        return []
    return [(int(step), float(seconds)) for _, step, seconds in (line.split() for line in data.splitlines())]


class Model:
    """What the timer reads of a DDP model on CUDA."""

    device_type = "cuda"
    device_ids = ("cuda:3",)
    training = True
    require_backward_grad_sync = True


def make(clock: Clock) -> tuple[Any, Model]:
    torch = SimpleNamespace(is_grad_enabled=lambda: True,
                            cuda=SimpleNamespace(Event=lambda enable_timing: Event(clock, enable_timing),
                                                 current_stream=lambda device: f"stream of {device}"))
    module = Model()
    return load_auto_timing().StepTimer(module, torch), module


def step(timer: Any, clock: Clock, order: list[int], compute_ms: float) -> None:
    """One step on the GPU's clock: the forward begins, ``compute_ms`` later the gradients in ``order``."""
    timer.forward_began(timer.module(), None)
    clock.now += compute_ms
    for index in order:
        timer.gradient_ready(index)
    clock.now += 5  # the all-reduce, the optimizer


def test_the_gpus_own_compute_time_is_sent_one_step_late_once_the_last_gradient_is_known(pipe: int) -> None:
    clock = Clock()
    timer, _model = make(clock)  # kept: the timer holds it weakly
    step(timer, clock, [2, 1, 0], 40)  # the last gradient is not known yet: untimed
    clock.reached = clock.now
    step(timer, clock, [2, 1, 0], 40)
    recorded = clock.recorded
    clock.reached = clock.now
    step(timer, clock, [2, 1, 0], 60)
    assert clock.recorded == recorded + 2  # one begin, one end: not an event per gradient
    clock.reached = clock.now
    timer.forward_began(timer.module(), None)
    assert said(pipe) == [(1, 0.04), (2, 0.06)]


def test_a_step_whose_gradients_came_in_another_order_is_not_timed(pipe: int) -> None:
    clock = Clock()
    timer, _model = make(clock)  # kept: the timer holds it weakly
    for order in ([2, 1, 0], [2, 1, 0], [2, 0, 1], [2, 0, 1], [2, 0, 1]):
        step(timer, clock, order, 40)
        clock.reached = clock.now
    timer.forward_began(timer.module(), None)
    assert [number for number, _ in said(pipe)] == [1, 3, 4]


def test_events_the_gpu_has_not_reached_wait_in_order_and_at_most_eight_of_them(pipe: int) -> None:
    clock = Clock()
    timer, _model = make(clock)  # kept: the timer holds it weakly
    for _ in range(4):
        step(timer, clock, [1, 0], 40)
    assert said(pipe) == []  # nothing reached yet, nothing blocked on
    clock.reached = clock.now
    for _ in range(12):
        step(timer, clock, [1, 0], 40)
    clock.reached = clock.now
    timer.forward_began(timer.module(), None)
    numbers = [number for number, _ in said(pipe)]
    assert numbers == [1, 2, 3, *range(8, 16)]  # of steps 4-15, 8 waited at most: the oldest were dropped


def test_micro_batches_and_nonsense_times_are_not_steps(pipe: int) -> None:
    clock = Clock()
    timer, module = make(clock)
    step(timer, clock, [1, 0], 40)  # step 0: the last gradient is not known yet
    module.require_backward_grad_sync = False  # step 1's first micro-batch, under no_sync: the step goes on
    step(timer, clock, [1, 0], 40)
    module.require_backward_grad_sync = True
    timer.forward_began(module, None)  # its second micro-batch
    clock.now -= 1000  # a clock that went backwards: a negative time
    timer.gradient_ready(1)
    timer.gradient_ready(0)
    clock.reached = 10**9
    step(timer, clock, [1, 0], 30)  # step 2
    clock.reached = 10**9
    timer.forward_began(module, None)
    assert said(pipe) == [(2, 0.03)]  # step 0 untimed, step 1 went backwards: not sent


def test_an_event_that_cannot_be_recorded_turns_the_timer_off_and_never_reaches_the_training(pipe: int) -> None:
    """As ``record`` does while a CUDA graph is being captured: the hooks return, the timer stays off."""
    clock = Clock()
    timer, _model = make(clock)  # kept: the timer holds it weakly
    step(timer, clock, [1, 0], 40)
    step(timer, clock, [1, 0], 40)

    def refuse(self: Event) -> None:
        raise RuntimeError("operation not permitted when stream is capturing")

    original = Event.record
    Event.record = refuse  # type: ignore[method-assign]
    try:
        step(timer, clock, [1, 0], 40)  # raises nothing
    finally:
        Event.record = original  # type: ignore[method-assign]
    clock.reached = clock.now
    step(timer, clock, [1, 0], 40)
    timer.forward_began(timer.module(), None)
    assert timer.off and said(pipe) == []
