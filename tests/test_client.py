"""The one LLM client (``CachedBackend.complete_many``): input order, identical requests paid
once, the first error raised while the calls already running finish and are cached, an
interrupt of the caller waits for them too, and a request that kept failing while others
succeed is that request's failure, not the run's."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from conftest import cache_entries

from hdeval.core.errors import BackendError, RequestRejected, RetriesExhausted
from hdeval.llm.backends.base import Completion, CompletionRequest, Message
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.cache.client import CachedBackend, request_key


def _req(text: str) -> CompletionRequest:
    return CompletionRequest((Message("user", text),), kind="score")


class Scripted(FakeBackend):
    """The fake LLM, with a hook run before each answer."""

    def __init__(self, hook=None) -> None:
        super().__init__()
        self.hook = hook
        self.asked: list[str] = []
        self._guard = threading.Lock()

    def complete(self, request: CompletionRequest) -> Completion:
        text = request.messages[-1].content
        with self._guard:
            self.asked.append(text)
        if self.hook is not None:
            self.hook(text)
        return super().complete(request)


def test_results_in_input_order_and_identical_requests_paid_once(tmp_path) -> None:
    fake = Scripted()
    cb = CachedBackend(fake, tmp_path / "c", concurrency=8)
    reqs = [_req(f"q{i % 150}") for i in range(300)]
    out = cb.complete_many(reqs)
    assert [c.text for c in out] == [FakeBackend().complete(r).text for r in reqs]
    assert cb.stats.calls == 150 and cb.stats.hits == 150 and len(fake.asked) == 150
    assert [c.cached for c in out[:150]] == [False] * 150 and all(c.cached for c in out[150:])
    cb.close()
    assert len(cache_entries(tmp_path / "c")) == 150
    again = CachedBackend(Scripted(lambda t: pytest.fail("asked again")), tmp_path / "c")
    assert all(c.cached for c in again.complete_many(reqs))
    again.close()


def test_a_cached_stage_asks_nothing_and_a_mixed_one_only_the_misses(tmp_path) -> None:
    class Counting:
        done = hits = 0

        def advance(self, n=1, cached=False):
            self.done += n
            self.hits += n if cached else 0

    reqs = [_req(f"q{i}") for i in range(6)]
    first = CachedBackend(FakeBackend(), tmp_path / "c")
    expected = first.complete_many(reqs[:4])
    first.close()
    fake = Scripted()
    cb = CachedBackend(fake, tmp_path / "c")
    progress = Counting()
    out = cb.complete_many(reqs, progress)
    assert [c.text for c in out[:4]] == [c.text for c in expected]
    assert [c.cached for c in out] == [True] * 4 + [False] * 2
    assert fake.asked == ["q4", "q5"] and (progress.done, progress.hits) == (6, 4)
    cb.close()


def test_an_error_stops_new_work_and_lets_running_calls_finish_and_be_cached(tmp_path) -> None:
    slow_started = threading.Event()

    def hook(text: str) -> None:
        if text == "q0":  # running when q1 fails
            slow_started.set()
            time.sleep(0.5)
        if text == "q1":
            assert slow_started.wait(10)
            raise BackendError("q1 failed")

    fake = Scripted(hook)
    cb = CachedBackend(fake, tmp_path / "c", concurrency=2)
    with pytest.raises(BackendError, match="q1 failed"):
        cb.complete_many([_req(f"q{i}") for i in range(200)])
    assert len(fake.asked) < 200  # the rest was never started
    cb.close()
    assert request_key(fake.identity, _req("q0")) in cache_entries(tmp_path / "c")  # waited for, cached


def test_the_error_of_the_earliest_failed_request_is_raised(tmp_path) -> None:
    both = threading.Barrier(2)

    def hook(text: str) -> None:
        if text in ("q0", "q1"):
            both.wait(10)
            if text == "q0":
                time.sleep(0.2)  # the later request fails first
            raise BackendError(f"{text} failed")

    cb = CachedBackend(Scripted(hook), None, concurrency=2)
    with pytest.raises(BackendError, match="q0 failed"):
        cb.complete_many([_req(f"q{i}") for i in range(4)])
    cb.close()


def test_ctrl_c_in_a_call_reaches_the_caller(tmp_path) -> None:
    def hook(text: str) -> None:
        if text == "q3":
            raise KeyboardInterrupt

    cb = CachedBackend(Scripted(hook), tmp_path / "c", concurrency=4)
    with pytest.raises(KeyboardInterrupt):
        cb.complete_many([_req(f"q{i}") for i in range(10)])
    assert cb.complete(_req("q0")).text  # the client still works afterwards
    cb.close()


def test_an_interrupt_of_the_waiting_caller_lets_every_running_call_finish_and_be_cached(tmp_path) -> None:
    """SIGTERM/Ctrl-C reach the calling thread while it waits: every call already running is
    finished and committed before the interrupt leaves complete_many, and nothing new starts."""

    class Interrupt(KeyboardInterrupt):
        pass

    def raise_interrupt(signum, frame):
        raise Interrupt()

    running = threading.Barrier(3)
    release = threading.Event()

    def hook(text: str) -> None:
        if text in ("q0", "q1"):
            running.wait(10)
            release.wait(10)
            time.sleep(0.3)

    def interrupter() -> None:
        running.wait(10)
        time.sleep(0.2)  # the main thread waits by now
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        time.sleep(0.1)
        release.set()

    fake = Scripted(hook)
    cb = CachedBackend(fake, tmp_path / "c", concurrency=2)
    previous = signal.signal(signal.SIGUSR1, raise_interrupt)
    helper = threading.Thread(target=interrupter)
    helper.start()
    try:
        with pytest.raises(Interrupt):
            cb.complete_many([_req(f"q{i}") for i in range(50)])
    finally:
        signal.signal(signal.SIGUSR1, previous)
        release.set()
        helper.join()
    assert sorted(fake.asked) == ["q0", "q1"]  # nothing new started after the interrupt
    cb.close()
    on_disk = cache_entries(tmp_path / "c")
    assert {request_key(fake.identity, _req(t)) for t in ("q0", "q1")} <= set(on_disk)


@pytest.mark.parametrize("many", [False, True])
def test_an_interrupt_stops_a_running_json_chain_before_its_next_re_ask(tmp_path, many: bool) -> None:
    """Ctrl-C while the first reply of an ask_json chain is being fetched: that reply is cached,
    and the chain asks nothing more (it used to go on re-asking until its attempts ran out)."""
    from hdeval.judge.fill import ask_json, ask_json_many

    class Interrupt(KeyboardInterrupt):
        pass

    def raise_interrupt(signum, frame):
        raise Interrupt()

    def hook(text: str) -> None:
        if text == "give json":
            signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
            time.sleep(0.3)  # the interrupt lands while this call runs

    def validate(obj):
        return obj

    fake = Scripted(hook)  # answers a digit: never a JSON object, so every reply is re-asked
    cb = CachedBackend(fake, tmp_path / "c", concurrency=2)
    previous = signal.signal(signal.SIGUSR1, raise_interrupt)
    try:
        with pytest.raises(Interrupt):
            if many:
                ask_json_many(cb, [(_req("give json"), validate, lambda p: f"fix: {p}")])
            else:
                ask_json(cb, _req("give json"), validate, lambda p: f"fix: {p}", attempts=3)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert fake.asked == ["give json"]
    cb.close()
    assert request_key(fake.identity, _req("give json")) in cache_entries(tmp_path / "c")


def test_a_cancelled_joiner_of_a_request_in_flight_does_not_pay_for_it_again(tmp_path) -> None:
    import asyncio

    from hdeval.llm import aio

    gate = threading.Event()
    fake = Scripted(lambda t: gate.wait(10))
    cb = CachedBackend(fake, tmp_path / "c")

    async def scenario():
        owner = asyncio.ensure_future(cb.acomplete(_req("same")))
        await asyncio.sleep(0.1)  # the owner's call is running
        joiner = asyncio.ensure_future(cb.acomplete(_req("same")))
        await asyncio.sleep(0.1)  # the joiner waits for the owner's reply
        joiner.cancel()
        await asyncio.sleep(0.1)
        gate.set()
        got = await owner
        return got, (await asyncio.gather(joiner, return_exceptions=True))[0]

    got, joined = aio.run(scenario())
    assert isinstance(joined, asyncio.CancelledError)
    assert fake.asked == ["same"] and not got.cached
    cb.close()


def test_two_threads_asking_the_same_request_pay_once(tmp_path) -> None:
    gate = threading.Event()
    fake = Scripted(lambda t: gate.wait(10))
    cb = CachedBackend(fake, tmp_path / "c")
    got: list[Completion] = []
    threads = [threading.Thread(target=lambda: got.append(cb.complete(_req("same")))) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(10)
    assert len(fake.asked) == 1 and len(got) == 4
    assert sorted(c.cached for c in got) == [False, True, True, True]
    cb.close()


def test_a_request_that_keeps_failing_while_others_succeed_is_its_cells_failure(tmp_path) -> None:
    """One unlucky request exhausts its retries; the run goes on (it is not cached, so the
    next run asks again); only a streak of such requests stops the run."""
    def hook(text: str) -> None:
        if text in ("q5", "q9"):
            raise RetriesExhausted(f"LLM server kept failing on {text}")

    fake = Scripted(hook)
    cb = CachedBackend(fake, tmp_path / "c", concurrency=1)
    out = cb.complete_many([_req(f"q{i}") for i in range(12)], keep_rejected=True)
    failed = [i for i, c in enumerate(out) if isinstance(c, RequestRejected)]
    assert failed == [5, 9] and "kept failing on q5" in str(out[5])
    assert cb.stats.calls == 10
    cb.close()
    assert len(cache_entries(tmp_path / "c")) == 10

    down = CachedBackend(Scripted(lambda t: (_ for _ in ()).throw(RetriesExhausted("down"))), tmp_path / "d",
                         concurrency=1)
    with pytest.raises(RetriesExhausted):  # nothing succeeds: the server is down, the run stops
        down.complete_many([_req(f"q{i}") for i in range(12)], keep_rejected=True)
    down.close()
