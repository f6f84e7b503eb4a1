"""The same run through llama.cpp's HTTP server and through the embedded runtime, on the same GGUF.

    python benchmarks/bench_llamacpp_server.py --method direct --limit 24
    python benchmarks/bench_llamacpp_server.py --method hdeval --layers 2 --limit 24

Starts llama.cpp's server (xllamacpp.Server, 127.0.0.1, one slot) set up as the embedded runtime
sets up its own (threads, batch size, context), trains through it with ``--concurrency 1`` and the
dialect asked of the server, then trains the same run with ``--llm local``, and prints one JSON
line: the unreadable share of each, and the correlation and largest difference of the criterion
scores both have. With the bundled SmolLM2-135M the figures are a smoke test of the plumbing,
not of a judge. Needs ``.[local]`` and the task's data (``HDEVAL_DATA_DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from hdeval.llm.backends.llama_cpp import default_model_path
from hdeval.llm.backends.xllamacpp import CACHE_RAM_MIB
from hdeval.run.train import train


def start_server(model: Path, threads: int):
    import xllamacpp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.n_ctx = 4096
    params.n_parallel = 1
    params.n_batch = 512
    params.cache_ram_mib = CACHE_RAM_MIB
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
    params.warmup = False
    params.verbosity = -1
    params.hostnames = ["127.0.0.1"]
    params.port = port
    server = xllamacpp.Server(params)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url + "/models", timeout=2).raise_for_status()
            return server, url
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="topical_chat")
    ap.add_argument("--method", default="direct")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--limit", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads, the same on both sides")
    args = ap.parse_args()
    os.environ["HDEVAL_LLM_DIALECT"] = "auto"
    os.environ["HDEVAL_LLAMACPP_THREADS"] = str(args.threads)
    model = default_model_path()
    options = {"layers": args.layers} if args.layers else {}
    common = dict(task=args.task, method=args.method, limit=args.limit, **options)
    with tempfile.TemporaryDirectory() as tmp:
        began = time.monotonic()
        server, url = start_server(model, args.threads)
        served = train(llm=model.name, base_url=url, cache_dir=str(Path(tmp) / "s"), concurrency=1, **common)
        del server
        served_s, began = time.monotonic() - began, time.monotonic()
        embedded = train(llm="local", cache_dir=str(Path(tmp) / "e"), **common)
        embedded_s = time.monotonic() - began
    # the criterion columns both scored (not the ids, the split or the human scores)
    shared = [
        c
        for c in served.score_table.columns
        if c in set(embedded.score_table.columns) and c not in ("sample_id", "split") and not c.startswith("human:")
    ]
    a = served.score_table[shared].to_numpy(float).ravel()
    b = embedded.score_table[shared].to_numpy(float).ravel()
    ok = ~np.isnan(a) & ~np.isnan(b)
    print(json.dumps({
        "task": args.task, "method": args.method, "layers": args.layers, "limit": args.limit,
        "threads": args.threads, "load_average": os.getloadavg(),
        "seconds": {"served": round(served_s, 1), "embedded": round(embedded_s, 1)},
        "columns": {"shared": len(shared), "served": len(served.score_table.columns),
                    "embedded": len(embedded.score_table.columns)},
        "cells": int(ok.sum()),
        "unreadable": {"served": float(np.isnan(a).mean()), "embedded": float(np.isnan(b).mean())},
        "correlation": float(np.corrcoef(a[ok], b[ok])[0, 1]),
        "largest_difference": float(np.abs(a[ok] - b[ok]).max()),
        "embedded_spread": float(np.ptp(b[ok])),
        # why a deeper layer was not scored or kept, when it was not
        "stopped": {"served": served.metrics.get("stopped"), "embedded": embedded.metrics.get("stopped")},
    }, default=str))


if __name__ == "__main__":
    main()
