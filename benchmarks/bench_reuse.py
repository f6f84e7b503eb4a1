"""KV-cache prefix reuse of the local llama.cpp backend: with and without.

Scores the same real samples on every layer-1 criterion of a built-in task twice, once with
prefix reuse and once re-evaluating each prompt from its first token, using hdeval's real
scoring requests in hdeval's real order (sample-major: all criteria of one sample back to
back). Calls go straight to the backend, never through the disk cache, so every call is
real work. Each sample comes from a different source document, so reuse is measured only
between the criteria of one sample (the conservative case: training data that keeps the
outputs of one article together shares even more).

    python benchmarks/bench_reuse.py --task summeval --samples 3
    python benchmarks/bench_reuse.py --task topical_chat --samples 3 --model /path/model.gguf

Data: ``$HDEVAL_DATA_DIR`` or ``--data-dir`` (default: ``../shared/data`` next to the repo).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hdeval.core.types import CriteriaTree, Sample
from hdeval.data.samples import read_samples
from hdeval.data.tasks import load_task
from hdeval.judge.prompts import load_template
from hdeval.judge.scoring import parse_score, scoring_request
from hdeval.llm.backends.base import Completion, CompletionRequest
from hdeval.llm.backends.llama_cpp import LlamaCppBackend

REPO = Path(__file__).resolve().parents[1]


@dataclass
class ModeResult:
    mode: str
    calls: int
    prompt_tokens: int
    prompt_tokens_evaluated: int
    wall_s: float
    first_s: float  # mean time of the first criterion call of a sample
    further_s: float  # mean time of each further criterion call of the same sample

    @property
    def evaluated_per_call(self) -> float:
        return self.prompt_tokens_evaluated / self.calls

    @property
    def s_per_call(self) -> float:
        return self.wall_s / self.calls

    @property
    def evaluated_per_s(self) -> float:
        return self.prompt_tokens_evaluated / self.wall_s

    @property
    def prompt_per_s(self) -> float:
        """Prompt tokens served per second (what the caller sees), evaluated or reused."""
        return self.prompt_tokens / self.wall_s


def pick_samples(path: Path, task_name: str, n: int) -> list[Sample]:
    """The first sample of each of the first ``n`` source documents in the file."""
    task = load_task(task_name)
    out: list[Sample] = []
    seen: set[str] = set()
    for s in read_samples(path, task, require_scores=False):
        if s.doc_id not in seen:
            seen.add(s.doc_id)
            out.append(s)
        if len(out) == n:
            break
    return out


def run_mode(
    backend: LlamaCppBackend, requests: list[CompletionRequest], n_criteria: int, reuse: bool
) -> tuple[ModeResult, list[Completion]]:
    backend.reuse = reuse
    backend.reset()  # both modes start from an empty KV cache
    completions: list[Completion] = []
    times: list[float] = []
    t0 = time.perf_counter()
    for req in requests:
        t = time.perf_counter()
        completions.append(backend.complete(req))
        times.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    first = times[::n_criteria]
    further = [t for i, t in enumerate(times) if i % n_criteria]
    result = ModeResult(
        mode="reuse" if reuse else "no reuse",
        calls=len(completions),
        prompt_tokens=sum(c.prompt_tokens for c in completions),
        prompt_tokens_evaluated=sum(c.prompt_tokens_evaluated or 0 for c in completions),
        wall_s=wall,
        first_s=sum(first) / len(first),
        further_s=sum(further) / max(1, len(further)),
    )
    return result, completions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="summeval", help="built-in task (default: summeval)")
    ap.add_argument("--samples", type=int, default=3, help="samples, each from its own document")
    ap.add_argument("--model", help="GGUF file (default: the bundled SmolLM2-135M)")
    ap.add_argument("--data-dir", help="folder with <task>.jsonl (default: $HDEVAL_DATA_DIR or ../shared/data)")
    ap.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: all cores)")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = ap.parse_args(argv)

    task = load_task(args.task)
    data_dir = Path(args.data_dir or os.environ.get("HDEVAL_DATA_DIR") or REPO.parent / "shared" / "data")
    samples = pick_samples(data_dir / task.data_file, args.task, args.samples)
    tree = CriteriaTree.from_aspects(task.aspects)
    template = load_template("score")
    # hdeval's own order: every criterion of one sample back to back
    requests = [scoring_request(template, task, tree, c, s) for s in samples for c in tree]

    # Other processes skew every figure; the 1-minute load average before we start says how much.
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    backend = LlamaCppBackend.from_spec(
        f"llamacpp:{args.model}" if args.model else "local", n_threads=args.threads
    )
    load_s = time.perf_counter() - t0
    # Warm-up outside the timings: the first decode allocates llama.cpp's compute buffers.
    backend.complete(requests[0])

    # No reuse first, so that if anything warms up over time it flatters the baseline.
    off, c_off = run_mode(backend, requests, len(tree), reuse=False)
    on, c_on = run_mode(backend, requests, len(tree), reuse=True)

    diffs = [abs(parse_score(a)[0] - parse_score(b)[0]) for a, b in zip(c_off, c_on)]
    diffs = [d for d in diffs if not math.isnan(d)]
    n_crit = len(tree)

    print(
        f"model: {backend.identity}  (loaded in {load_s:.1f} s; {backend.n_threads} of "
        f"{os.cpu_count()} cores; n_ctx {backend.n_ctx}; load average before start {load_before:.1f})"
    )
    print(
        f"task: {args.task}, {len(samples)} samples x {n_crit} criteria = {len(requests)} calls; "
        f"prompt tokens per call {min(c.prompt_tokens for c in c_on)}-{max(c.prompt_tokens for c in c_on)}"
    )
    header = (
        f"{'mode':<9} {'calls':>5} {'prompt tok':>10} {'evaluated':>9} {'eval/call':>9} {'wall s':>7} "
        f"{'s/call':>7} {'1st s':>6} {'next s':>6} {'eval tok/s':>10} {'prompt tok/s':>12}"
    )
    print(header)
    for r in (off, on):
        print(
            f"{r.mode:<9} {r.calls:>5} {r.prompt_tokens:>10} {r.prompt_tokens_evaluated:>9} "
            f"{r.evaluated_per_call:>9.1f} {r.wall_s:>7.2f} {r.s_per_call:>7.3f} {r.first_s:>6.2f} "
            f"{r.further_s:>6.2f} {r.evaluated_per_s:>10.0f} {r.prompt_per_s:>12.0f}"
        )
    print("(1st s / next s: mean seconds of a sample's first criterion call / of each further one)")
    tok_ratio = off.prompt_tokens_evaluated / max(1, on.prompt_tokens_evaluated)
    time_ratio = off.wall_s / on.wall_s
    print(f"no-reuse / reuse: tokens evaluated x{tok_ratio:.2f}, wall time x{time_ratio:.2f}")
    print(f"score agreement between modes: max |diff| {max(diffs, default=float('nan')):.4f} over {len(diffs)} parsed scores")
    if args.json:
        print(
            json.dumps(
                {
                    "task": args.task,
                    "model": backend.identity,
                    "samples": len(samples),
                    "criteria": n_crit,
                    "threads": backend.n_threads,
                    "load_average_before": load_before,
                    "modes": [
                        {**asdict(r), "s_per_call": r.s_per_call, "evaluated_per_s": r.evaluated_per_s}
                        for r in (off, on)
                    ],
                    "ratio_tokens": tok_ratio,
                    "ratio_time": time_ratio,
                    "max_score_diff": max(diffs, default=None),
                }
            )
        )
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
