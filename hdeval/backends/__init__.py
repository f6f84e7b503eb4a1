"""LLM backends. Every LLM call in hdeval goes through one of these, wrapped by the cache."""

from hdeval.backends.base import Backend, Completion, CompletionRequest, Message, TokenLogprob
from hdeval.backends.factory import LLMSpec, make_backend

__all__ = [
    "Backend",
    "Completion",
    "CompletionRequest",
    "LLMSpec",
    "Message",
    "TokenLogprob",
    "make_backend",
]
