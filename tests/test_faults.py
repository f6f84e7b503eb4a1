"""Nothing lost under faults: training through a server that fails, hangs, drops and lies.

Every run here goes through the real OpenAI client against :class:`llm_server.FaultServer`
(127.0.0.1, answers like hdeval's FakeBackend, faults by a seeded :class:`FaultMix`) on a real
data slice (sfres, 40 samples, 2 layers). The fault-free run through the same server (same
port, so the same backend identity) is the reference: a faulty run must either produce the
same tree, metrics and score table, or stop with one clear message after which a rerun
resumes; in both cases the cache holds exactly the completions the server delivered.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner
from conftest import artifact_view, cache_entries, data_file, view
from llm_server import (
    DECOMPOSE_GARBAGE,
    SCORE_GARBAGE,
    TRANSPORT_FAULTS,
    Answer,
    FaultMix,
    FaultServer,
    LLMServer,
    Reply,
    completion_request,
)

from hdeval.cli import cli
from hdeval.core.errors import BackendError, DecompositionError, ScoringError
from hdeval.llm.backends.openai_compat import OpenAICompatBackend
from hdeval.llm.cache.client import request_key
from hdeval.methods.hdeval.evaluator import Evaluator
from hdeval.run.train import train

pytestmark = pytest.mark.usefixtures("no_leaked_resources")  # conftest: fails a test that leaks

MODEL = "test-model"
PROBE_TEXT = "Reply with the word OK (as JSON if JSON is asked for)."  # aprobe's prompt
SLICE = {"task": "sfres", "limit": 40, "layers": 2, "aggregator": "lr", "concurrency": 8}
# a transport fault costs one retry; with 30% faults and 6 retries a request fails for good
# with probability 0.3**7: rare, and the test below copes with it either way
MAX_RETRIES = 6
CLIENT_TIMEOUT = 3.0  # "hang" waits 4.5 s so it always times out; 3 s leaves a busy CI box time for real replies


def backend(server: FaultServer) -> OpenAICompatBackend:
    """The real client with a fast backoff (the CLI's 0.5 s base would make tests slow)."""
    return OpenAICompatBackend(MODEL, base_url=server.url, api_key="sk-test-faults", timeout=CLIENT_TIMEOUT,
                               max_retries=MAX_RETRIES, backoff_base=0.01, backoff_cap=0.2)


def run(server: FaultServer, cache_dir: Path, **options: Any) -> Evaluator:
    with closing(backend(server)) as b:  # the injected backend is ours to close
        return train(**{**SLICE, "data": str(data_file()), "cache_dir": str(cache_dir), **options}, backend=b)




def keys_of(server: FaultServer, answers: list[Answer], identity: str) -> set[str]:
    """The cache keys of the requests behind ``answers`` (their schema as the client declared it)."""
    bodies = [json.loads(a.body) for a in answers]
    return {request_key(identity, completion_request(b, server.book.declared(b))) for b in bodies}


def delivered(answers: list[Answer]) -> list[Answer]:
    """Replies the client received whole: real completions and garbage alike are cached (not the
    probe a run sends before it takes a failing request for an outage: it is never cached)."""
    return [
        a for a in answers
        if a.outcome in ("ok", *SCORE_GARBAGE, *DECOMPOSE_GARBAGE) and PROBE_TEXT.encode() not in a.body
    ]


def one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


@pytest.fixture(scope="module")
def server() -> Iterator[FaultServer]:
    # one server for the module: its port is part of the backend identity (so of the cache
    # keys), and keeping it lets a later fault-free run hit the cache a faulty run filled
    with FaultServer(lifetime=600) as s:
        yield s


@pytest.fixture(scope="module")
def reference(server: FaultServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fault-free run every faulty run is compared with."""
    server.faults = None
    start = len(server.log)
    ev = run(server, tmp_path_factory.mktemp("reference-cache"))
    answers = server.log[start:]
    assert {a.outcome for a in answers} == {"ok"}
    return {"view": view(ev), "identity": f"openai:{MODEL}@{server.url}", "calls": len(answers)}


@pytest.fixture
def fresh(server: FaultServer) -> Iterator[FaultServer]:
    """The shared server, fault-free again after each test."""
    server.faults = None
    server.on_request = None
    yield server
    server.faults = None
    server.on_request = None


# -- the server itself is bounded ------------------------------------------------------------


def test_server_refuses_past_its_request_limit_and_stops_by_itself() -> None:
    from hdeval.llm.backends.base import CompletionRequest, Message

    with FaultServer(max_requests=2, lifetime=1.0) as s:
        # built while the server runs: its book learns the declared kind and data
        req = CompletionRequest((Message("user", "Rate x."),), kind="score", data={"sample": "x", "criterion": "c"})
        with closing(OpenAICompatBackend(MODEL, base_url=s.url, api_key="k", timeout=2, max_retries=0)) as b:
            b.complete(req)
            b.complete(req)
            with pytest.raises(BackendError, match="request limit 2"):
                b.complete(req)  # a 400: not retried, so a runaway client loop ends at once
        time.sleep(1.5)  # past its lifetime: the server stopped without being told
        with pytest.raises(BackendError, match="cannot reach"), \
                closing(OpenAICompatBackend(MODEL, base_url=s.url, api_key="k", timeout=1, max_retries=0)) as b:
            b.complete(req)


def test_fault_pattern_is_a_function_of_the_request_not_of_timing() -> None:
    mix = FaultMix(0.3, TRANSPORT_FAULTS + SCORE_GARBAGE + DECOMPOSE_GARBAGE, seed=3)
    bodies = [f"body {i}".encode() for i in range(2000)]
    first = [mix.pick(b, "score", 0) for b in bodies]
    assert first == [mix.pick(b, "score", 0) for b in bodies]
    rate = sum(f is not None for f in first) / len(first)
    assert 0.25 < rate < 0.35
    # garbage goes only to the request kind it fits
    assert not set(first) & set(DECOMPOSE_GARBAGE)
    assert not {mix.pick(b, "decompose", 0) for b in bodies} & set(SCORE_GARBAGE)
    # a retried request (seen once before) draws again, independently
    assert first != [mix.pick(b, "score", 1) for b in bodies]


# -- survival: transport faults --------------------------------------------------------------


MIXES = {
    # 30% of requests fail: 429 with and without Retry-After (1 s), 500/502/503, hangs past
    # the client timeout, dropped connections, bodies cut half way, malformed bodies; plus
    # decomposition replies that are not JSON or empty (asked again, not transport faults)
    "mixed-30": FaultMix(0.3, TRANSPORT_FAULTS + DECOMPOSE_GARBAGE, seed=11),
    # a rate-limit storm: 40% of requests get a 429, half of them with Retry-After: 0
    "429-storm-40": FaultMix(0.4, ("429", "429-retry-after"), seed=2, retry_after="0"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mix", MIXES, ids=list(MIXES))
def test_transport_faults_leave_the_result_unchanged_and_the_cache_exact(
    mix: str, fresh: FaultServer, reference: dict[str, Any], tmp_path: Path
) -> None:
    server = fresh
    cache = tmp_path / "cache"
    server.faults = MIXES[mix]
    start = len(server.log)
    ev = None
    stops: list[str] = []
    for _ in range(5):
        try:
            ev = run(server, cache)
        except BackendError as exc:  # requests failing one after another stop the run
            msg = str(exc)
            assert "\n" not in msg and "rerun" in msg and server.url in msg, msg
            stops.append(msg)
            continue
        # a request that failed 7 times in a row while others succeeded is its cell's recorded
        # failure, not cached: the rerun asks for it, and only for it
        answered = server.log[start:]
        if not {a.body for a in answered} - {a.body for a in delivered(answered)}:
            break
        stops.append("a request kept failing: recorded as its cell's failure")
        ev = None
    assert ev is not None, f"five runs did not finish cleanly: {stops}"
    answers = server.log[start:]
    seen = Counter(a.outcome for a in answers)
    # every fault kind of the mix really happened (else this test would prove less than it says)
    transport = [f for f in MIXES[mix].faults if f in TRANSPORT_FAULTS]
    assert set(transport) <= set(seen), seen
    assert sum(seen[f] for f in transport) > (MIXES[mix].rate - 0.1) * len(answers), seen

    assert view(ev) == reference["view"]

    ok = delivered(answers)
    # no completion was paid for twice (hung requests never count: the client gave up)
    assert max(Counter(a.body for a in ok).values()) == 1
    # the cache holds exactly the completions the server delivered, each one parseable
    entries = cache_entries(cache)
    assert set(entries) == keys_of(server, ok, reference["identity"])
    # retried calls succeeded: as many distinct completions as the fault-free run needed,
    # more only by the decomposition replies that were garbage and asked again
    feedback = sum(1 for a in ok if a.outcome in DECOMPOSE_GARBAGE)
    assert len(entries) == reference["calls"] + feedback

    # a rerun against the healed server makes no call at all
    server.faults = None
    before = len(server.log)
    again = run(server, cache)
    assert len(server.log) == before
    assert again.metrics["usage"]["calls"] == 0
    assert view(again) == reference["view"]


@pytest.mark.slow
def test_outage_stops_with_one_clear_message_and_a_rerun_resumes(
    fresh: FaultServer, reference: dict[str, Any], tmp_path: Path
) -> None:
    """Through the CLI: the server goes down for good in the middle of layer 2."""
    server = fresh
    cache, out = tmp_path / "cache", tmp_path / "artifact"
    # layer 1 is 120 scoring calls + 3 decompositions: the outage hits layer-2 scoring
    outage_from = server.calls + 200

    def go_down(n: int) -> None:
        if n >= outage_from and server.faults is None:
            server.faults = FaultMix(1.0, ("503",))

    server.on_request = go_down
    args = ["train", "--task", "sfres", "--data", str(data_file()), "--limit", "40", "--layers", "2",
            "--aggregator", "lr", "--llm", MODEL, "--base-url", server.url, "--cache-dir", str(cache),
            "--max-retries", "1", "--timeout", "5", "--concurrency", "4", "-o", str(out)]
    start = len(server.log)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 3, result.output
    line = one_error_line(result.stderr)
    assert server.url in line and "HTTP 503" in line and "rerun" in line and "resumes" in line, line
    assert "Traceback" not in result.output
    assert not out.exists()
    first = delivered(server.log[start:])
    assert set(cache_entries(cache)) == keys_of(server, first, reference["identity"])

    # the outage ends; the same command finishes, asking only for what was never delivered
    server.on_request = None
    server.faults = None
    resumed_from = len(server.log)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    second = server.log[resumed_from:]
    assert not {a.body for a in second} & {a.body for a in first}
    assert len(first) + len(second) == reference["calls"]
    assert f"LLM calls made: {len(second)}," in result.stderr
    assert artifact_view(out) == reference["view"]


def test_a_long_rate_limit_wait_is_one_warning_line_not_silence(
    fresh: FaultServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server asking to wait (Retry-After, up to a minute a retry) used to leave the CLI silent."""
    from hdeval.llm.backends import openai_compat

    class FirstScoresWait:
        def __init__(self) -> None:
            self.n = 0

        def pick(self, body: bytes, kind: str, seen_before: int) -> str | None:
            self.n += kind == "score"
            return "429-retry-after" if kind == "score" and self.n <= 4 else None

    monkeypatch.setattr(openai_compat, "LONG_WAIT", 0.5)  # the server's 1 s counts as long
    fresh.faults = FirstScoresWait()
    result = CliRunner().invoke(cli, [
        "train", "--task", "sfres", "--data", str(data_file()), "--limit", "8", "--layers", "1",
        "--aggregator", "lr", "--llm", MODEL, "--base-url", fresh.url, "--cache-dir", str(tmp_path / "c"),
        "--concurrency", "4", "-o", str(tmp_path / "art")])
    assert result.exit_code == 0, result.output
    said = [line for line in result.stderr.splitlines() if "asked to wait" in line]
    assert said == [f"warning: the server at {fresh.url} asked to wait 1 s before retrying "
                    "(rate limited (HTTP 429): rate limit reached); waiting"], result.stderr


# -- garbage replies -------------------------------------------------------------------------


def test_garbage_scores_below_the_threshold_become_recorded_failures(
    fresh: FaultServer, reference: dict[str, Any], tmp_path: Path
) -> None:
    server = fresh
    cache = tmp_path / "cache"
    server.faults = FaultMix(0.06, SCORE_GARBAGE, seed=5)  # prose and scores like "9"
    start = len(server.log)
    ev = run(server, cache, max_failure_rate=0.2)
    answers = server.log[start:]
    garbage = {a.body for a in answers if a.outcome in SCORE_GARBAGE}
    assert {a.outcome for a in answers} >= set(SCORE_GARBAGE)
    table = ev.score_table
    criteria = [c for c in table.columns if c not in ("sample_id", "split") and not c.startswith("human:")]
    nan_cells = int(table[criteria].isna().sum().sum())
    # every garbage reply is one NaN (two when two samples share the text, so at least)
    assert nan_cells >= len(garbage) > 0
    assert ev.metrics["failure_rate"] == pytest.approx(nan_cells / table[criteria].size)
    assert 0 < ev.metrics["failure_rate"] <= 0.2
    # the tree does not depend on scoring replies
    assert view(ev)["tree"] == reference["view"]["tree"]
    # garbage is a reply like any other: cached, so a rerun (even against a healed server)
    # costs nothing and reproduces the same failures; a parser fix would need no new calls
    server.faults = None
    before = len(server.log)
    again = run(server, cache, max_failure_rate=0.2)
    assert len(server.log) == before
    assert view(again) == view(ev)


def test_garbage_scores_above_the_threshold_stop_with_a_clear_error(
    fresh: FaultServer, tmp_path: Path
) -> None:
    server = fresh
    server.faults = FaultMix(0.5, SCORE_GARBAGE, seed=5)
    out = tmp_path / "artifact"
    result = CliRunner().invoke(cli, [
        "train", "--task", "sfres", "--data", str(data_file()), "--limit", "40", "--layers", "2",
        "--llm", MODEL, "--base-url", server.url, "--cache-dir", str(tmp_path / "cache"),
        "--max-failure-rate", "0.2", "-o", str(out)])
    assert result.exit_code == ScoringError.exit_code, result.output
    line = one_error_line(result.stderr)
    assert "layer 1" in line and "could not be read" in line and "threshold 20%" in line, line
    assert "--max-failure-rate" in line and "cached" in line, line
    assert not out.exists()


class FirstDecompositionGarbage:
    """Each decomposition's first reply is garbage (not JSON, then empty, alternating);
    the follow-up request that says what was wrong is answered properly."""

    def __init__(self) -> None:
        self.n = 0

    def pick(self, body: bytes, kind: str, seen_before: int) -> str | None:
        if kind != "decompose" or b"That reply was not usable" in body:
            return None
        self.n += 1  # decompositions run one after another: no lock needed
        return DECOMPOSE_GARBAGE[(self.n - 1) % 2]


def test_garbage_decompositions_are_asked_again_with_the_problem(
    fresh: FaultServer, reference: dict[str, Any], tmp_path: Path
) -> None:
    server = fresh
    server.faults = FirstDecompositionGarbage()
    start = len(server.log)
    ev = run(server, tmp_path / "cache")
    answers = [a for a in server.log[start:] if a.kind == "decompose"]
    assert Counter(a.outcome for a in answers) == {"bad-json": 2, "empty": 1, "ok": 3}
    assert view(ev) == reference["view"]  # the same tree once the follow-ups were answered


def test_decompositions_that_stay_garbage_stop_with_a_clear_error(
    fresh: FaultServer, reference: dict[str, Any], tmp_path: Path
) -> None:
    server = fresh
    server.faults = FaultMix(1.0, DECOMPOSE_GARBAGE, seed=1)
    cache = tmp_path / "cache"
    # layer 2 cannot be decomposed: what was paid for (layer 1) is kept, and why it stopped is said
    stopped = run(server, cache)
    msg = stopped.metrics["stopped"]
    assert "\n" not in msg and "could not decompose criterion" in msg and "3 replies were unusable" in msg
    assert "rerun asks again" in msg
    assert {c.layer for c in stopped.tree} == {1}
    garbage = cache_entries(cache)
    # Garbage is kept in the cache for inspection, but it is not a cache hit forever: a rerun
    # asks again (three calls, layer-1 scores all come from the cache) ...
    before = len(server.log)
    assert "stopped" in run(server, cache).metrics
    assert [a.kind for a in server.log[before:]] == ["decompose"] * 3
    assert set(garbage) < set(cache_entries(cache))
    # ... so once the LLM is fixed, the same command succeeds with the same tree as a clean run
    server.faults = None
    before = len(server.log)
    ev = run(server, cache)
    assert view(ev)["tree"] == reference["view"]["tree"]
    assert set(garbage) < set(cache_entries(cache))  # the raw garbage replies are still there
    # and its valid replies are found by the next rerun, which makes no call at all
    before = len(server.log)
    again = run(server, cache)
    assert len(server.log) == before
    assert view(again) == view(ev)


# -- one bad item does not sink a paid run ---------------------------------------------------


class RejectOneSample:
    """Every request that holds ``marker`` gets ``fault`` (e.g. a 400 context_length_exceeded
    for an over-long sample); every other request is answered normally."""

    def __init__(self, marker: bytes, fault: str = "context-length", others: dict[bytes, str] | None = None) -> None:
        self.rules = {marker: fault, **(others or {})}

    def pick(self, body: bytes, kind: str, seen_before: int) -> str | None:
        for marker, fault in self.rules.items():
            if marker in body:
                return fault
        return None


def marked_slice(tmp_path: Path, marks: dict[int, str], n: int = 40) -> tuple[Path, dict[int, str]]:
    """The first ``n`` sfres rows with a marker word appended to the output of the rows in
    ``marks`` (row index -> marker); returns the file and row index -> sample id."""
    rows = [json.loads(line) for line in data_file().read_text(encoding="utf-8").splitlines()[:n]]
    for i, marker in marks.items():
        rows[i]["output"] += f" {marker}"
    path = tmp_path / "sfres-marked.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path, {i: rows[i]["id"] for i in marks}


def test_a_request_the_server_rejects_is_that_cells_failure_and_the_run_goes_on(
    fresh: FaultServer, tmp_path: Path
) -> None:
    """One over-long sample (400 context_length_exceeded) and one oversized reply
    (past the 4 MB cap) used to stop ``train``; now they are recorded failures naming the
    sample, nothing of them is cached, and a rerun asks only for them again."""
    server = fresh
    data, ids = marked_slice(tmp_path, {3: "ZZOVERLONGZZ", 7: "ZZHUGEZZ"})
    server.faults = RejectOneSample(b"ZZOVERLONGZZ", others={b"ZZHUGEZZ": "huge"})
    cache, out = tmp_path / "cache", tmp_path / "artifact"
    args = ["train", "--task", "sfres", "--data", str(data), "--limit", "40", "--layers", "2",
            "--aggregator", "lr", "--llm", MODEL, "--base-url", server.url, "--cache-dir", str(cache),
            "--max-retries", "1", "--timeout", "20", "--max-failure-rate", "0.2", "-o", str(out)]
    start = len(server.log)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    answers = server.log[start:]
    rejected = [a for a in answers if a.outcome in ("context-length", "huge")]
    assert {a.outcome for a in rejected} == {"context-length", "huge"}
    assert all(a.kind == "score" for a in rejected)
    # the user is told which sample, on which criterion, and why
    lines = [line for line in result.stderr.splitlines() if "rejected" in line or "larger than" in line]
    assert any(ids[3] in line and "maximum context length" in line for line in lines), result.stderr
    assert any(ids[7] in line and "larger than" in line for line in lines), result.stderr
    import pandas as pd

    from hdeval.methods.hdeval.evaluator import SCORES

    table = pd.read_csv(out / SCORES)
    criteria = [c for c in table.columns if c not in ("sample_id", "split") and not c.startswith("human:")]
    failed = table[table[criteria].isna().any(axis=1)]["sample_id"].tolist()
    assert sorted(failed) == sorted(ids.values())
    assert table.loc[table.sample_id == ids[3], criteria].isna().all(axis=None)
    # nothing of the rejected requests is cached: the cache holds what was delivered
    identity = f"openai:{MODEL}@{server.url}"
    assert set(cache_entries(cache)) == keys_of(server, delivered(answers), identity)
    # a rerun asks again for exactly the rejected requests (a fixed server would answer them)
    again_from = len(server.log)
    result = CliRunner().invoke(cli, [*args[:-1], str(tmp_path / "again")])
    assert result.exit_code == 0, result.output
    assert sorted(a.body for a in server.log[again_from:]) == sorted(a.body for a in rejected)


def test_hostile_score_values_are_recorded_failures_end_to_end(
    fresh: FaultServer, reference: dict[str, Any], tmp_path: Path
) -> None:
    """Odd numbers through the real client: superscript and Arabic-Indic digits, logprobs of 1000,
    Infinity and NaN, a 5000-digit number, a non-string content, usage 1e999."""
    from llm_server import SCORE_HOSTILE

    server = fresh
    server.faults = FaultMix(0.08, SCORE_HOSTILE, seed=4)
    cache = tmp_path / "cache"
    start = len(server.log)
    ev = run(server, cache, max_failure_rate=0.2)
    answers = server.log[start:]
    seen = Counter(a.outcome for a in answers)
    assert len(set(seen) & set(SCORE_HOSTILE)) >= 6, seen
    table = ev.score_table
    criteria = [c for c in table.columns if c not in ("sample_id", "split") and not c.startswith("human:")]
    nan_cells = int(table[criteria].isna().sum().sum())
    failing = sum(n for f, n in seen.items() if f in SCORE_HOSTILE and f != "usage-1e999")
    assert nan_cells >= failing > 0
    assert ev.metrics["failure_rate"] == pytest.approx(nan_cells / table[criteria].size)
    assert 0 <= ev.metrics["usage"]["prompt_tokens"] < 10**9  # 1e999 was read as 0, not summed
    # nothing hostile leaks into a score: every layer-1 cell that did not fail holds the
    # fault-free run's score, or the "4" a reply with hostile usage says (which layer-2 criteria
    # are kept may change with the failed cells)
    import io

    import pandas as pd

    layer1 = [c.key for c in ev.tree.layer(1)]
    want = pd.read_csv(io.StringIO(reference["view"]["scores"])).set_index("sample_id")[layer1]
    got = pd.read_csv(io.StringIO(table.to_csv(index=False))).set_index("sample_id")[layer1]
    read = got.notna()
    assert int((~read).sum().sum()) > 0 and read.sum().sum() > 0.8 * got.size
    other = read & (got != want.loc[got.index])
    assert int(other.sum().sum()) <= seen["usage-1e999"] and (got.to_numpy()[other.to_numpy()] == 4.0).all()
    # cached as delivered and read back the same: a rerun costs nothing and agrees
    server.faults = None
    before = len(server.log)
    again = run(server, cache, max_failure_rate=0.2)
    assert len(server.log) == before
    assert view(again) == view(ev)


def test_a_dripping_server_is_bounded_by_the_timeout(fresh: FaultServer, tmp_path: Path) -> None:
    """The first scoring reply drips a byte a second; ``timeout`` bounds the request
    as a whole, the retry gets a normal reply, and the run finishes."""

    class DripOnce:
        def __init__(self) -> None:
            self.done: bytes | None = None

        def pick(self, body: bytes, kind: str, seen_before: int) -> str | None:
            if kind == "score" and not self.done:
                self.done = body
                return "drip"
            return None

    server = fresh
    server.faults = DripOnce()
    start = len(server.log)
    with closing(OpenAICompatBackend(MODEL, base_url=server.url, api_key="k", timeout=1.5, max_retries=2,
                                     backoff_base=0.01, backoff_cap=0.2)) as b:
        ev = train(**{**SLICE, "layers": 1, "data": str(data_file()), "cache_dir": str(tmp_path / "c")}, backend=b)
    answers = server.log[start:]
    assert Counter(a.outcome for a in answers)["drip"] == 1
    # the client gave up on the drip and asked again (it would otherwise wait ~5 minutes
    # for the whole body): the same request answered twice, once dripping, once properly
    assert [a.outcome for a in answers if a.body == server.faults.done] == ["drip", "ok"]
    assert ev.metrics["failure_rate"] == 0


def test_requests_that_always_fail_are_recorded_on_a_rerun_too(tmp_path: Path) -> None:
    """One sample's requests get a 500 every time. The first run records them as failed cells;
    the rerun, every other request cached, met them before any success and stopped ('server kept
    failing', exit 3) every time, though the server answered everything else. A tiny probe now
    tells a server that is down from requests that fail alone."""
    examples = Path(__file__).resolve().parent.parent / "examples"
    bad = "Because the ocean reflects onto it."

    with LLMServer() as server:
        plain = server.default
        server.default = lambda req: Reply.error(500, "boom") if bad.encode() in req.body else plain(req)
        args = ["train", "--task", str(examples / "qa_task.toml"), "--tree", str(examples / "qa_tree.json"),
                "--layers", "2", "--aggregator", "lr", "--llm", MODEL, "--base-url", server.url,
                "--max-retries", "1", "--cache-dir", str(tmp_path / "cache"), "-o", str(tmp_path / "art"), "-q"]
        first = CliRunner().invoke(cli, args)
        assert first.exit_code == 0, first.output
        before = server.calls
        again = CliRunner().invoke(cli, [*args, "--force"])
        assert again.exit_code == 0, again.output
        asked = [json.loads(r.body) for r in server.requests[before:]]
        probes = [r for r in asked if r["messages"][-1]["content"] == PROBE_TEXT]
        assert 1 <= len(probes) < len(asked)  # one probe for the failing requests in flight together
        assert all(bad in r["messages"][-1]["content"] for r in asked if r not in probes)
        assert f"LLM calls made: {len(probes)}," in again.stderr  # the probes; the failing requests are not cached
        assert "empty slice" not in first.stderr + again.stderr  # a row with no cell: no raw numpy warning
        metrics = json.loads((tmp_path / "art" / "metrics.json").read_text())
        assert 0 < metrics["failure_rate"] < 0.2

        server.default = lambda req: Reply.error(503, "down")  # now the server is down: the run stops
        down = CliRunner().invoke(cli, [*args, "--force"])
        assert down.exit_code == 3 and "rerun" in down.stderr, down.output
        # a server that fails whatever asks for logprobs, as every scoring request does, is down
        # for this run: the probe asks as the failing request did, short prompt aside
        server.default = lambda req: Reply.error(500, "boom") if req.asks_logprobs() else plain(req)
        down = CliRunner().invoke(cli, [*args, "--force", "--cache-dir", str(tmp_path / "other-cache")])
        assert down.exit_code == 3 and "rerun" in down.stderr, down.output


def test_an_outage_after_requests_that_fail_alone_still_stops_the_run(tmp_path: Path) -> None:
    """A probe's answer vouches only for the requests in flight when it came: an outage that
    begins later stops the run within a streak, not after every request is recorded as failed."""
    from hdeval.core.errors import RetriesExhausted
    from hdeval.llm.backends.base import CompletionRequest, Message
    from hdeval.llm.cache.client import CachedBackend

    with LLMServer() as server:
        plain, seen = server.default, []

        def reply(req):
            seen.append(req)
            prompt = json.loads(req.body)["messages"][-1]["content"]
            if prompt not in ("q0", "q1", "q2", "q3", PROBE_TEXT):
                down.append(prompt)  # from q4 on the server is down, to probes too
            if down:
                return Reply.error(503, "down")
            return Reply.error(500, "boom") if prompt in ("q1", "q2", "q3") else plain(req)

        down: list[str] = []

        server.default = reply
        inner = OpenAICompatBackend(MODEL, base_url=server.url, api_key="k", max_retries=0, backoff_base=0.01)
        client = CachedBackend(inner, tmp_path / "cache", concurrency=1, owns_inner=True)
        try:
            with pytest.raises(RetriesExhausted):
                client.complete_many([CompletionRequest((Message("user", f"q{i}"),)) for i in range(40)], keep_rejected=True)
        finally:
            client.close()
        asked = [json.loads(r.body)["messages"][-1]["content"] for r in seen]
        assert asked.count(PROBE_TEXT) == 2  # q1-q3 fail alone (answered); q4-q6 find it down
        assert len(asked) <= 9, asked


def test_a_json_mode_request_that_fails_alone_is_told_from_a_server_that_is_down(tmp_path: Path) -> None:
    """OpenAI's JSON mode refuses a request whose messages never say JSON: the probe says it, so
    a JSON request failing alone is not taken for an outage. A server that gives no answer gets
    one probe, however many requests failed side by side."""
    from hdeval.core.errors import RequestRejected, RetriesExhausted
    from hdeval.llm.backends.base import CompletionRequest, Message
    from hdeval.llm.cache.client import CachedBackend

    def openai_rules(plain):
        def reply(req):
            body = json.loads(req.body)
            said = " ".join(m["content"] for m in body["messages"]).lower()
            if (body.get("response_format") or {}).get("type") == "json_object" and "json" not in said:
                return Reply.error(400, "'messages' must contain the word 'json' in some form")
            return Reply.error(500, "boom") if "bad" in said else plain(req)
        return reply

    with LLMServer() as server:
        server.default = openai_rules(server.default)
        inner = OpenAICompatBackend(MODEL, base_url=server.url, api_key="k", max_retries=0, backoff_base=0.01)
        client = CachedBackend(inner, tmp_path / "a", concurrency=1, owns_inner=True)
        try:  # the failing one first, as on a rerun: no success before it
            asks = [CompletionRequest((Message("user", f"{w} json please"),), json_mode=True) for w in ("bad", "ok")]
            out = client.complete_many(asks, keep_rejected=True)
        finally:
            client.close()
        assert isinstance(out[0], RequestRejected) and not isinstance(out[1], RequestRejected)

    with LLMServer() as server:
        server.default = lambda req: Reply.error(503, "down")
        inner = OpenAICompatBackend(MODEL, base_url=server.url, api_key="k", max_retries=0, backoff_base=0.01)
        client = CachedBackend(inner, tmp_path / "b", concurrency=4, owns_inner=True)
        try:
            with pytest.raises(RetriesExhausted):
                client.complete_many([CompletionRequest((Message("user", f"q{i}"),)) for i in range(8)])
        finally:
            client.close()
        probes = [r for r in server.requests if PROBE_TEXT.encode() in r.body]
        assert len(probes) == 1
