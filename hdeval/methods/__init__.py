"""The methods hdeval hosts, each behind the seam in :mod:`hdeval.methods.base`."""

from hdeval.methods.base import METHODS, Fitted, Method, ScoreResult, get_method, method_names

__all__ = ["METHODS", "Fitted", "Method", "ScoreResult", "get_method", "method_names"]
