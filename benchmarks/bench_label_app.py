"""The labelling app's speed (issue #34): the next-sample latency on a 10,000-sample pool, and
the background re-fit's time at 50, 200 and 1,000 labels.

The pool's criterion scores are synthetic (10 criteria, each a noisy view of two hidden
qualities; the "human" labels are those qualities on the 1-5 scale), so no LLM is involved: what
is timed is the app's own work. The latency is what a person waits for between pressing the
last key and the next sample: POST /api/label (the label committed to labels.db, WAL,
synchronous=FULL) then GET / (the pick, by :mod:`hdeval.learn.selection`, and the page), through
Starlette's TestClient, the re-fit kept out of the way. Prints the median and 95th percentile per
strategy, the re-fit times, and the load average (the machine is shared).

    python benchmarks/bench_label_app.py                  # 10,000 samples, 40 labels per strategy
    python benchmarks/bench_label_app.py --pool 2000 --labels 20
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from hdeval.app.labels import LabelStore
from hdeval.app.server import build_app
from hdeval.app.session import LabelSession
from hdeval.core.types import Sample
from hdeval.data.tasks import task_from_dict
from hdeval.learn import selection

TASK = {
    "name": "bench_label", "description": "Answers to questions.", "output_label": "Answer",
    "fields": [{"key": "source", "label": "Question"}, {"key": "output", "label": "Answer"}],
    "aspects": [{"key": "clarity", "name": "Clarity", "definition": "How clear.", "range": [1, 5]},
                {"key": "accuracy", "name": "Accuracy", "definition": "How correct.", "range": [1, 5]}],
}


def pool(n: int, seed: int = 0) -> tuple[list[Sample], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    hidden = rng.uniform(1, 5, (n, 2))
    X = np.clip(np.repeat(hidden, 5, axis=1) + rng.normal(0, 0.8, (n, 10)), 1, 5)
    samples = [Sample(f"s{i}", f"d{i // 4}", {"source": f"Question {i // 4}?", "output": f"Answer {i}."})
               for i in range(n)]
    return samples, X, np.rint(hidden)


def session_with(samples, X, db: Path, strategy: str | None, refit_every: int = 10**9) -> LabelSession:
    s = LabelSession(task_from_dict(TASK, "bench"), samples, LabelStore(db, task_from_dict(TASK, "bench")),
                     strategy=strategy, refit_every=refit_every)
    s.set_criteria([f"c{j}" for j in range(X.shape[1])])
    s.add_scores(np.arange(len(samples)), X)
    return s


def latency(samples, X, y, strategy: str | None, n_labels: int, tmp: Path) -> list[float]:
    from starlette.testclient import TestClient

    s = session_with(samples, X, tmp / f"latency-{strategy}.db", strategy)
    c = TestClient(build_app(s), base_url="http://127.0.0.1:8765")
    h = {"X-Hdeval": "1"}
    c.post("/api/rater", json={"name": "bench"}, headers=h)
    sid = re.search(r'data-sample-id="([^"]+)"', c.get("/").text).group(1)
    times = []
    for _ in range(n_labels):
        i = s.index[sid]
        start = time.perf_counter()
        c.post("/api/label", json={"sample_id": sid, "values": {"clarity": y[i, 0], "accuracy": y[i, 1]}},
               headers=h)
        page = c.get("/").text
        times.append(time.perf_counter() - start)
        sid = re.search(r'data-sample-id="([^"]+)"', page).group(1)
    s.store.close()
    return times


def refit_time(samples, X, y, n_labels: int, tmp: Path) -> tuple[float, float | None]:
    s = session_with(samples, X, tmp / f"refit-{n_labels}.db", "random")
    rng = np.random.default_rng(n_labels)
    for i in rng.choice(len(samples), n_labels, replace=False):
        s.store.add(samples[i], {"clarity": y[i, 0], "accuracy": y[i, 1]}, rater="bench", session="b")
    s._reload()
    start = time.perf_counter()
    fit = s.refit()
    took = time.perf_counter() - start
    s.store.close()
    return took, fit.agreement


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pool", type=int, default=10_000)
    ap.add_argument("--labels", type=int, default=40, help="labels timed per strategy")
    ap.add_argument("--refits", default="50,200,1000")
    args = ap.parse_args()
    samples, X, y = pool(args.pool)
    print(f"pool: {args.pool} samples x {X.shape[1]} criteria; load average at start {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print("\nnext-sample latency (POST /api/label + GET /), ms:")
        print("| strategy | labels | median | p95 | max |\n|---|---|---|---|---|")
        for strategy in (None, *selection.STRATEGIES):
            t = np.array(latency(samples, X, y, strategy, args.labels, tmp)) * 1000
            name = strategy or f"app default ({selection.DEFAULT})"
            print(f"| {name} | {args.labels} | {np.median(t):.0f} | {np.percentile(t, 95):.0f} | {t.max():.0f} |")
        print("\nre-fit (selection.assess, aggregator chosen as train's auto), s:")
        print("| labels | seconds | agreement |\n|---|---|---|")
        for n in (int(v) for v in args.refits.split(",")):
            took, agreement = refit_time(samples, X, y, n, tmp)
            print(f"| {n} | {took:.1f} | {agreement if agreement is None else f'{agreement:.3f}'} |")
    print(f"\nload average at end {os.getloadavg()} (2 cores, shared)")


if __name__ == "__main__":
    main()
