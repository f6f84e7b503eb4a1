"""CachedBackend.lookahead: a batch's cache keys and misses found in bulk before dispatch
(fill_matrix), with the same replies, calls and hits as one lookup per call."""

from __future__ import annotations

import threading

import diskcache
import pytest

from hdeval.backends.base import CompletionRequest, Message
from hdeval.backends.fake import FakeBackend
from hdeval.cache import CachedBackend
from hdeval.judge import Cell, fill_matrix


def _req(text: str) -> CompletionRequest:
    return CompletionRequest((Message("user", text),), kind="score")


@pytest.fixture
def store_gets(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every key read from the store, one entry per single lookup."""
    real = diskcache.Cache.get
    seen: list[str] = []

    def get(self, key, *a, **kw):
        seen.append(key)
        return real(self, key, *a, **kw)

    monkeypatch.setattr(diskcache.Cache, "get", get)
    return seen


def test_stored_keys_agrees_with_single_lookups_across_chunks(tmp_path) -> None:
    cb = CachedBackend(FakeBackend(), tmp_path / "cache")
    cb.LOOKUP_CHUNK = 7  # several queries, one of them partial
    for i in range(0, 40, 3):
        cb.complete(_req(f"q{i}"))
    cb.flush()
    keys = [cb.key(_req(f"q{i}")) for i in range(40)] + ["0" * 64]
    single = {k for k in keys if cb.store.get(k) is not None}
    assert len(single) == 14
    assert cb.stored_keys(keys + keys[:5]) == single  # duplicates asked twice: same answer
    assert cb.stored_keys([]) == set()
    cb.close()


def test_a_fill_with_lookahead_reads_no_entry_alone(tmp_path, store_gets) -> None:
    cb = CachedBackend(FakeBackend(), tmp_path / "cache")
    for i in range(10):
        cb.complete(_req(f"sample {i}"))  # 10 of the 30 distinct requests are on disk
    cb.flush()
    store_gets.clear()
    texts = [f"sample {i % 10}" for i in range(20)] + [f"sample {i}" for i in range(10, 30)]
    cells = [Cell(f"s{i}", "c", (_req(t),)) for i, t in enumerate(texts)]  # on disk: twice; new: once
    matrix = fill_matrix(cb, cells, lambda got: (float(got[0].text), None), concurrency=4)
    assert cb.stats.calls == 10 + 20 and cb.stats.hits == 20
    # no single lookup: the 20 found missing by lookahead's bulk query are not asked again,
    # and the 10 entries on disk (20 cells) are read in bulk by run_requests (lookup_many)
    assert store_gets == []
    assert not cb._keys and not cb._absent  # nothing left behind after the fill
    plain = CachedBackend(FakeBackend(), tmp_path / "other")
    expected = fill_matrix(plain, cells, lambda got: (float(got[0].text), None), concurrency=4)
    assert (matrix.values == expected.values).all()
    cb.close()
    plain.close()


def test_a_reply_saved_during_the_lookahead_is_not_paid_for_again(tmp_path) -> None:
    fake = FakeBackend()
    cb = CachedBackend(fake, tmp_path / "cache")
    r = _req("asked twice, one after the other")
    with cb.lookahead([r, r]):
        first = cb.complete(r)
        cb.flush()  # committed: it is no longer served from memory, only from disk
        second = cb.complete(r)
    assert fake.calls == 1
    assert second.cached and second.text == first.text
    cb.close()


def test_lookahead_without_a_store_or_with_unhashable_requests_changes_nothing(tmp_path) -> None:
    fake = FakeBackend()
    cb = CachedBackend(fake, None)
    with cb.lookahead([_req("a")]):
        cb.complete(_req("a"))
    assert fake.calls == 1
    cached = CachedBackend(fake, tmp_path / "cache")
    odd = CompletionRequest([Message("user", "a list, not a tuple")], kind="score")  # type: ignore[arg-type]
    with cached.lookahead([odd]):
        assert cached.complete(odd).text
    assert fake.calls == 2
    cached.close()


@pytest.mark.parametrize("when", ["queued before the bulk query", "saved during it"])
def test_a_reply_committed_while_the_store_is_asked_in_bulk_is_not_paid_twice(
        tmp_path, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """A reply lands on disk (and leaves memory) between the bulk query and the registration
    of its answer: its key must not be taken for a missing one."""
    fake = FakeBackend()
    r = _req("answered meanwhile")
    held = threading.Event()
    real_set = diskcache.Cache.set

    def set_(store, *a, **kw):  # a commit waits until the bulk query has answered
        held.wait(10)
        return real_set(store, *a, **kw)

    monkeypatch.setattr(diskcache.Cache, "set", set_)

    class Racing(CachedBackend):
        def stored_keys(self, keys):
            found = super().stored_keys(keys)  # the store's answer, before the reply lands
            if when == "saved during it":
                other = threading.Thread(target=self.complete, args=(r,))
                other.start()
                other.join(10)
            held.set()
            self.flush()  # committed: no longer served from memory
            return found

    cb = Racing(fake, tmp_path / "cache")
    if when == "queued before the bulk query":
        cb.complete(r)  # paid and queued, not on disk yet
    with cb.lookahead([r]):
        again = cb.complete(r)
    assert fake.calls == 1 and again.cached
    cb.close()
