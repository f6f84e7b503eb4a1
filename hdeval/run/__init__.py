"""Running a fitted evaluator over files, for the CLI and the Python API alike. Nothing here
prints: messages go to the caller's ``notify``."""
