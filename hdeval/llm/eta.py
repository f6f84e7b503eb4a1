"""How long a run will take: its uncached calls at a rate measured on this machine.

A rate is seconds per 1,000 prompt tokens. It comes from the last run of the same LLM
(recorded in the cache directory by ``train``) or, for the embedded model when nothing is
recorded, from a short timed probe. A server with no recorded run gets no estimate: its speed
is the server's, and a guess would mislead.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from hdeval.core.paths import default_cache_dir
from hdeval.llm.config import shown_identity

RATES_FILE = "rates.json"
# Above this, a run on the embedded model asks first (refuses without a terminal unless --yes).
LONG_RUN_SECONDS = 3600.0
# A run shorter than this says little about the steady rate (model loading dominates).
MIN_RECORDED_CALLS = 20
_MAX_RATES_BYTES = 1 << 20  # the file sits in a cache dir that may be shared: read it bounded
# What "did you mean" reads of it: a few hundred model names, each no longer than a real one.
MAX_SEEN_MODELS = 500
MAX_MODEL_NAME = 100

# One sample scored on three criteria, laid out like the real scoring prompts (the sample first,
# the criterion last) so the probe sees the same prefix reuse a run gets.
_PROBE_TEXT = " ".join(
    f"Paragraph {i}: the council of a small town met on a Tuesday to discuss the budget for the "
    "library, the roads and the school, and voted after a long debate to raise the funds."
    for i in range(8)
)
_PROBE_CRITERIA = ("coherence", "fluency", "relevance")


@dataclass(frozen=True)
class Rate:
    seconds_per_1k_tokens: float
    source: str  # said next to the estimate, so the user knows where the figure comes from
    startup_seconds: float = 0.0  # loading the model, once per run


def uncached_tokens(plans: Iterable[Any]) -> tuple[int, int]:
    """(calls, prompt tokens) still to pay for. A stage whose cache state is unknown counts whole."""
    calls = tokens = 0
    for p in plans:
        n = p.decompose_calls + p.score_calls
        if n == 0:
            continue
        left = n - (p.cached or 0)
        calls += left
        tokens += round(p.prompt_tokens * left / n)
    return calls, tokens


def format_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def _rates_path(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir if cache_dir is not None else default_cache_dir()) / RATES_FILE


def _read(path: Path) -> dict[str, Any]:
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_RATES_BYTES:  # a FIFO would block
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def load_rate(cache_dir: str | os.PathLike | None, identity: str) -> Rate | None:
    entry = _read(_rates_path(cache_dir)).get(shown_identity(identity))
    if not isinstance(entry, dict):
        return None
    value, calls = entry.get("seconds_per_1k_tokens"), entry.get("calls")
    # anything odd in a file someone else may have written is no rate at all
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    when = entry.get("recorded") if isinstance(entry.get("recorded"), str) else "earlier"
    if entry.get("probe") is True:
        return Rate(
            float(value),
            f"measured by a probe {when[:10]}",
            startup_seconds=_bounded(entry.get("startup_seconds")),
        )
    what = f"the last run's {calls} calls" if isinstance(calls, int) else "an earlier run"
    return Rate(float(value), f"rate recorded from {what}")


def seen_models(cache_dir: str | os.PathLike | None) -> list[tuple[str, str]]:
    """(model, server URL) of the OpenAI-compatible LLMs this cache recorded a run's rate for: the
    names ``--llm`` is checked against for a typo. The file is anyone's who shares the cache: read
    bounded, and a name that is not a plausible model name is skipped."""
    out = []
    for identity in list(_read(_rates_path(cache_dir)))[:MAX_SEEN_MODELS]:
        kind, _, rest = identity.partition(":")
        model, at, url = rest.rpartition("@")
        if kind == "openai" and at and 0 < len(model) <= MAX_MODEL_NAME and model.isprintable():
            out.append((model, re.sub(r"\+[a-z_]+\Z", "", url)))  # without the dialect's +suffix
    return out


def _bounded(value: Any) -> float:
    return (
        float(value)
        if isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value < 3600
        else 0.0
    )


def record_rate(
    cache_dir: str | os.PathLike | None, identity: str, calls: int, prompt_tokens: int, seconds: float
) -> None:
    """Remember this LLM's rate from a run for the next estimate. Best effort: never fails a run."""
    if calls < MIN_RECORDED_CALLS or prompt_tokens <= 0 or seconds <= 0:
        return
    _write(cache_dir, identity, {"seconds_per_1k_tokens": seconds / (prompt_tokens / 1000.0), "calls": calls})


def _write(cache_dir: str | os.PathLike | None, identity: str, entry: dict[str, Any]) -> None:
    path = _rates_path(cache_dir)
    if not path.parent.is_dir():
        return
    data = _read(path)
    data[shown_identity(identity)] = {**entry, "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tmp = path.with_name(f".{RATES_FILE}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def probe_local(llm_spec: Any) -> Rate:
    """Time the embedded model on three scoring-sized calls of one sample (model load apart)."""
    from hdeval.llm.backends.base import CompletionRequest, Message
    from hdeval.llm.backends.factory import make_backend

    start = time.perf_counter()
    backend = make_backend(llm_spec)
    try:
        tokens = 0
        began = time.perf_counter()
        for criterion in _PROBE_CRITERIA:
            request = CompletionRequest(
                messages=(
                    Message(
                        "user",
                        f"Text:\n{_PROBE_TEXT}\n\nRate the text's {criterion} "
                        "from 1 to 5. Answer with one digit.",
                    ),
                ),
                max_tokens=1,
                top_logprobs=5,
            )
            reply = backend.complete(request)
            tokens += reply.prompt_tokens or len(request.messages[0].content) // 4
        elapsed = time.perf_counter() - began
    finally:
        getattr(backend, "close", lambda: None)()
    return Rate(elapsed / (tokens / 1000.0), "measured now by a 3-call probe", startup_seconds=began - start)


def rate_for(identity: str, llm_spec: Any, cache_dir: str | os.PathLike | None) -> Rate | None:
    """The rate to estimate with: recorded, else probed for the embedded model, else none."""
    if identity.startswith("fake"):
        return Rate(0.0, "the fake LLM answers at once")
    recorded = load_rate(cache_dir, identity)
    if recorded is not None:
        return recorded
    if llm_spec is not None and is_embedded(llm_spec.model):
        rate = probe_local(llm_spec)
        # kept so the next dry run is instant; a real run's rate replaces it
        _write(
            cache_dir,
            identity,
            {
                "seconds_per_1k_tokens": rate.seconds_per_1k_tokens,
                "probe": True,
                "startup_seconds": rate.startup_seconds,
            },
        )
        return rate
    return None


def is_embedded(model: str | None) -> bool:
    return bool(model) and (model == "local" or model.startswith("llamacpp:"))


def scoring_identity(identity: str) -> str:
    """The scoring LLM of a plan's identity line (which may name a decomposition LLM after it)."""
    return identity.split(", decomposition LLM ")[0]


def estimate_plan(
    plans: Iterable[Any], identity: str, llm_spec: Any, cache_dir: str | os.PathLike | None
) -> tuple[float | None, str]:
    """(seconds or None, one line for the user) for a dry run's plans."""
    plans = list(plans)
    calls, tokens = uncached_tokens(plans)
    upper = any(p.upper_bound or p.cached is None for p in plans)
    name = scoring_identity(identity)
    if calls == 0:
        return 0.0, "estimated time: none (every call is cached)"
    rate = rate_for(name, llm_spec, cache_dir)
    if rate is None:
        return None, (
            f"estimated time: unknown for {shown_identity(name)} until a run of it is recorded "
            f"({calls} uncached calls; a server's speed is its own)"
        )
    seconds = rate.startup_seconds + tokens / 1000.0 * rate.seconds_per_1k_tokens
    bound = "at most " if upper else ""
    stages = sum(1 for p in plans if p.decompose_calls + p.score_calls)
    # every stage (layer) the plan counts, not only the next one
    whole = f"the whole run ({stages} stage{'s' if stages != 1 else ''})"
    return seconds, (
        f"estimated time for {whole}: {bound}{format_duration(seconds)} for {calls} uncached calls "
        f"(~{tokens} prompt tokens at {rate.seconds_per_1k_tokens:.2f} s per 1k, {rate.source})"
    )
