"""The floor everything stands on: errors, shared types, metrics, paths, progress, URLs and
redaction. It imports nothing else of hdeval."""
