"""hdeval.runner.map_concurrent: input order, the first error raised, nothing new started
after it, and the calls already running allowed to finish (so what they paid for is kept)."""

from __future__ import annotations

import threading

import pytest

from hdeval.runner import map_concurrent


def test_results_come_back_in_input_order_from_many_threads() -> None:
    seen_threads: set[str] = set()

    def square(x: int) -> int:
        seen_threads.add(threading.current_thread().name)
        return x * x

    assert map_concurrent(square, list(range(500)), 8) == [x * x for x in range(500)]
    assert map_concurrent(square, [], 8) == [] and map_concurrent(square, [3], 8) == [9]
    with pytest.raises(ValueError, match="at least 1"):
        map_concurrent(square, [1], 0)


def test_an_error_stops_new_work_and_lets_running_calls_finish() -> None:
    started: list[int] = []
    finished: list[int] = []
    failing = threading.Event()
    lock = threading.Lock()

    def call(i: int) -> int:
        with lock:
            started.append(i)
        if i == 0:  # a slow call that is running when item 1 fails
            assert failing.wait(10)
        if i == 1:
            failing.set()
            raise RuntimeError("item 1 failed")
        with lock:
            finished.append(i)
        return i

    with pytest.raises(RuntimeError, match="item 1 failed"):
        map_concurrent(call, list(range(200)), 2)
    assert 0 in finished  # the running call was waited for, not abandoned
    assert len(started) < 200  # the rest was never started


def test_the_error_of_the_earliest_failed_item_is_raised() -> None:
    both_failing = threading.Barrier(2)

    def call(i: int) -> int:
        if i in (0, 1):
            both_failing.wait(10)  # both fail, the later one (1) possibly first
            raise ValueError(f"item {i}")
        return i

    with pytest.raises(ValueError, match="item 0"):
        map_concurrent(call, [0, 1, 2, 3], 2)


def test_ctrl_c_in_a_call_is_raised_in_the_caller() -> None:
    def call(i: int) -> int:
        if i == 3:
            raise KeyboardInterrupt
        return i

    with pytest.raises(KeyboardInterrupt):
        map_concurrent(call, list(range(10)), 4)


def test_an_interrupt_while_waiting_lets_every_running_call_finish() -> None:
    """SIGTERM/Ctrl-C reach the calling thread while it waits: every call already running
    must be finished (so its reply is cached) before the interrupt leaves map_concurrent.
    Waiting with Thread.join() lost one: on Python 3.11 an interrupted join() marks the thread
    it waited for as stopped while it still runs (bpo-45274), so it was never waited for."""
    import signal
    import time

    class Interrupt(KeyboardInterrupt):
        pass

    def raise_interrupt(signum, frame):
        raise Interrupt()

    both = threading.Barrier(3)
    release = threading.Event()
    finished: list[str] = []

    def call(x: int) -> int:
        both.wait(5)
        release.wait(5)
        if threading.current_thread().name == "hdeval_0":  # the thread main waits for first
            time.sleep(0.5)
        finished.append(threading.current_thread().name)
        return x

    def interrupter() -> None:
        both.wait(5)
        time.sleep(0.2)  # the main thread is waiting by now
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        time.sleep(0.1)
        release.set()

    previous = signal.signal(signal.SIGUSR1, raise_interrupt)
    helper = threading.Thread(target=interrupter)
    helper.start()
    try:
        with pytest.raises(Interrupt):
            map_concurrent(call, [0, 1], 2)
        assert sorted(finished) == ["hdeval_0", "hdeval_1"]  # both calls ended before the raise
    finally:
        signal.signal(signal.SIGUSR1, previous)
        release.set()
        helper.join()
