"""LLM backends. Every LLM call in hdeval goes through one of these, wrapped by the cache."""

from hdeval.llm.backends.base import Backend, Completion, CompletionRequest, Message, TokenLogprob
from hdeval.llm.backends.factory import make_backend

__all__ = ["Backend", "Completion", "CompletionRequest", "Message", "TokenLogprob", "make_backend"]
