"""The default embedded runtime: any GGUF model through xllamacpp (the ``local`` extra).

xllamacpp ships llama.cpp as prebuilt manylinux/macOS/Windows wheels and exposes llama.cpp's
own server in-process: ``Server.handle_chat_completions`` takes an OpenAI-style request dict
and returns the reply dict, with no HTTP round trip. Installing it takes seconds, where
llama-cpp-python compiles llama.cpp from source (4.5-28 minutes measured on 2 cores; see
``benchmarks/bench_local_runtime.py``). The same GGUF file gives the same cache identity
under either runtime (see :func:`hdeval.backends.llama_cpp.model_identity`).

What the server gives and how hdeval uses it:

* prompt caching: each slot keeps its KV cache and reuses the longest common prefix with
  the next prompt, so scoring all criteria of one sample back to back evaluates the sample
  once (``timings.prompt_n`` is reported as ``prompt_tokens_evaluated``);
* logprobs: a scoring request asks for the first token's top :data:`SCORE_TOP_N` raw
  logprobs. Digits missing from them are read from a second request whose first token is
  constrained to the scale by a grammar (``root ::= [1-5]``); it costs one token, because
  the whole prompt is in the slot's cache. When the digits together hold less than the
  parser's threshold, the model is not answering with a score: hdeval reads its greedy
  text, and if that holds no score either, the constrained digit distribution is the
  answer, so a weak model still gives a score (issue #14, item 4);
* JSON-schema constrained output (``response_format: json_schema``) for decomposition.

The server also opens an HTTP listener on 127.0.0.1 and a random port (it cannot be turned
off); hdeval never uses it and protects it with a random API key, so no other process on
the machine can use the model through it.
"""

from __future__ import annotations

import math
import secrets
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from hdeval.backends.base import Completion, CompletionRequest, Message, TokenLogprob
from hdeval.backends.llama_cpp import (
    DEFAULT_N_CTX,
    DEFAULT_SEED,
    N_CTX_ENV,
    SCORE_DIGITS,
    THREADS_ENV,
    _available_cores,
    _int_from_env,
    default_model_path,
    min_digit_mass,
    model_identity,
    constrained_digits,
)
from hdeval.errors import BackendError, ConfigError
from hdeval.paths import check_model_file

PARALLEL_ENV = "HDEVAL_LOCAL_PARALLEL"
# Raw top logprobs asked for at the first scoring position. With 100 of them, a digit that
# is missing has probability below 1/100, so five missing digits hold less than the
# parser's 0.05: "no digit in the top 100" means "the model is not answering a digit".
SCORE_TOP_N = 100
# Host-memory cache of evicted prompt states (llama.cpp's default is 8 GiB).
CACHE_RAM_MIB = 256
_DIGIT_GRAMMAR = "root ::= [" + SCORE_DIGITS[0] + "-" + SCORE_DIGITS[-1] + "]"
_INSTALL_HINT = "pip install -e '.[local]'"


class XLlamaCppBackend:
    """A GGUF model run in-process by llama.cpp's server through xllamacpp.

    ``n_parallel`` server slots serve that many calls at once (``max_concurrency``); the
    default 1 keeps hdeval's sample-major order, which is what makes prefix reuse work.
    ``reuse=False`` sends ``cache_prompt: false`` (for benchmarks).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        n_batch: int = 512,
        n_parallel: int = 1,
        seed: int = DEFAULT_SEED,
        reuse: bool = True,
        is_default_model: bool = False,
    ) -> None:
        path = Path(model_path).expanduser()
        check_model_file(path)
        try:
            import xllamacpp
        except ImportError as exc:
            raise ConfigError(f"the local backend needs xllamacpp: {_INSTALL_HINT} ({exc})") from exc

        self.model_path = path
        self.reuse = reuse
        self.is_default_model = is_default_model
        self.seed = seed
        self.identity = model_identity(path)
        self.max_concurrency = self.n_parallel = max(1, int(n_parallel))
        # Half the cores by default, as for llama-cpp-python (see LlamaCppBackend).
        self.n_threads = n_threads = n_threads or max(1, _available_cores() // 2)
        self.n_ctx = n_ctx
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.n_ctx = n_ctx * self.n_parallel  # split evenly: every slot gets n_ctx
        params.n_parallel = self.n_parallel
        params.n_batch = n_batch
        params.cpuparams.n_threads = n_threads
        params.cpuparams_batch.n_threads = n_threads
        params.warmup = False
        params.verbosity = -1  # library code never prints; errors come back as replies
        params.cache_ram_mib = CACHE_RAM_MIB
        params.hostnames = ["127.0.0.1"]
        params.port = 0
        params.api_keys = [secrets.token_hex(24)]
        try:
            self._server: Any = xllamacpp.Server(params)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"cannot load GGUF model {path}: {exc}") from exc
        self._lock = threading.Lock()  # guards close() against calls in flight
        # One tiny call before anything else: it returns only once the server's main loop
        # runs. Destroying a server whose loop has not started yet hangs for ever (seen with
        # xllamacpp 2026.10 when a backend was closed right after loading).
        self._call((Message("user", "."),), max_tokens=1, temperature=0.0)

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> "XLlamaCppBackend":
        """``local`` (the bundled SmolLM2) or ``llamacpp:/path/model.gguf``; settings from
        ``$HDEVAL_LLAMACPP_N_CTX``, ``$HDEVAL_LLAMACPP_THREADS``, ``$HDEVAL_LOCAL_PARALLEL``."""
        kwargs.setdefault("n_ctx", _int_from_env(N_CTX_ENV, DEFAULT_N_CTX, 256))
        if kwargs.get("n_threads") is None:
            kwargs["n_threads"] = _int_from_env(THREADS_ENV, None, 1)
        kwargs.setdefault("n_parallel", _int_from_env(PARALLEL_ENV, 1, 1))
        if spec == "local":
            return cls(default_model_path(), is_default_model=True, **kwargs)
        kind, _, path = spec.partition(":")
        if kind != "llamacpp" or not path:
            raise ConfigError(f"--llm {spec}: expected 'local' or 'llamacpp:/path/to/model.gguf'")
        return cls(path, **kwargs)

    # -- public API -------------------------------------------------------------------

    def complete(self, request: CompletionRequest) -> Completion:
        """Score from first-token logprobs, or generate text; see the module docstring."""
        scoring = bool(request.top_logprobs) and not request.json_mode and request.json_schema is None
        if scoring:
            return self._score(request)
        return self._generate(request)

    def close(self) -> None:
        """Stop the server and free the model now rather than at garbage collection."""
        with self._lock:
            self._server = None

    # -- requests ---------------------------------------------------------------------

    def _call(self, messages: Sequence[Message], **body: Any) -> tuple[dict, int, int]:
        """One chat completion; returns (reply, prompt tokens, prompt tokens evaluated)."""
        server = self._server
        if server is None:
            raise BackendError("the local model was closed")
        payload = {
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "cache_prompt": self.reuse,
            "stream": False,
            **body,
        }
        try:
            reply = server.handle_chat_completions(payload)
        except (RuntimeError, ValueError) as exc:
            raise BackendError(f"llama.cpp failed: {exc}") from exc
        if not isinstance(reply, Mapping):
            raise BackendError(f"llama.cpp returned {type(reply).__name__}, not a reply object")
        err = reply.get("error")
        if err is not None:
            raise BackendError(self._error_message(err))
        usage = reply.get("usage") if isinstance(reply.get("usage"), Mapping) else {}
        timings = reply.get("timings") if isinstance(reply.get("timings"), Mapping) else {}
        prompt_tokens = _nonneg_int(usage.get("prompt_tokens"))
        evaluated = _nonneg_int(timings.get("prompt_n"), prompt_tokens)
        return dict(reply), prompt_tokens, evaluated

    def _error_message(self, err: Any) -> str:
        if not isinstance(err, Mapping):
            return f"llama.cpp error: {str(err)[:300]}"
        if err.get("type") == "exceed_context_size_error":
            n = _nonneg_int(err.get("n_prompt_tokens"))
            return (
                f"prompt of {n} tokens does not fit the local model's context of {self.n_ctx} "
                f"tokens: set {N_CTX_ENV} higher"
            )
        return f"llama.cpp error: {str(err.get('message', err))[:300]}"

    def _generate(self, request: CompletionRequest) -> Completion:
        body: dict[str, Any] = {
            "max_tokens": int(request.max_tokens),
            "temperature": max(0.0, float(request.temperature)),
            "seed": self.seed if request.seed is None else int(request.seed),
            "repeat_penalty": 1.0,
        }
        if request.json_schema is not None:
            import json

            schema = json.loads(request.json_schema) if isinstance(request.json_schema, str) else request.json_schema
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
        elif request.json_mode:
            body["response_format"] = {"type": "json_object"}
        reply, prompt_tokens, evaluated = self._call(request.messages, **body)
        usage = reply.get("usage") if isinstance(reply.get("usage"), Mapping) else {}
        return Completion(
            text=_message_text(reply),
            top_logprobs=None,
            prompt_tokens=prompt_tokens,
            completion_tokens=_nonneg_int(usage.get("completion_tokens")),
            prompt_tokens_evaluated=evaluated,
        )

    def _score(self, request: CompletionRequest) -> Completion:
        n = int(request.top_logprobs or 0)
        reply, prompt_tokens, evaluated = self._call(
            request.messages,
            max_tokens=1,
            temperature=0.0,
            seed=self.seed,
            logprobs=True,
            top_logprobs=max(SCORE_TOP_N, n),
        )
        first = _first_position(reply, "top_logprobs", "logprob")
        digits: dict[str, float] = {}
        others: dict[str, float] = {}
        for token, lp in first:
            key = token.strip()
            if key in SCORE_DIGITS:
                digits[key] = float(_logaddexp(digits[key], lp)) if key in digits else lp
            elif len(others) < n and token not in others:
                others[token] = lp
        cond: dict[str, float] | None = None
        if len(digits) < len(SCORE_DIGITS):
            cond, more = self._constrained(request.messages)
            evaluated += more
            if digits:
                # Anchor the constrained (conditional) distribution on the digits the raw
                # top list holds, to get the missing digits' raw logprobs.
                shift = _logsumexp(list(digits.values())) - _logsumexp([cond[d] for d in digits])
                for d in SCORE_DIGITS:
                    digits.setdefault(d, cond[d] + shift)
        mass = math.exp(_logsumexp(list(digits.values()))) if digits else 0.0
        text = first[0][0] if first else ""
        completion_tokens = 1
        if mass < min_digit_mass():
            # Not a digit answer: read the greedy reply like a server's text, and fall back
            # to the constrained first token only when that holds no score either.
            gen, _, more = self._call(
                request.messages, max_tokens=int(request.max_tokens), temperature=0.0, seed=self.seed
            )
            evaluated += more
            text = _until_first_digit(_message_text(gen))
            completion_tokens = max(1, _nonneg_int((gen.get("usage") or {}).get("completion_tokens"), 1))
            if not any(ch in SCORE_DIGITS for ch in text):
                if cond is None:
                    cond, more = self._constrained(request.messages)
                    evaluated += more
                text, top = constrained_digits(cond)
                return Completion(text=text, top_logprobs=(top,), prompt_tokens=prompt_tokens,
                                  completion_tokens=1, prompt_tokens_evaluated=evaluated)
        out = {**others, **digits}
        top = tuple(TokenLogprob(t, lp) for t, lp in sorted(out.items(), key=lambda kv: -kv[1]))
        return Completion(text=text, top_logprobs=(top,), prompt_tokens=prompt_tokens,
                          completion_tokens=completion_tokens, prompt_tokens_evaluated=evaluated)

    def _constrained(self, messages: Sequence[Message]) -> tuple[dict[str, float], int]:
        """log P(digit | the first token is a digit of the scale), from a request whose first
        token is constrained by a grammar. The probabilities are read after sampling, at
        temperature 1 with no truncation, so they are the model's own, renormalised over
        the digits; they are renormalised here again in case the sampler reports others."""
        reply, _, evaluated = self._call(
            messages,
            max_tokens=1,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            samplers=["temperature"],
            seed=self.seed,
            grammar=_DIGIT_GRAMMAR,
            logprobs=True,
            top_logprobs=2 * len(SCORE_DIGITS),
            post_sampling_probs=True,
        )
        probs: dict[str, float] = {}
        for token, p in _first_position(reply, "top_probs", "prob"):
            key = token.strip()
            if key in SCORE_DIGITS and p > 0.0:
                probs[key] = probs.get(key, 0.0) + p
        total = sum(probs.values())
        if total <= 0.0:
            raise BackendError("llama.cpp returned no digit probabilities for a constrained score")
        # A digit the sampler did not report is treated as (nearly) impossible.
        return {d: math.log(probs[d] / total) if d in probs else -1e4 for d in SCORE_DIGITS}, evaluated


# -- reply parsing (bounded; the reply is treated as untrusted like any server's) --------


def _nonneg_int(value: Any, default: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return default
    return max(0, int(value))


def _choice(reply: Mapping) -> Mapping:
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise BackendError("llama.cpp reply holds no choices")
    return choices[0]


def _message_text(reply: Mapping) -> str:
    msg = _choice(reply).get("message")
    content = msg.get("content") if isinstance(msg, Mapping) else None
    return content if isinstance(content, str) else ""


def _first_position(reply: Mapping, list_key: str, value_key: str) -> list[tuple[str, float]]:
    """The (token, value) alternatives at the first generated position, best first."""
    lp = _choice(reply).get("logprobs")
    content = lp.get("content") if isinstance(lp, Mapping) else None
    if not isinstance(content, list) or not content or not isinstance(content[0], Mapping):
        raise BackendError("llama.cpp reply holds no logprobs")
    alts = content[0].get(list_key)
    out: list[tuple[str, float]] = []
    for a in alts if isinstance(alts, list) else []:
        if not isinstance(a, Mapping):
            continue
        tok, val = a.get("token"), a.get(value_key)
        if isinstance(tok, str) and isinstance(val, (int, float)) and not isinstance(val, bool) and math.isfinite(val):
            out.append((tok, float(val)))
    out.sort(key=lambda tv: -tv[1])
    return out


def _until_first_digit(text: str) -> str:
    """The reply up to and including its first score digit, as the llama-cpp-python backend
    stops greedy decoding there."""
    for i, ch in enumerate(text):
        if ch in SCORE_DIGITS:
            return text[: i + 1]
    return text


def _logaddexp(a: float, b: float) -> float:
    m = max(a, b)
    return m + math.log(math.exp(a - m) + math.exp(b - m))


def _logsumexp(values: Sequence[float]) -> float:
    m = max(values)
    return m + math.log(sum(math.exp(v - m) for v in values))
