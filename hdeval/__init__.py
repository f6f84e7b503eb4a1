"""hdeval: train aligned LLM evaluators with hierarchical criteria decomposition (HD-Eval)."""

__version__ = "0.1.0"

# Imported eagerly: `hdeval.train` is both a submodule and the function, and a lazy
# attribute would be shadowed by the submodule once anything imported it.
from hdeval.evaluator import Evaluator  # noqa: E402
from hdeval.train import TrainConfig, train  # noqa: E402

__all__ = ["Evaluator", "TrainConfig", "train", "__version__"]
