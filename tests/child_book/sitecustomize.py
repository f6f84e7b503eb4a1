"""Test-only, for the child processes of a test session (``tests/conftest.py`` puts this folder on
their PYTHONPATH and sets HDEVAL_TEST_BOOK_DIR): every hdeval request built in the child with a
kind is entered, with its declared kind and data, in a JSONL file of that folder, so a test
server of the parent (:class:`llm_server.RequestBook`) answers it as the fake LLM would. A real
server never sees any of it: kind and data are never sent."""

import json
import os

_DIR = os.environ.get("HDEVAL_TEST_BOOK_DIR")

if _DIR and os.path.isdir(_DIR):
    try:
        from hdeval.llm.backends.base import CompletionRequest
    except ImportError:  # a child that is not an hdeval process
        CompletionRequest = None

    if CompletionRequest is not None:
        _real_init = CompletionRequest.__init__
        # one file per process, never shared with a later process that reuses the pid
        _path = os.path.join(_DIR, f"{os.getpid()}-{os.urandom(6).hex()}.jsonl")

        def _init(request, *args, **kwargs):
            _real_init(request, *args, **kwargs)
            if request.kind:
                line = json.dumps({"messages": [[m.role, m.content] for m in request.messages],
                                   "kind": request.kind, "data": dict(request.data)}, ensure_ascii=False)
                # one write of a whole line in append mode: lines of concurrent threads do not mix
                fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                try:
                    os.write(fd, (line + "\n").encode("utf-8", "surrogatepass"))
                finally:
                    os.close(fd)

        CompletionRequest.__init__ = _init
