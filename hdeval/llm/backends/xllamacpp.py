"""The default embedded runtime: any GGUF model through xllamacpp (the ``local`` extra), which
runs llama.cpp's server in-process (an OpenAI-style dict in, the reply dict out). One word of a few
is one call whose first token is constrained by a grammar, read at temperature 1 with no
truncation, so the probabilities are the model's own over the words. The server's HTTP listener on
127.0.0.1 cannot be turned off: a random API key keeps other processes from using the model.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from hdeval.core.errors import BackendError, ConfigError
from hdeval.llm.backends.base import (
    MAX_ALTERNATIVES,
    Completion,
    CompletionRequest,
    Message,
    chat_completion,
    token_count,
)
from hdeval.llm.backends.constraints import Constraint, Labels, Scale, constraint_of, to_llama_params
from hdeval.llm.backends.llama_cpp import (
    DEFAULT_N_CTX,
    DEFAULT_SEED,
    N_CTX_ENV,
    _int_from_env,
    adopt_model,
    open_spec,
)
from hdeval.llm.backends.llama_server import choose_completion, choose_params

PARALLEL_ENV = "HDEVAL_LOCAL_PARALLEL"
# Host-memory cache of evicted prompt states (llama.cpp's default is 8 GiB).
CACHE_RAM_MIB = 256
_NEEDS = "xllamacpp: pip install -e '.[local]'"


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
        path, xllamacpp, n_threads = adopt_model(
            self, model_path, "xllamacpp", _NEEDS, seed, reuse, is_default_model, n_threads
        )
        self.max_concurrency = self.n_parallel = max(1, int(n_parallel))
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
        params.endpoint_metrics = True  # answered by the main loop: the start-up check below
        try:
            self._server: Any = xllamacpp.Server(params)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"cannot load GGUF model {path}: {exc}") from exc
        self._lock = threading.Lock()  # guards close() against calls in flight
        # Wait for the server's main loop, which answers the metrics: destroying a server whose
        # loop has not started hangs for ever (xllamacpp 2026.10). Not a prompt: the first prompt
        # finds the cache empty, as on a llama.cpp server just started, so both compute the same
        # numbers from the same requests.
        self._server.handle_metrics()

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> "XLlamaCppBackend":
        """As :func:`~hdeval.llm.backends.llama_cpp.open_spec`, with ``$HDEVAL_LOCAL_PARALLEL`` slots."""
        kwargs.setdefault("n_parallel", _int_from_env(PARALLEL_ENV, 1, 1))
        return open_spec(cls, spec, kwargs)

    def complete(self, request: CompletionRequest) -> Completion:
        """Answer under the request's constraint; see the module docstring."""
        constraint = constraint_of(request)
        if isinstance(constraint, (Scale, Labels)) and constraint.single_token:
            return self._choose(request, constraint)
        return self._generate(request, constraint)

    def close(self) -> None:
        """Stop the server and free the model now rather than at garbage collection."""
        with self._lock:
            self._server = None

    def _call(self, messages: Sequence[Message], **body: Any) -> tuple[dict, int, int]:
        """(reply, prompt tokens, prompt tokens evaluated) of one chat completion."""
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
        prompt_tokens = token_count(usage.get("prompt_tokens"))
        evaluated = prompt_tokens if timings.get("prompt_n") is None else token_count(timings["prompt_n"])
        return dict(reply), prompt_tokens, evaluated

    def _error_message(self, err: Any) -> str:
        if not isinstance(err, Mapping):
            return f"llama.cpp error: {str(err)[:300]}"
        if err.get("type") == "exceed_context_size_error":
            n = token_count(err.get("n_prompt_tokens"))
            return (
                f"prompt of {n} tokens does not fit the local model's context of {self.n_ctx} tokens: "
                f"set {N_CTX_ENV} higher"
            )
        return f"llama.cpp error: {str(err.get('message', err))[:300]}"

    def _generate(self, request: CompletionRequest, constraint: Constraint | None) -> Completion:
        body: dict[str, Any] = {
            "max_tokens": int(request.max_tokens),
            "temperature": max(0.0, float(request.temperature)),
            "seed": self.seed if request.seed is None else int(request.seed),
            "repeat_penalty": 1.0,
            **to_llama_params(constraint),
        }
        n = int(request.top_logprobs or 0)
        if n > 0:
            body.update(logprobs=True, top_logprobs=min(n, MAX_ALTERNATIVES))
        reply, _, evaluated = self._call(request.messages, **body)
        try:
            completion = chat_completion(reply, n > 0)
        except ValueError:
            raise BackendError("llama.cpp reply holds no choices") from None
        return dataclasses.replace(completion, prompt_tokens_evaluated=evaluated)

    def _choose(self, request: CompletionRequest, constraint: Scale | Labels) -> Completion:
        """One word of ``constraint``: see :mod:`hdeval.llm.backends.llama_server`."""
        reply, prompt_tokens, evaluated = self._call(request.messages, **choose_params(constraint, self.seed))
        return choose_completion(reply, constraint, request, prompt_tokens, evaluated)
