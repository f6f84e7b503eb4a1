"""Compare the two embedded llama.cpp runtimes on the same GGUF, side by side in one run.

    python benchmarks/bench_local_runtime.py --task summeval --samples 5 [--model PATH] [--threads 1]
    python benchmarks/bench_local_runtime.py --install   # also time `pip install xllamacpp` in a fresh venv

For each runtime (xllamacpp, llama-cpp-python): model load time, scoring wall time over the
same sample-major requests built by hdeval's own scoring prompt, prompt tokens evaluated
(prefix reuse), prompt tokens per second, and how far its scores are from the other's.
With the bundled SmolLM2-135M the figures are a smoke test of the machinery, not of a judge.
Needs both runtimes installed (``.[local]`` and ``.[local-llamacpp]``) and the task's data.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hdeval.core.types import CriteriaTree
from hdeval.data.samples import find_data, read_samples
from hdeval.data.tasks import load_task
from hdeval.judge.prompts import load_template
from hdeval.judge.scoring import parse_score, score_requests
from hdeval.llm.backends.llama_cpp import LlamaCppBackend, default_model_path
from hdeval.llm.backends.xllamacpp import XLlamaCppBackend


def time_install(package: str) -> float:
    """Seconds for ``pip install PACKAGE`` into a fresh virtual environment."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "venv", tmp], check=True)
        start = time.perf_counter()
        subprocess.run([str(Path(tmp) / "bin" / "pip"), "install", "-q", package], check=True)
        return time.perf_counter() - start


def run(name: str, make, requests) -> dict:
    start = time.perf_counter()
    backend = make()
    load = time.perf_counter() - start
    start = time.perf_counter()
    completions = [backend.complete(r) for r in requests]
    wall = time.perf_counter() - start
    backend.close()
    evaluated = sum(c.prompt_tokens_evaluated or 0 for c in completions)
    return {
        "name": name,
        "load_s": load,
        "wall_s": wall,
        "prompt_tokens": sum(c.prompt_tokens for c in completions),
        "evaluated": evaluated,
        "scores": [parse_score(c)[0] for c in completions],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="summeval")
    ap.add_argument("--data", default=None)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--model", default=None, help="GGUF file (default: the bundled SmolLM2-135M)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--install", action="store_true", help="also time pip install xllamacpp in a fresh venv")
    args = ap.parse_args()

    task = load_task(args.task)
    tree = CriteriaTree.from_aspects(task.aspects)
    samples = read_samples(find_data(task, args.data), task)[: args.samples]
    requests = score_requests(load_template("score"), task, tree, list(tree), samples)
    model = Path(args.model) if args.model else default_model_path()
    print(f"{len(requests)} scoring requests ({len(samples)} samples x {len(tree)} criteria), "
          f"model {model.name}, {args.threads} thread(s)")

    results = [
        run("xllamacpp", lambda: XLlamaCppBackend(model, n_threads=args.threads), requests),
        run("llama-cpp-python", lambda: LlamaCppBackend(model, n_threads=args.threads), requests),
    ]
    print(f"{'runtime':<18}{'load s':>8}{'score s':>9}{'prompt tok':>11}{'evaluated':>10}{'eval tok/s':>11}")
    for r in results:
        print(f"{r['name']:<18}{r['load_s']:>8.1f}{r['wall_s']:>9.1f}{r['prompt_tokens']:>11}"
              f"{r['evaluated']:>10}{r['evaluated'] / r['wall_s']:>11.0f}")
    a, b = results
    diffs = [abs(x - y) for x, y in zip(a["scores"], b["scores"]) if not (math.isnan(x) or math.isnan(y))]
    nan = sum(math.isnan(x) for x in a["scores"]), sum(math.isnan(y) for y in b["scores"])
    print(f"scoring time ratio llama-cpp-python / xllamacpp: {b['wall_s'] / a['wall_s']:.2f}")
    if diffs:
        print(f"score difference over {len(diffs)} requests: mean {sum(diffs) / len(diffs):.3f}, "
              f"max {max(diffs):.3f}; unusable replies: {nan[0]} vs {nan[1]}")
    if args.install:
        print(f"pip install xllamacpp in a fresh venv: {time_install('xllamacpp'):.1f} s "
              "(llama-cpp-python compiles llama.cpp: 4.5-28 min measured on 2 cores)")


if __name__ == "__main__":
    main()
