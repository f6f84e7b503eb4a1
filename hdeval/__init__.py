"""hdeval: train aligned LLM evaluators with hierarchical criteria decomposition (HD-Eval)."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy so that `import hdeval` stays cheap and the CLI starts fast.
    if name == "train":
        from hdeval.train import train

        return train
    if name == "Evaluator":
        from hdeval.evaluator import Evaluator

        return Evaluator
    if name == "TrainConfig":
        from hdeval.train import TrainConfig

        return TrainConfig
    raise AttributeError(name)


__all__ = ["Evaluator", "TrainConfig", "train", "__version__"]
