"""A learned jury on real human labels, its judges served over HTTP (issue #36, "Done means").

SIMULATED JUDGES. Each judge is a small OpenAI-compatible test server on 127.0.0.1
(``tests/llm_server.py``'s FaultServer, fault-free) answering like ``tests/simjudge.py``'s
``pointwise_backend``: it knows each sample's human score (``real_rows`` writes it into the
output) and reads it with realistic errors of its own seed: a halo shared by every criterion of a
sample, a misreading shared by the criteria of one aspect, each criterion's own noise, and a
misreading every judge makes alike (``shared``). Three judges of different quality: their
errors are those sizes times 1, 1.3 and 1.7.

Per data set and seed: the servers start with that seed, the real CLI trains a jury on them
(``hdeval train --jury jury.toml --seed S``; each judge's key in its own variable, checked by
its server), and ``metrics.json`` gives, on the held-out documents, the average Spearman of the
learned jury, of each judge alone (direct and HD-Eval on its own columns) and of the jury mean.
The table: means over seeds and a 95% t-interval of the per-seed differences (learned minus it).

    python benchmarks/bench_jury_servers.py --sets sfhot,topical_chat --seeds 5

``--checks``: the issue's other measured items, on one server answering as several simulated
models (by the request's model): a jury of two judges and one that is pure noise trained with
``--prune-judges``, then ``hdeval apply`` on held-out documents, counting each model's requests
at the server; and ``hdeval refit`` of a one-judge artifact to a weaker judge.

    python benchmarks/bench_jury_servers.py --checks --sets sfhot --seeds 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

BASE = {"noise": 0.7, "halo": 0.8, "misreading": 1.6, "shared": 0.6, "deep_signal": True}
SCALES = (1.0, 1.3, 1.7)  # three judges of different quality
SECRET = "sk-bench-jury-{}-do-not-write"


def one_run(name: str, seed: int, layers: int, workdir: Path, aggregator: str) -> dict:
    from llm_server import FaultServer, child_book_env
    from simjudge import pointwise_backend, real_rows

    import hdeval.methods.hdeval.fake  # noqa: F401  (registers the fake decomposer)
    from hdeval.data.tasks import load_task

    task = load_task(name)
    rows = real_rows(Path(os.environ["HDEVAL_DATA_DIR"]) / f"{name}.jsonl", task, None, seed)
    run = workdir / f"{name}-{seed}"
    run.mkdir()
    data = run / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    # the servers answer from each request's declared kind and data: the CLI enters them in a book
    servers, tables, env = [], [], child_book_env(dict(os.environ), str(run / "book"))
    (run / "book").mkdir()
    try:
        for i, scale in enumerate(SCALES, 1):
            judge = {k: v * scale if k in ("noise", "halo", "misreading") else v for k, v in BASE.items()}
            srv = FaultServer(None, lifetime=3600.0, max_requests=10**6)
            srv.fake = pointwise_backend(**judge, seed=f"judge{i}-seed{seed}")
            srv.require_key = SECRET.format(i)
            srv.start()
            servers.append(srv)
            env[f"JUDGE{i}_KEY"] = SECRET.format(i)
            tables.append(
                f'[[judge]]\nname = "j{i}"\nllm = "sim-judge-{i}"\nbase_url = "{srv.url}"\n'
                f'api_key_env = "JUDGE{i}_KEY"\nprice_in = {0.15 * i}\nprice_out = {0.6 * i}\n'
            )
        jury = run / "jury.toml"
        jury.write_text("".join(tables), encoding="utf-8")
        art = run / "artifact"
        cmd = ["hdeval", "train", "--task", name, "--data", str(data), "--jury", str(jury), "--layers", str(layers),
               "--aggregator", aggregator, "--seed", str(seed), "--cache-dir", str(run / "cache"), "-q",
               "-o", str(art)]
        t0 = time.time()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        seconds = time.time() - t0
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
        calls = [s.calls for s in servers]
    finally:
        for s in servers:
            s.stop()
    metrics = json.loads((art / "metrics.json").read_text(encoding="utf-8"))
    # the keys went to the servers (each checked its own) and nowhere else
    for path in run.rglob("*"):
        if path.is_file() and path.name != "data.jsonl":
            blob = path.read_bytes()
            assert not any(SECRET.format(i).encode() in blob for i in range(1, 4)), path
    b = metrics["jury"]["baselines"]
    out = {"learned jury": b["learned"]["average"]["spearman"], "jury mean": b["jury_mean"]["average"]["spearman"]}
    for n, v in b["judges"].items():
        out[f"{n} direct"] = v["direct"]["average"]["spearman"]
        out[f"{n} HD-Eval"] = v["hdeval"]["average"]["spearman"]
    out["effective judges"] = metrics["jury"]["effective_judges"]
    out["seconds"] = seconds
    out["calls"] = sum(calls)
    out["test"] = metrics["split"]["test"]
    return out


def models_server(judges: dict, key: str):
    """One test server answering as several simulated models: model name -> backend."""
    from llm_server import LLMServer, Reply, RequestBook, completion_body, completion_request

    srv = LLMServer()
    book = RequestBook().__enter__()  # the requests' declared kind and data (from the CLI's book)

    def answer(req):
        if req.headers.get("authorization") != f"Bearer {key}":
            return Reply.error(401, "Incorrect API key provided")
        model = req.json.get("model") if isinstance(req.json, dict) else None
        if model not in judges:
            return Reply.error(404, f"no model {model!r}")
        declared = book.declared(req.json)
        if declared is None:
            return Reply.error(400, "a request no book holds")
        c = judges[model].complete(completion_request(req.json, declared))
        return Reply.json(completion_body(c, model))

    srv.default = answer
    return srv.start()


def checks(name: str, seed: int, workdir: Path) -> dict:
    """--prune-judges with a pure-noise judge, apply's calls per judge, and refit to a weaker judge."""
    from simjudge import pointwise_backend, real_rows

    import hdeval.methods.hdeval.fake  # noqa: F401  (registers the fake decomposer)
    from hdeval.data.tasks import load_task

    task = load_task(name)
    rows = real_rows(Path(os.environ["HDEVAL_DATA_DIR"]) / f"{name}.jsonl", task, None, seed)
    docs = sorted({r["doc_id"] for r in rows})
    new_docs = set(np.random.default_rng(seed).choice(docs, size=len(docs) // 5, replace=False))
    run = workdir / f"checks-{name}-{seed}"
    run.mkdir()
    data, new = run / "data.jsonl", run / "new.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows if r["doc_id"] not in new_docs), encoding="utf-8")
    new.write_text("".join(json.dumps(r) + "\n" for r in rows if r["doc_id"] in new_docs), encoding="utf-8")
    judge = lambda scale, tag: pointwise_backend(  # noqa: E731
        **{k: v * scale if k in ("noise", "halo", "misreading") else v for k, v in BASE.items()},
        seed=f"{tag}-seed{seed}")
    models = {"sim-good": judge(1.0, "good"), "sim-fair": judge(1.3, "fair"), "sim-weak": judge(2.5, "weak"),
              "sim-noise": pointwise_backend(noise_criteria=("",), seed=f"noise-seed{seed}")}
    key = SECRET.format("checks")
    from llm_server import child_book_env

    (run / "book").mkdir()
    env = child_book_env(dict(os.environ, OPENAI_API_KEY=key), str(run / "book"))
    srv = models_server(models, key)
    out: dict = {"set": name, "seed": seed}
    try:
        common = ["--base-url", srv.url, "--cache-dir", str(run / "cache"), "-q"]

        def hdeval(*args: str) -> str:
            done = subprocess.run(["hdeval", *args, *common], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"hdeval {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
            return done.stdout

        hdeval("train", "--task", name, "--data", str(data), "--llm", "sim-good", "--llm", "sim-fair",
               "--llm", "sim-noise", "--prune-judges", "--layers", "1", "--aggregator", "lr", "--seed", str(seed),
               "-o", str(run / "jury"))
        jury = json.loads((run / "jury" / "metrics.json").read_text(encoding="utf-8"))["jury"]
        out["dropped"], out["kept"] = jury["dropped"], jury["kept"]
        before = len(srv.requests)
        hdeval("apply", str(run / "jury"), str(new), "-o", str(run / "scored.jsonl"))
        asked = [r.json.get("model") if isinstance(r.json, dict) else f"{r.method} {r.path}"
                 for r in srv.requests[before:]]
        out["apply_calls"] = {m: asked.count(m) for m in sorted(set(asked), key=str)}
        out["apply_rows"] = sum(1 for _ in (run / "scored.jsonl").open(encoding="utf-8"))

        hdeval("train", "--task", name, "--data", str(data), "--llm", "sim-good", "--layers", "1",
               "--aggregator", "lr", "--seed", str(seed), "-o", str(run / "one"))
        hdeval("refit", str(run / "one"), "--llm", "sim-weak", "--data", str(data), "--seed", str(seed),
               "-o", str(run / "refit"))
        out["refit"] = json.loads((run / "refit" / "metrics.json").read_text(encoding="utf-8"))["refit"]
    finally:
        srv.stop()
    for path in run.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path
    return out


def interval(x: np.ndarray) -> tuple[float, float]:
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return float(x.mean() - half), float(x.mean() + half)


def table(runs: list[dict]) -> list[str]:
    keys = [k for k in runs[0] if k not in ("effective judges", "seconds", "calls", "test")]
    res = {k: np.array([r[k] for r in runs], float) for k in keys}
    singles = [k for k in keys if k.startswith("j")]
    res["best single judge, per seed"] = np.max([res[k] for k in singles], axis=0)
    learned = res["learned jury"]
    lines = ["| evaluator | held-out Spearman (mean) | learned jury minus it (mean, 95% CI) |", "|---|---|---|"]
    for k, v in res.items():
        if k == "learned jury":
            lines.append(f"| {k} | {v.mean():.3f} | |")
            continue
        d = learned - v
        lo, hi = interval(d)
        lines.append(f"| {k} | {v.mean():.3f} | {d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}] |")
    eff = np.mean([r["effective judges"] for r in runs])
    secs = [r["seconds"] for r in runs]
    lines.append("")
    lines.append(
        f"effective number of independent judges: {eff:.2f} (mean over seeds); held-out samples per seed: "
        f"{runs[0]['test']}; HTTP calls per run: {int(np.mean([r['calls'] for r in runs]))}; "
        f"train took {min(secs):.0f}-{max(secs):.0f} s per run"
    )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="sfhot,topical_chat")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--aggregator", default="lr")
    ap.add_argument("--checks", action="store_true", help="--prune-judges, apply and refit instead")
    args = ap.parse_args()
    if args.checks:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.sets.split(","):
                for seed in range(args.seeds):
                    print(json.dumps(checks(name, seed, Path(tmp))), flush=True)
        return
    for name in args.sets.split(","):
        load = os.getloadavg()[0]
        runs = []
        with tempfile.TemporaryDirectory() as tmp:
            for seed in range(args.seeds):
                runs.append(one_run(name, seed, args.layers, Path(tmp), args.aggregator))
                print(f"{name} seed {seed}: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
        print(f"\n## {name}, {args.seeds} seeds, --layers {args.layers}, --aggregator {args.aggregator}\n")
        print(f"load average (1 min) {load:.1f} before, {os.getloadavg()[0]:.1f} after; "
              f"`python benchmarks/bench_jury_servers.py --sets {name} --seeds {args.seeds} --layers {args.layers} "
              f"--aggregator {args.aggregator}`\n")
        print("\n".join(table(runs)), flush=True)


if __name__ == "__main__":
    main()
