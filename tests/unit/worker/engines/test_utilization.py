"""BusyMeter: busy share of wall time between reads, with a fake clock."""

from __future__ import annotations

from worker.engines.utilization import BusyMeter, gpu_counter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_fraction_is_busy_time_over_the_window_since_the_last_read() -> None:
    clock = Clock()
    meter = BusyMeter(clock)
    clock.now = 1.0
    with meter.busy():
        clock.now = 4.0
    clock.now = 10.0
    assert meter.fraction() == 0.3
    clock.now = 20.0
    assert meter.fraction() == 0.0


def test_a_running_batch_counts_in_every_window_it_spans() -> None:
    clock = Clock()
    meter = BusyMeter(clock)
    with meter.busy():
        clock.now = 2.0
        assert meter.fraction() == 1.0
        clock.now = 3.0
    clock.now = 4.0
    assert meter.fraction() == 0.5


def test_no_elapsed_time_reads_idle() -> None:
    assert BusyMeter(Clock()).fraction() == 0.0


def test_gpu_counter_is_absent_without_a_readable_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        assert gpu_counter() is None
    else:
        counter = gpu_counter()
        assert counter is None or 0.0 <= counter() <= 1.0
