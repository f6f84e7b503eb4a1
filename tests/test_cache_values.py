"""How the cache stores a reply: a compact, compressed value holding every field
scoring reads back; entries of the older format (JSON text) still read, so a rerun on an old
cache pays nothing; a planted compact value is a miss with a warning, read with bounds."""

from __future__ import annotations

import json
import math
import sqlite3
import warnings
import zlib
from pathlib import Path

import diskcache
import pytest
from click.testing import CliRunner
from conftest import cache_entries, write_jsonl

from hdeval.cli import cli
from hdeval.llm.backends.base import Completion, CompletionRequest, Message, TokenLogprob
from hdeval.llm.backends.fake import FakeBackend
from hdeval.llm.cache.check import check_cache
from hdeval.llm.cache.client import CachedBackend, CacheWarning, request_key
from hdeval.llm.cache.codec import _ZDICT, MAX_ENTRY_CHARS, VALUE_MAGIC, VALUE_MAGIC_PACKED, encode_completion
from hdeval.llm.cache.codec import _deflate as _deflated
from hdeval.llm.cache.store import JSONDisk


def _req(text: str) -> CompletionRequest:
    return CompletionRequest((Message("user", text),), kind="score")


def _key(text: str) -> str:
    return request_key(FakeBackend().identity, _req(text))


def _lp(*pairs: tuple[str, float]) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(token=t, logprob=v) for t, v in pairs)


REPLIES = {
    "score": Completion("2", (_lp(("2", -0.44643999682754504), ("1", -1.1604001338148167), ("3", -3.0658131931736072),
                                  ("4", -9.018519722853002), ("5", -18.304559585865732)),),
                        prompt_tokens=757, completion_tokens=1),
    "no-logprobs": Completion("Yes, it does.", None, prompt_tokens=12, completion_tokens=4, prompt_tokens_evaluated=0),
    "evaluated": Completion("4", (_lp(("4", 0.0)),), prompt_tokens=3, completion_tokens=1, prompt_tokens_evaluated=2),
    "unicode": Completion("Très bien 😀 \ud800", (_lp(("Très", -0.1), ("😀", -2.5)), ()), prompt_tokens=0),
    "empty": Completion(""),
}


def _stored_rows(cache: Path) -> list[tuple]:
    con = sqlite3.connect(cache / "cache.db")
    try:
        return con.execute("SELECT mode, filename, value FROM Cache").fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_a_reply_reads_back_exactly_from_its_compact_value(tmp_path: Path, name: str) -> None:
    reply = REPLIES[name]
    class Fixed(FakeBackend):
        def complete(self, request):
            return reply

    cb = CachedBackend(Fixed(), tmp_path / "c")
    assert cb.complete(_req("q")) == reply
    cb.close()
    assert _stored_rows(tmp_path / "c") == []  # in the reply table, not diskcache's rows
    con = sqlite3.connect(tmp_path / "c" / "replies.db")
    (key, value), = con.execute("SELECT key, value FROM reply").fetchall()
    con.close()
    assert key == bytes.fromhex(_key("q")) and value == encode_completion(reply)
    assert value.startswith((VALUE_MAGIC, VALUE_MAGIC_PACKED))
    again = CachedBackend(FakeBackend(), tmp_path / "c")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        got = again.complete(_req("q"))
    assert got.cached and got == reply and got.to_dict() == reply.to_dict()
    assert again.stats.hits == 1
    again.close()


def test_a_one_token_reply_with_five_logprobs_takes_a_quarter_of_its_json(tmp_path: Path) -> None:
    reply = REPLIES["score"]
    old = len(json.dumps(reply.to_dict()))
    new = len(encode_completion(reply))
    assert old > 300 and new <= 100, (old, new)


def test_a_scoring_reply_is_packed_in_60_bytes_and_other_replies_stay_exact() -> None:
    """Five full-precision logprobs: DEFLATE of their digits took ~90 bytes, packed doubles ~54.
    What the packed form does not hold (an unreadable logprob, kept as null) stays in the
    deflated JSON form, and every reply reads back as it was."""
    score = encode_completion(REPLIES["score"])
    assert score.startswith(VALUE_MAGIC_PACKED) and len(score) <= 60, len(score)
    assert len(score) < len(_deflated(REPLIES["score"].to_dict()))
    odd = {
        "null-logprob": {"text": "4", "top_logprobs": [[{"token": "4", "logprob": None}]], "prompt_tokens": 1,
                         "completion_tokens": 1, "prompt_tokens_evaluated": None},
    }
    with _Tmp() as c:
        for name, d in odd.items():
            c.set(name * 4, encode_completion(Completion.from_dict(d)))
            assert json.loads(c[name * 4]) == Completion.from_dict(d).to_dict()
            assert c._sql("SELECT value FROM Cache WHERE key = ?", (name * 4,)).fetchone()[0].startswith(VALUE_MAGIC)
        for name, reply in REPLIES.items():
            c.set(name, encode_completion(reply))
            back = json.loads(c[name])
            assert back == reply.to_dict() and Completion.from_dict(back) == reply


def test_a_nan_logprob_stays_a_recorded_failure() -> None:
    reply = Completion("3", (_lp(("3", float("nan")), ("4", -1.0)),), prompt_tokens=1, completion_tokens=1)
    with _Tmp() as c:
        c.set("k" * 64, encode_completion(reply))
        back = Completion.from_dict(json.loads(c["k" * 64]))
    assert back.top_logprobs is not None and math.isnan(back.top_logprobs[0][0].logprob)
    assert back.top_logprobs[0][1].logprob == -1.0


class _Tmp:
    def __enter__(self):
        import tempfile

        self.dir = tempfile.TemporaryDirectory()
        self.cache = diskcache.Cache(self.dir.name, disk=JSONDisk)
        return self.cache

    def __exit__(self, *exc):
        self.cache.close()
        self.dir.cleanup()


def test_a_reply_too_large_to_keep_in_the_row_is_a_text_value_file(tmp_path: Path) -> None:
    import random

    rng = random.Random(0)
    reply = Completion("".join(rng.choice("abcdefghij0123456789 ") for _ in range(60_000)), prompt_tokens=9)
    with diskcache.Cache(str(tmp_path / "c"), disk=JSONDisk) as c:
        c.set(_key("big"), encode_completion(reply))
    (mode, filename, _value), = _stored_rows(tmp_path / "c")
    assert mode == 3 and filename.endswith(".val")  # text, as hdeval always wrote value files
    cb = CachedBackend(FakeBackend(), tmp_path / "c")
    assert cb.complete(_req("big")) == reply
    cb.close()


def _deflate(raw: bytes) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, -15, zdict=_ZDICT)
    return VALUE_MAGIC + z.compress(raw) + z.flush()


PLANTED = {
    "damaged": VALUE_MAGIC + b"\xff\xfe\x00garbage",
    "cut-short": _deflate(b'{"t":"4","p":3}')[:-3],
    "bomb": _deflate(b'{"t":"' + b"9" * (MAX_ENTRY_CHARS + 10) + b'"}'),
    "not-json": _deflate(b"{not json"),
    "a-list": _deflate(b'["4"]'),
    "no-text": _deflate(b'{"p":3}'),
    "bad-logprobs": _deflate(b'{"t":"4","l":[["4",-1.0]]}'),
    "bad-logprob-value": _deflate(b'{"t":"4","l":[[["4","x"]]]}'),
    "bad-count": _deflate(b'{"t":"4","p":-5}'),
    "other-magic": b"Z9" + _deflate(b'{"t":"4"}')[2:],
    "packed-cut-short": encode_completion(REPLIES["score"])[:-3],
    "packed-trailing": encode_completion(REPLIES["score"]) + b"\x00",
    "packed-flags": VALUE_MAGIC_PACKED + b"\x80\x01\x01",
    "packed-top-text-without-logprobs": VALUE_MAGIC_PACKED + b"\x02\x01\x01",
    "packed-huge-number": VALUE_MAGIC_PACKED + b"\x00" + b"\xff" * 9 + b"\x01",
    "packed-count-bomb": VALUE_MAGIC_PACKED + b"\x01\x01\x01\x01\xff\xff\xff\xff\x0f",
    "packed-not-utf8": VALUE_MAGIC_PACKED + b"\x00\x01\x01\x02\xff\xfe",
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_compact_value_is_a_miss_with_a_warning(tmp_path: Path, case: str) -> None:
    cache = tmp_path / "c"
    with diskcache.Cache(str(cache)):
        pass
    con = sqlite3.connect(cache / "cache.db")
    con.execute("INSERT INTO Cache(key, raw, store_time, access_time, mode, filename, value) "
                "VALUES (?, 1, 0, 0, 1, NULL, ?)", (_key("q"), sqlite3.Binary(PLANTED[case])))
    con.commit()
    con.close()
    assert not check_cache(cache).ok
    fake = FakeBackend()
    cb = CachedBackend(fake, cache)
    with pytest.warns(CacheWarning):
        got = cb.complete(_req("q"))
    assert fake.calls == 1 and not got.cached and cb.stats.unreadable == 1
    assert cb.complete(_req("q")).cached  # replaced by the fresh reply, stored compactly
    cb.close()
    assert check_cache(cache).ok


@pytest.mark.parametrize("older", ["json-text", "compact-value", "compact-key"])
def test_apply_on_a_cache_of_the_older_format_pays_nothing_and_scores_the_same(toy, tmp_path: Path,
                                                                              fake_calls: list[int],
                                                                              older: str) -> None:
    """A cache filled by an hdeval before the reply table still serves a rerun: 0 calls and the
    same rows. ``json-text``: hex text keys and JSON text values (before the compact value);
    ``compact-value``: hex text keys and compact values (until the compact key);
    ``compact-key``: 32-byte keys and compact values in diskcache's rows (until the table)."""
    from hdeval.run.train import train

    task, data = toy
    art = train(task=str(task), data=str(data), llm="fake", layers=1, aggregator="lr",
                cache_dir=str(tmp_path / "train-cache")).save(tmp_path / "art")
    rows = [json.loads(line) for line in Path(data).read_text().splitlines() if line.strip()]
    new = write_jsonl(tmp_path / "new.jsonl", [{**r, "id": "n" + r["id"], "output": r["output"] + " (new)"}
                                                for r in rows])
    cache = tmp_path / "c"

    def apply(out: str):
        return CliRunner().invoke(cli, ["apply", str(art), str(new), "-o", str(tmp_path / out),
                                        "--cache-dir", str(cache)])

    assert apply("first.jsonl").exit_code == 0
    paid = len(fake_calls)
    # rewrite every entry as the older hdeval stored it, with the default Disk: the hex key as
    # text, the value json.dumps text or the compact bytes
    entries = {k: c.to_dict() for k, c in cache_entries(cache).items()}
    for suffix in ("", "-wal", "-shm"):  # an older hdeval had no reply table
        (cache / f"replies.db{suffix}").unlink(missing_ok=True)
    with diskcache.Cache(str(cache), disk=JSONDisk) as c:
        assert len(c) == 0
    assert 0 < len(entries) <= paid
    with diskcache.Cache(str(cache), disk=JSONDisk if older == "compact-key" else diskcache.Disk) as c:
        for k, d in entries.items():
            c.set(k, json.dumps(d) if older == "json-text" else
                  encode_completion(Completion.from_dict(d)) if older == "compact-key" else _deflated(d))
    con = sqlite3.connect(cache / "cache.db")
    assert {r for (r,) in con.execute("SELECT DISTINCT typeof(key) FROM Cache")} == {
        "blob" if older == "compact-key" else "text"}
    con.close()
    assert {row[0] for row in _stored_rows(cache)} == {1} and all(
        isinstance(row[2], str if older == "json-text" else bytes) for row in _stored_rows(cache))
    again = apply("second.jsonl")
    assert again.exit_code == 0, again.output
    assert len(fake_calls) == paid and f"LLM calls made: 0, cache hits: {len(entries)}," in again.stderr
    assert (tmp_path / "second.jsonl").read_bytes() == (tmp_path / "first.jsonl").read_bytes()
