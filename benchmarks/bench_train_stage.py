"""A training stage's time to first request and peak memory, prompts built up front (before)
against built as the client sends them (after) (issue #23 item 3).

One scoring stage the size of HD-Eval's layer 3 on full SummEval: every sample x 16 criteria
(each of the task's aspects with four sub-criteria), answered by the fake LLM into a fresh
cache. Each mode runs in its own process; printed side by side with ``uptime``:

- first request: seconds from the stage's start to the first call reaching the LLM;
- stage: the whole stage's wall time;
- peak RSS growth: the process's peak RSS (``ru_maxrss``) less its RSS just before the stage.

"before" is the pre-change path, kept callable: every cell (and its ~3 KB prompt) built into a
list, then :func:`hdeval.judge.fill.fill_matrix`; "after" is :func:`hdeval.judge.scoring.score_criteria`.

    HDEVAL_DATA_DIR=/work/shared/data python benchmarks/bench_train_stage.py
    python benchmarks/bench_train_stage.py --data-dir DIR --limit 400

Measured (all 1,600 SummEval samples x 16 criteria = 25,600 requests, fake LLM, 2 cores shared
with 7 other engineers, load average 13.6-14.6 while it ran):

              requests  first request     stage  peak RSS growth  peak RSS
    before       25600         7.35 s    38.2 s         183.0 MB    229 MB
    after        25600         0.86 s    32.3 s          47.5 MB     93 MB

The remaining growth is what the stage keeps by design (the client's set of keys it committed,
the matrix, the failures); the prompts (~3.3 KB each, ~85 MB here) are no longer all held.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rss_kb() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def child(mode: str, data_dir: str, limit: int | None, cache: str) -> dict:
    from hdeval.core.types import CriteriaTree, Criterion
    from hdeval.data.samples import limit_samples, read_task_samples
    from hdeval.data.tasks import load_task
    from hdeval.judge import scoring
    from hdeval.judge.fill import Cell, digit_score, fill_matrix
    from hdeval.judge.prompts import load_templates
    from hdeval.llm.backends.fake import FakeBackend
    from hdeval.llm.cache.client import CachedBackend

    task = load_task("summeval")
    samples = read_task_samples(Path(data_dir) / "summeval.jsonl", task, require_labels=True)
    samples = limit_samples(samples, limit, 0)
    tree = CriteriaTree.from_aspects(task.aspects)
    for a in task.aspects:
        tree = tree.with_children(a.key, [
            Criterion(f"{a.key}/sub{i}", f"{a.name} part {i}", f"How well the summary does part {i} of "
                      f"{a.name.lower()}: {a.definition}", a.key, 2) for i in range(4)])
    criteria = list(tree.layer(2))
    template = load_templates()["score"]
    first: list[float] = []
    real = FakeBackend.complete

    def timed(self, request):
        if not first:
            first.append(time.perf_counter())
        return real(self, request)

    FakeBackend.complete = timed
    client = CachedBackend(FakeBackend(record=False), cache)  # the fake keeps no log of requests
    rss0 = _rss_kb()
    t0 = time.perf_counter()
    try:
        if mode == "before":
            cells = [Cell(s.id, c.key, (scoring.scoring_request(template, task, tree, c, s),))
                     for s in samples for c in criteria]
            m = fill_matrix(client, cells, digit_score(scoring.SCALE))
        else:
            m = scoring.score_criteria(client, template, task, tree, criteria, samples)
    finally:
        client.close()
    t1 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": mode, "requests": len(samples) * len(criteria), "first_request_s": first[0] - t0,
            "stage_s": t1 - t0, "peak_growth_mb": (peak - rss0) / 1024, "peak_mb": peak / 1024,
            "nan": int(sum(1 for v in m.values.ravel() if v != v))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.environ.get("HDEVAL_DATA_DIR"))
    ap.add_argument("--limit", type=int, default=None, help="samples (default: all)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.data_dir or not (Path(args.data_dir) / "summeval.jsonl").is_file():
        sys.exit("needs summeval.jsonl in --data-dir or HDEVAL_DATA_DIR")
    if args.child:
        print(json.dumps(child(args.child, args.data_dir, args.limit, args.cache)))
        return
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    rows = []
    for mode in ("before", "after"):
        with tempfile.TemporaryDirectory() as cache:
            cmd = [sys.executable, __file__, "--child", mode, "--data-dir", args.data_dir, "--cache", cache]
            if args.limit:
                cmd += ["--limit", str(args.limit)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    print(f"{'':8} {'requests':>9} {'first request':>14} {'stage':>9} {'peak RSS growth':>16} {'peak RSS':>9}")
    for r in rows:
        print(f"{r['mode']:8} {r['requests']:>9} {r['first_request_s']:>12.2f} s {r['stage_s']:>7.1f} s "
              f"{r['peak_growth_mb']:>13.1f} MB {r['peak_mb']:>6.0f} MB")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
