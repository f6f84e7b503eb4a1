"""Running a fitted evaluator over files, for the CLI and the Python API alike: streaming
``apply`` (:mod:`.apply`), its shards and their merge (:mod:`.shards`), the atomic output
writer (:mod:`.output`) and which LLM an artifact is scored with (:mod:`.artifact_llm`).
Nothing here prints: messages go to the caller's ``notify``."""
