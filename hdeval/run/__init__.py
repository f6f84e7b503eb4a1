"""A run of any method: training, the notebook API, and applying a fitted evaluator over files.
Nothing here prints: messages go to the caller's ``notify``."""
