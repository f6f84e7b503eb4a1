"""`hdeval benchmark` and `--preset`: the statistics on hand-computed cases, the paper presets
(an aspect fitted by its own regressor), and an end-to-end sweep with the fake LLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import TOY_TASK, toy_rows, write_jsonl

from hdeval.benchmark.statistics import (
    pooled_bootstrap_ci,
    pooled_paired_bootstrap,
    ranking_exact_match,
    summary_level_correlation,
)
from hdeval.cli import cli
from hdeval.core.errors import ConfigError
from hdeval.core.metrics import average_spearman as avg_spearman

PRESETS = """
[presets.solo]
aspects = ["clarity", "accuracy"]
own_regressor = ["accuracy"]

[presets.clear]
aspects = ["clarity"]
"""


def _noisy(n_docs: int = 40, per_doc: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    groups = [f"d{d}" for d in range(n_docs) for _ in range(per_doc)]
    y = rng.normal(size=(len(groups), 2))
    return y, groups, rng


# ------------------------------------------------------------------ bootstrap
def test_paired_bootstrap_of_identical_methods_finds_no_difference() -> None:
    y, groups, rng = _noisy()
    pred = y + rng.normal(size=y.shape)
    r = pooled_paired_bootstrap([(y, pred, pred.copy(), groups)], n_resamples=200, seed=1)
    assert r["difference"] == 0 and r["low"] <= 0 <= r["high"]
    assert r["p_value"] == 1.0


def test_paired_bootstrap_of_a_constant_shift_excludes_zero() -> None:
    y, groups, rng = _noisy()
    pred = rng.normal(size=y.shape)
    mean_pred = lambda yy, pp: float(np.mean(pp))  # noqa: E731
    r = pooled_paired_bootstrap([(y, pred + 0.5, pred, groups)], statistic=mean_pred, n_resamples=200, seed=0)
    assert r["difference"] == pytest.approx(0.5) and r["low"] == pytest.approx(0.5) == r["high"]
    assert r["p_value"] < 0.02  # every resampled difference is on one side


def test_paired_bootstrap_tells_a_better_evaluator_from_a_random_one() -> None:
    y, groups, rng = _noisy(60)
    good = y + 0.5 * rng.normal(size=y.shape)
    random = rng.normal(size=y.shape)
    r = pooled_paired_bootstrap([(y, good, random, groups)], n_resamples=300, seed=0)
    assert r["difference"] == pytest.approx(avg_spearman(y, good) - avg_spearman(y, random), abs=1e-6)
    assert 0 < r["low"] <= r["difference"] <= r["high"] and r["p_value"] < 0.01
    assert pooled_paired_bootstrap([(y, random, good, groups)], n_resamples=300, seed=0)["high"] < 0


def test_bootstrap_resamples_whole_documents_and_is_seeded() -> None:
    # Document a has 3 rows (y 0), document b 1 row (y 1): a resample holds whole documents, so
    # a's rows come in threes, and it holds as many documents as there are (2 here).
    y = np.array([0.0, 0.0, 0.0, 1.0])
    groups = ["a", "a", "a", "b"]
    seen: list[tuple[int, int]] = []

    def sizes(yy: np.ndarray, pp: np.ndarray) -> float:
        seen.append((int(np.sum(yy == 0)), int(np.sum(yy == 1))))
        return float(len(yy))

    r = pooled_bootstrap_ci([(y, y, groups)], statistic=sizes, n_resamples=200, seed=3, bounds=(0, 10))
    assert r["estimate"] == 4 and r["low"] < 4 < r["high"]
    draws = seen[1:]  # the first call is the estimate on the rows as they are
    assert {a % 3 for a, _ in draws} == {0} and {a // 3 + b for a, b in draws} == {2}
    assert {a for a, _ in draws} == {0, 3, 6}
    y2, g2, rng = _noisy()
    p2 = y2 + rng.normal(size=y2.shape)
    once = pooled_bootstrap_ci([(y2, p2, g2)], n_resamples=100, seed=7)
    again = pooled_bootstrap_ci([(y2, p2, g2)], n_resamples=100, seed=7)
    assert once == again and once != pooled_bootstrap_ci([(y2, p2, g2)], n_resamples=100, seed=8)
    assert once["low"] <= once["estimate"] <= once["high"]


def test_the_new_split_interval_is_never_wider_than_a_t_interval_over_the_seeds():
    # a method whose predictions do not depend on its training (as direct's): the seeds' figures
    # differ by their test documents only, the spread the test part explains; the interval is at
    # most the t interval of the seeds' degrees of freedom, never an unbounded quantile
    from scipy.stats import t

    for seed in range(5):
        y, groups, rng = _noisy(n_docs=60, seed=seed)
        pred = y + 1.5 * rng.normal(size=y.shape)
        docs = np.array(groups)
        cases, sizes = [], []
        for _ in range(3):
            test = np.isin(docs, [f"d{d}" for d in rng.permutation(60)[:24]])
            cases.append((y[test], pred[test], list(docs[test])))
            sizes.append(int((~test).sum()))
        r = pooled_bootstrap_ci(cases, n_resamples=200, seed=seed, train_sizes=sizes)
        sd = np.hypot(r["test_sd"], r["training_sd"])
        assert -1 < r["low"] < r["estimate"] < r["high"] < 1
        assert (r["high"] - r["low"]) / 2 <= t.ppf(0.975, 2) * sd + 1e-4, (seed, r)  # figures are rounded


def test_a_figure_with_no_estimate_has_no_interval():
    # a constant prediction has no correlation on any seed: no figure, so no bounds either
    y, groups, _ = _noisy()
    const = np.ones_like(y)
    r = pooled_bootstrap_ci([(y, const, groups)] * 2, n_resamples=50, train_sizes=[30, 30])
    assert r["estimate"] is None and (r["low"], r["high"]) == (None, None)
    d = pooled_paired_bootstrap([(y, const, y, groups)] * 2, n_resamples=50, train_sizes=[30, 30])
    assert d["difference"] is None and (d["low"], d["high"]) == (None, None)


def test_avg_spearman_matches_the_metrics_module() -> None:
    from hdeval.core.metrics import metric_table

    y, _, rng = _noisy()
    pred = y + rng.normal(size=y.shape)
    pred[3, 0] = np.nan  # a failed score: that pair is left out, as metrics.json does
    assert avg_spearman(y, pred) == pytest.approx(metric_table(y, pred, ["a", "b"])["average"]["spearman"], abs=1e-6)


# ------------------------------------------------------------------ summary level and ranking
def test_summary_level_correlation_on_a_hand_computed_table() -> None:
    #        doc1: y 1 2 3, pred 1 3 2 -> spearman .5, pearson .5, kendall 1/3
    #        doc2: y 1 2, pred 2 1     -> -1 for all three
    #        doc3: humans tie          -> undefined, left out
    y = [1, 2, 3, 1, 2, 2, 2]
    pred = [1, 3, 2, 2, 1, 1, 2]
    groups = ["d1", "d1", "d1", "d2", "d2", "d3", "d3"]
    assert summary_level_correlation(y, pred, groups, "spearman") == {"value": -0.25, "documents": 2}
    assert summary_level_correlation(y, pred, groups, "pearson") == {"value": -0.25, "documents": 2}
    assert summary_level_correlation(y, pred, groups, "kendall")["value"] == pytest.approx(-1 / 3, abs=1e-6)
    assert summary_level_correlation([1, 1], [1, 2], ["x", "x"]) == {"value": None, "documents": 0}


def test_ranking_exact_match_on_a_hand_computed_table() -> None:
    rows = [  # (doc, human, predicted)
        ("a", 1, 0.1), ("a", 2, 0.2), ("a", 3, 0.3),  # exact order: hit
        ("b", 3, 1.0), ("b", 1, 2.0),  # reversed: miss
        ("c", 2, 5.0), ("c", 2, 4.0), ("c", 1, 1.0),  # humans tie the first two: not judged; hit
        ("d", 1, 1.0), ("d", 1, 2.0),  # all tied: document skipped
        ("e", 1, 3.0), ("e", 2, 3.0),  # predicted tie of an ordered pair: miss
    ]
    groups, y, pred = zip(*rows)
    assert ranking_exact_match(y, pred, groups) == {"value": 0.5, "documents": 4}


# ------------------------------------------------------------------ presets
def _toy(tmp_path: Path, extra: str = PRESETS, same_range: bool = True) -> tuple[Path, Path]:
    task = tmp_path / "toy_task.toml"
    task.write_text(TOY_TASK + extra, encoding="utf-8")
    return task, write_jsonl(tmp_path / "toy.jsonl", toy_rows())


def test_builtin_paper_presets_select_the_papers_aspects() -> None:
    from hdeval.data.tasks import apply_preset, load_task
    from hdeval.learn.aggregate import aspect_groups

    tc = apply_preset(load_task("topical_chat"), "paper")
    assert tc.aspect_keys == ("naturalness", "coherence", "engagingness", "groundedness")
    assert tc.own_regressor == ("groundedness",)
    assert aspect_groups(tc) == [["naturalness", "coherence", "engagingness"], ["groundedness"]]
    for name in ("sfhot", "sfres"):
        assert apply_preset(load_task(name), "paper").aspect_keys == ("naturalness",)
    assert len(load_task("topical_chat").aspect_keys) == 6  # the full task stays the default


def test_own_regressor_fits_that_aspect_alone(tmp_path: Path) -> None:
    # Both toy aspects share the range 1-5, so without the preset one decision tree fits them
    # jointly; with it, accuracy's model is fitted on accuracy alone (as the paper does for
    # Topical-Chat's groundedness) and predicts exactly what a tree fitted on it alone does.
    # (A tree shows this as a forest does, without fitting 100 trees per fold.)
    from sklearn.base import clone

    from hdeval.learn.aggregate import make_regressor
    from hdeval.methods.registry import load_artifact
    from hdeval.run.train import train

    task, data = _toy(tmp_path)
    common = dict(task=str(task), data=str(data), llm="fake", layers=1, aggregator="dt",
                  cache_dir=str(tmp_path / "c"))
    joint = train(**common)
    solo = train(preset="solo", **common)
    assert joint.aggregator.groups_ == [["clarity", "accuracy"]]
    assert solo.aggregator.groups_ == [["clarity"], ["accuracy"]]
    model, column = solo.aggregator.model_for("accuracy")
    assert column is None and model is not solo.aggregator.model_for("clarity")[0]
    table = solo.score_table
    train_rows = table[table["split"] == "train"]
    X = train_rows[solo.feature_keys].to_numpy(float)
    alone = clone(make_regressor("dt", solo.aggregator.random_state)).fit(X, train_rows["human:accuracy"])
    Xall = table[solo.feature_keys].to_numpy(float)
    assert np.allclose(solo.aggregator.predict(Xall)[:, 1], np.clip(alone.predict(Xall), 1, 5))
    assert not np.allclose(joint.aggregator.predict(Xall)[:, 1], solo.aggregator.predict(Xall)[:, 1])
    # The artifact records the setting and loads back with the same grouping.
    solo.save(tmp_path / "art")
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["task"]["own_regressor"] == ["accuracy"] and manifest["run"]["config"]["preset"] == "solo"
    assert load_artifact(tmp_path / "art").aggregator.groups_ == [["clarity"], ["accuracy"]]


def test_preset_on_the_command_line_and_its_errors(tmp_path: Path) -> None:
    task, data = _toy(tmp_path)
    base = ["train", "--task", str(task), "--data", str(data), "--llm", "fake", "--layers", "1", "-q",
            "--cache-dir", str(tmp_path / "c")]
    r = CliRunner().invoke(cli, base + ["--preset", "clear", "-o", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["state"]["aggregator"]["aspects"] == ["clarity"]
    r = CliRunner().invoke(cli, base + ["--preset", "nope", "-o", str(tmp_path / "b")])
    assert r.exit_code == 2
    assert r.stderr == "error: unknown preset 'nope' for task toy_qa: known presets: solo, clear\n"
    r = CliRunner().invoke(cli, base + ["--preset", "clear", "--aspects", "clarity", "-o", str(tmp_path / "b")])
    assert r.exit_code == 2 and "--preset and --aspects cannot be combined" in r.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("extra, message", [
    ('[presets.p]\naspects = ["clarity", "fluency"]\n', "presets.p.aspects names unknown aspect(s) fluency"),
    ('[presets.p]\naspects = []\n', "presets.p.aspects must be a non-empty list of aspect keys"),
    ('[presets.p]\naspects = ["clarity"]\nown_regressor = ["accuracy"]\n',
     "presets.p.own_regressor names unknown aspect(s) accuracy"),
    ('[presets.p]\naspects = ["clarity"]\nweights = 1\n', "presets.p has unknown key(s) weights"),
    ('[presets]\np = 3\n', "presets.p must be a table, got a number"),
])
def test_bad_preset_tables_name_the_file_and_the_field(tmp_path: Path, extra: str, message: str) -> None:
    from hdeval.data.tasks import load_task

    task, _ = _toy(tmp_path, extra)
    with pytest.raises(ConfigError) as exc:
        load_task(str(task))
    assert str(exc.value).startswith(f"{task}: ") and message in str(exc.value)


# ------------------------------------------------------------------ the benchmark command
def _bench(tmp_path: Path, out: Path, *extra: str):
    task, data = tmp_path / "toy_task.toml", tmp_path / "toy.jsonl"
    if not task.exists():
        _toy(tmp_path)
    args = ["benchmark", "--task", str(task), "--data", str(data), "--methods", "direct,hdeval",
            # two aggregators (dt: a cheap second one; rf's 100 trees cost half the sweep's time)
            "--aggregators", "lr,dt", "--seeds", "2", "--train-fracs", "0.25,0.5", "--layers", "2",
            "--limit", "33", "--resamples", "50", "--llm", "fake", "--cache-dir", str(tmp_path / "cache"),
            "-q", "-o", str(out), *extra]
    return CliRunner().invoke(cli, args)


@pytest.mark.slow  # end to end, twice
def test_benchmark_end_to_end_and_a_second_run_makes_no_calls(tmp_path: Path, fake_calls: list[int]) -> None:
    out = tmp_path / "bench"
    r = _bench(tmp_path, out)
    assert r.exit_code == 0, r.output
    assert fake_calls, "the first run calls the LLM"
    res = json.loads((out / "results.json").read_text())
    assert res["format"] == "hdeval-benchmark" and res["task"] == "toy_qa"
    assert res["aspects"] == ["clarity", "accuracy"] and res["spec"]["resamples"] == 50
    assert "cache_dir" not in res["spec"]["options"]  # a path on this machine
    assert set(res["definitions"]) >= {"dataset", "summary_level", "ranking", "bootstrap", "seeds", "layers"}
    # runs: 2 seeds x 2 fractions x (direct + hdeval lr + hdeval dt)
    assert len(res["runs"]) == 12
    for run in res["runs"]:
        assert run["n_test"] > 0 and set(run["dataset"]) == {"clarity", "accuracy", "average"}
        for metric in ("pearson", "spearman", "kendall"):
            assert set(run["summary_level"][metric]) == {"clarity", "accuracy", "average"}
        assert set(run["ranking"]) == {"exact_match", "kendall_per_document"}
        assert 0 <= run["ranking"]["exact_match"]["average"]["value"] <= 1
        if run["method"] == "hdeval":
            assert set(run["layers"]) == {"1", "2"}
            assert set(run["baselines"]) == {"direct_layer1", "mean_all_criteria", "mean_subtree"}
            # the held-out predictions read back from the score table are the ones metrics.json scored
            # (of the layer kept on training data, which need not be the deepest)
            kept = str(run["kept_layer"])
            assert kept in run["layers"] and run["dataset"] == run["layers"][kept]
            # criteria per layer: layer 1 = the 2 aspects, the kept layer = every criterion the aggregator uses
            assert run["criteria_per_layer"]["1"] == 2 and run["criteria_per_layer"][kept] == run["criteria"]
        else:
            assert run["criteria"] == 2  # direct: one question per aspect
    # settings: mean/std over seeds, bootstrap per seed with the difference to direct
    assert [(s["method"], s["aggregator"], s["train_frac"]) for s in res["settings"]] == [
        ("direct", None, 0.25), ("hdeval", "lr", 0.25), ("hdeval", "dt", 0.25),
        ("direct", None, 0.5), ("hdeval", "lr", 0.5), ("hdeval", "dt", 0.5)]
    for s in res["settings"]:
        avg = s["dataset"]["average"]["spearman"]
        assert avg["n"] == 2 and avg["std"] >= 0
        seeds = [run for run in res["runs"] if (run["method"], run["aggregator"], run["train_frac"])
                 == (s["method"], s["aggregator"], s["train_frac"])]
        assert avg["mean"] == pytest.approx(np.mean([x["dataset"]["average"]["spearman"] for x in seeds]), abs=1e-5)
        assert set(s["summary_level"]) == {"pearson", "spearman", "kendall"} and "exact_match" in s["ranking"]
        # one interval pooled over both seeds, around the mean the table shows next to it
        b = s["bootstrap"]
        ci = b["average_spearman"]
        assert ci["low"] <= ci["estimate"] <= ci["high"] and ci["resamples"] == 50
        assert ci["estimate"] == pytest.approx(avg["mean"], abs=1e-5)
        if s["method"] == "direct":
            assert "vs_direct" not in b
        else:
            vs = b["vs_direct"]
            assert vs["low"] <= vs["difference"] <= vs["high"] and 0 < vs["p_value"] <= 1
            direct = next(d for d in res["settings"] if (d["method"], d["train_frac"]) == ("direct", s["train_frac"]))
            assert vs["difference"] == pytest.approx(avg["mean"] - direct["dataset"]["average"]["spearman"]["mean"],
                                                     abs=1e-5)
            assert vs["covers"] == "test documents and training" and vs["training_sd"] >= 0
        if s["method"] == "hdeval":
            assert set(s["layers"]) == {"1", "2"} and {"mean_all_criteria", "mean_subtree"} <= set(s["baselines"])
    # criteria efficiency: a line per setting, direct a point at the aspects, HD-Eval a point per layer
    # with the criteria and the layer's Spearman averaged over the seeds
    eff = res["criteria_efficiency"]
    assert [(e["method"], e["aggregator"], e["train_frac"]) for e in eff] == [
        (s["method"], s["aggregator"], s["train_frac"]) for s in res["settings"]]
    for e, s in zip(eff, res["settings"]):
        seeds = [x for x in res["runs"] if (x["method"], x["aggregator"], x["train_frac"])
                 == (e["method"], e["aggregator"], e["train_frac"])]
        if e["method"] == "direct":
            assert e["points"] == [{"layer": None, "criteria": {"mean": 2.0, "std": 0.0, "n": 2},
                                    "spearman": s["dataset"]["average"]["spearman"]}]
            continue
        assert [p["layer"] for p in e["points"]] == [1, 2]
        for p in e["points"]:
            counts = [x["criteria_per_layer"][str(p["layer"])] for x in seeds]
            # on the compared rows, as the main table
            spear = [x["layers_compared"][str(p["layer"])]["average"]["spearman"] for x in seeds]
            assert p["criteria"]["mean"] == pytest.approx(np.mean(counts)) and p["criteria"]["n"] == 2
            assert p["spearman"] == s["layers_compared"][str(p["layer"])]
            assert p["spearman"]["mean"] == pytest.approx(np.mean(spear), abs=1e-5)
        # the kept layer's point is the main table's figure for the same evaluator on the same rows
        for x in seeds:
            assert x["layers_compared"][str(x["kept_layer"])] == x["dataset"]
        assert e["points"][0]["criteria"]["mean"] == 2 < e["points"][1]["criteria"]["mean"]
    assert set(res["cost"]) == {"direct", "hdeval"} and res["cost"]["hdeval"]["runs"] == 8
    assert res["calls"] == len(fake_calls) == sum(c["calls"] for c in res["cost"].values())
    assert res["cost"]["direct"]["prompt_tokens"] > 0
    md = (out / "results.md").read_text()
    assert "| method | train frac | clarity | accuracy | average |" in md and "| hdeval-dt | 0.5 |" in md
    assert "Layer ablation" in md and "| direct |" in md
    assert "| method | train frac | layer | criteria | average Spearman |" in md and "| direct | 0.5 |  | 2 |" in md
    page = (out / "report.html").read_text()
    # data efficiency, per-aspect bars, layer ablation, criteria efficiency
    assert page.count("data:image/png;base64,") == 4 and "<script" not in page
    assert "Criteria efficiency at training fraction 0.5" in page
    # Again, from the cache: not one call, the same numbers.
    fake_calls.clear()
    (out / "notes.txt").write_text("mine")
    r = _bench(tmp_path, out, "--force")
    assert r.exit_code == 0, r.output
    again = json.loads((out / "results.json").read_text())
    assert fake_calls == [] and again["calls"] == 0 and again["cost"]["hdeval"]["cache_hits"] > 0
    assert [x["dataset"] for x in again["runs"]] == [x["dataset"] for x in res["runs"]]
    strip = lambda settings: [{k: v for k, v in s.items() if k != "usage"} for s in settings]  # noqa: E731
    assert strip(again["settings"]) == strip(res["settings"])  # same figures, bootstrap included
    # the cost of each method is what its runs ask for, whatever the cache held: the same on both
    # sweeps, though the first paid for calls and the second for none
    assert {m: c["requests"] for m, c in again["cost"].items()} == {m: c["requests"] for m, c in res["cost"].items()}
    assert [s["usage"]["requests"] for s in again["settings"]] == [s["usage"]["requests"] for s in res["settings"]]
    assert all(s["usage"]["requests"] > 0 for s in again["settings"])  # hdeval-dt too, though lr ran first
    assert (out / "notes.txt").read_text() == "mine"  # --force replaces its own files only


def test_benchmark_reads_a_csv_as_train_does_and_its_help_says_so(tmp_path: Path) -> None:
    from conftest import REPO

    task = tmp_path / "task.toml"
    r = CliRunner().invoke(cli, ["init", str(REPO / "examples" / "ratings.csv"), "-o", str(task),
                                 "--source-col", "question", "--output-col", "answer"])
    assert r.exit_code == 0, r.output
    lines = (REPO / "examples" / "ratings.csv").read_text(encoding="utf-8").splitlines(keepends=True)
    data = tmp_path / "mine.csv"  # 16 of the task's 24 rows: the file given, not the task's own
    data.write_text("".join(lines[:17]), encoding="utf-8")
    out = tmp_path / "bench"
    r = CliRunner().invoke(cli, ["benchmark", "--task", str(task), "--data", str(data), "--methods", "direct",
                                 "--seeds", "1", "--llm", "fake", "--cache-dir", str(tmp_path / "c"), "-q",
                                 "-o", str(out)])
    assert r.exit_code == 0, r.output
    run = json.loads((out / "results.json").read_text(encoding="utf-8"))["runs"][0]
    assert run["n_train"] + run["n_test"] == 16 and run["usage"]["calls"] == 16 * 2
    help_text = " ".join(CliRunner().invoke(cli, ["benchmark", "--help"]).output.split())
    assert "Samples: JSONL, a CSV, TSV, JSON or Parquet table" in help_text


def test_benchmark_refuses_an_output_it_did_not_write(tmp_path: Path, fake_calls: list[int]) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("keep")
    for extra in ((), ("--force",)):
        r = _bench(tmp_path, out, *extra)
        assert r.exit_code == 2 and r.stderr.startswith("error: refusing to write the benchmark to")
        assert len(r.stderr.strip().splitlines()) == 1
    assert [p.name for p in out.iterdir()] == ["thesis.tex"] and fake_calls == []


def test_benchmark_asks_for_force_before_replacing_results(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"format": "hdeval-benchmark"}))
    r = _bench(tmp_path, out)
    assert r.exit_code == 2 and "already holds a benchmark" in r.stderr and "--force" in r.stderr


@pytest.mark.parametrize("extra, message", [
    (("--methods", "direct,magic"), "--methods: unknown or unsupported magic"),
    (("--aggregators", "svm"), "--aggregators: unknown svm"),
    (("--train-fracs", "0.5,x"), "--train-fracs must be comma-separated numbers"),
    (("--train-fracs", "1.5"), "--train-fracs must be numbers in (0, 1)"),
    (("--seeds", "0"), "--seeds must be at least 1"),
    (("--aggregators", "lr,rf,lr"), "--aggregators lists lr more than once"),
    (("--preset", "nope"), "unknown preset 'nope' for task toy_qa: known presets: solo, clear"),
])
def test_benchmark_bad_options_are_one_line_errors_before_any_call(
        tmp_path: Path, fake_calls: list[int], extra: tuple[str, ...], message: str) -> None:
    out = tmp_path / "bench"
    r = _bench(tmp_path, out, *extra)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert fake_calls == [] and not out.exists()


def test_max_calls_is_a_budget_for_the_whole_sweep(tmp_path: Path, fake_calls: list[int]) -> None:
    out = tmp_path / "bench"
    r = _bench(tmp_path, out, "--max-calls", "60")
    # the first run (direct) makes fewer than 60 calls; the second stops when the sweep has made 60
    assert r.exit_code == 4 and len(fake_calls) == 60
    assert r.stderr.startswith("error: stopped at --max-calls 60 (the whole sweep's budget) in run 2/12 ")
    assert not out.exists()  # nothing half-done; the 40 replies are cached for the rerun


def test_benchmark_reads_paireval_and_direct_yesno_held_out_predictions(tmp_path: Path) -> None:
    # The held-out figures the benchmark computes from each evaluator's score table are the ones
    # its own training reported (metrics.json "final"), for every method it runs.
    from hdeval.benchmark.spec import BenchmarkSpec
    from hdeval.benchmark.sweep import run_benchmark
    from hdeval.run.train import train

    task, data = _toy(tmp_path)
    options = dict(data=str(data), llm="fake", layers=1, cache_dir=str(tmp_path / "c"))
    spec = BenchmarkSpec(str(task), ("direct", "direct-yesno", "hdeval", "paireval"), ("lr",), 1, (0.5,), 20,
                         options)
    res = run_benchmark(spec)
    assert [(r["method"], r["aggregator"]) for r in res["runs"]] == [
        ("direct", None), ("direct-yesno", None), ("hdeval", "lr"), ("paireval", "lr")]
    for run in res["runs"]:
        extra = {"aggregator": "lr"} if run["aggregator"] else {}
        mine = {k: v for k, v in options.items() if k != "layers" or run["method"] == "hdeval"}
        fitted = train(task=str(task), method=run["method"], seed=0, train_frac=0.5, **mine, **extra)
        assert run["dataset"] == fitted.metrics["final"], run["method"]
    assert all("vs_direct" in s["bootstrap"] for s in res["settings"][1:])
    assert res["calls"] == sum(c["calls"] for c in res["cost"].values()) > 0


# ------------------------------------------------------------------ pairwise tasks (dna, hdeval)
_WORDS = ("time plan focus rest sleep task list goal habit break water walk read note call mail code test "
          "data model value table chart range sample answer detail reason step method tool").split()


def _pair_rows(n_docs: int = 24) -> list[dict]:
    """FairEval-shaped pairs (question, two answers, human a / b / tie); the first four documents
    hold two pairs each, so the bootstrap resamples documents, not pairs. The longer, less
    repetitive answer tends to win, as the fake LLM's judge thinks."""
    rng = np.random.default_rng(5)
    rows = []
    for d in range(n_docs):
        for k in range(2 if d < 4 else 1):
            la, lb = (int(x) for x in rng.integers(3, 60, 2))
            a = " ".join(rng.choice(_WORDS, la))
            b = " ".join(rng.choice(_WORDS[: 6 + (d % 5)], lb))
            label = "tie" if abs(la - lb) < 9 else ("a" if la > lb else "b")
            if rng.random() < 0.15:  # humans disagree with the obvious choice now and then
                label = {"a": "b", "b": "a", "tie": "a"}[label]
            rows.append({"id": f"p{d}-{k}", "doc_id": f"q{d}", "source": f"Question {d}: how to {_WORDS[d]}?",
                         "output_a": a, "output_b": b, "label": label})
    return rows


def _pair_bench(tmp_path: Path, out: Path, *extra: str, methods: str = "dna-direct,dna,hdeval"):
    data = tmp_path / "pairs.jsonl"
    if not data.exists():
        write_jsonl(data, _pair_rows())
    args = ["benchmark", "--task", "faireval", "--data", str(data), "--methods", methods, "--aggregators", "lr",
            "--seeds", "2", "--layers", "1", "--resamples", "50", "--llm", "fake",
            "--cache-dir", str(tmp_path / "cache"), "-q", "-o", str(out), *extra]
    return CliRunner().invoke(cli, args)


def _by_hand(human, pred, pred_ab) -> dict[str, float | None]:
    """agreement with / without ties counted by hand (failed = no prediction: left out)."""
    judged = [(h, p, q) for h, p, q in zip(human, pred, pred_ab) if isinstance(p, str)]
    no_tie = [(h, q) for h, _, q in judged if h != "tie"]
    return {"w_ties": round(sum(h == p for h, p, _ in judged) / len(judged), 6) if judged else None,
            "wo_ties": round(sum(h == q for h, q in no_tie) / len(no_tie), 6) if no_tie else None}


def test_pairwise_agreement_statistics_match_dna_agreement_on_a_hand_case() -> None:
    from hdeval.benchmark.heldout import PairHeldOut, pair_arrays
    from hdeval.core.metrics import agreement_w_ties, agreement_wo_ties

    ho = PairHeldOut(list("123456"), list("xxyyzw"), ["a", "b", "tie", "a", "b", "a"],
                     {"evaluator": (["a", "tie", "tie", "b", None, "a"], ["a", "b", "a", "b", None, "a"])})
    y, p = pair_arrays(ho)
    # w/ ties: 5 predicted pairs, right on 1, 3, 6 -> 3/5; w/o ties: pairs 1, 2, 4, 6 (not tie,
    # predicted), forced a/b right on 1, 2, 6 -> 3/4
    assert agreement_w_ties(y, p) == pytest.approx(0.6) and agreement_wo_ties(y, p) == pytest.approx(0.75)
    from hdeval.core.metrics import pair_agreement as agreement

    want = agreement(ho.human, *ho.predictions["evaluator"])
    assert (want["w_ties"], want["wo_ties"]) == (0.6, 0.75)


def test_pairwise_benchmark_end_to_end_and_a_second_run_makes_no_calls(tmp_path: Path, fake_calls: list[int]) -> None:
    from hdeval.run.train import train

    out = tmp_path / "bench"
    r = _pair_bench(tmp_path, out)
    assert r.exit_code == 0, r.output
    assert fake_calls, "the first run calls the LLM"
    assert "held-out agreement w/o ties" in r.stdout
    res = json.loads((out / "results.json").read_text())
    assert res["shape"] == "pairwise" and res["task"] == "faireval" and "agreement" in res["definitions"]
    # runs: 2 seeds x (the dna-direct baseline, hdeval lr, dna)
    assert [(x["method"], x["aggregator"], x["seed"]) for x in res["runs"]] == [
        ("dna-direct", None, 0), ("hdeval", "lr", 0), ("dna", None, 0),
        ("dna-direct", None, 1), ("hdeval", "lr", 1), ("dna", None, 1)]
    for run in res["runs"]:
        # the held-out agreement read from each evaluator's score table, by hand, is the benchmark's
        # and the one its own training reported in metrics.json
        method, extra = ("dna", {"method_options": {"dna_mode": "direct"}}) if run["method"] == "dna-direct" \
            else (run["method"], {"aggregator": "lr", "layers": 1} if run["method"] == "hdeval" else {})
        fitted = train(task="faireval", data=str(tmp_path / "pairs.jsonl"), method=method, llm="fake",
                       seed=run["seed"], train_frac=0.5, cache_dir=str(tmp_path / "cache"), **extra)
        test = fitted.score_table[fitted.score_table["split"] == "test"]
        assert run["n_test"] == len(test) > 0
        human = list(test["human"])
        got = run["agreement"]
        if method == "dna":
            pred = list(test["prediction"])
            forced = [None if a == b else ("a" if a > b else "b") for a, b in zip(test["total_a"], test["total_b"])]
            mine = _by_hand(human, pred, forced)
            primary = fitted.metrics["primary"]
            assert {k: got["evaluator"][k] for k in mine} == mine
            assert got["evaluator"] == fitted.metrics["test"][primary]
            if run["method"] == "dna":  # the learned aggregation next to the LLM weights
                learned = _by_hand(human, list(test["learned_prediction"]), list(test["learned_prediction_ab"]))
                assert {k: got["learned"][k] for k in learned} == learned
                assert got["learned"] == fitted.metrics["test"]["learned"]
            else:
                assert set(got) == {"evaluator"}
        else:
            keys = fitted.feature_keys
            diff = test[[f"{k}:a" for k in keys]].to_numpy(float) - test[[f"{k}:b" for k in keys]].to_numpy(float)
            pred = [str(x) for x in fitted.model.predict(diff)]
            classes = list(fitted.model.classes_)
            proba = fitted.model.predict_proba(diff)
            forced = [("a" if p[classes.index("a")] >= p[classes.index("b")] else "b") for p in proba]
            assert {k: got["evaluator"][k] for k in ("w_ties", "wo_ties")} == _by_hand(human, pred, forced)
            assert got["evaluator"] == fitted.metrics["final"] and run["fitted_aggregator"] == "lr"
        assert run["usage"]["calls"] + run["usage"]["cache_hits"] > 0
    # settings: mean/std over seeds; a bootstrap per seed, with the difference to dna-direct
    assert [s["method"] for s in res["settings"]] == ["dna-direct", "hdeval", "dna"]
    for s in res["settings"]:
        mine = [x for x in res["runs"] if x["method"] == s["method"]]
        for variant, figures in s["agreement"].items():
            for k in ("w_ties", "wo_ties"):
                vals = [x["agreement"][variant][k] for x in mine]
                assert figures[k]["n"] == 2 and figures[k]["mean"] == pytest.approx(np.mean(vals), abs=1e-5)
        assert set(s["agreement"]) == ({"evaluator", "learned"} if s["method"] == "dna" else {"evaluator"})
        # one bootstrap pooled over the seeds: its estimate is the mean the table shows next to it
        b = s["bootstrap"]
        base = next(x for x in res["settings"] if x["method"] == "dna-direct")
        for k in ("w_ties", "wo_ties"):
            ci = b["agreement"][k]
            assert ci["estimate"] == pytest.approx(s["agreement"]["evaluator"][k]["mean"], abs=1e-5)
            assert ci["low"] <= ci["estimate"] <= ci["high"] and ci["resamples"] == 50
        if s["method"] == "dna-direct":
            assert "vs_dna_direct" not in b
        else:
            for k in ("w_ties", "wo_ties"):
                vs = b["vs_dna_direct"][k]
                assert vs["difference"] == pytest.approx(
                    s["agreement"]["evaluator"][k]["mean"] - base["agreement"]["evaluator"][k]["mean"], abs=1e-5)
                assert vs["low"] <= vs["difference"] <= vs["high"] and 0 < vs["p_value"] <= 1
        if s["method"] == "dna":  # the learned aggregation's bootstrap, next to the LLM weights'
            for k in ("w_ties", "wo_ties"):
                ci = b["learned"]["agreement"][k]
                assert ci["estimate"] == pytest.approx(s["agreement"]["learned"][k]["mean"], abs=1e-5)
                assert ci["low"] <= ci["estimate"] <= ci["high"] and ci["resamples"] == 50
                vs = b["learned"]["vs_dna_direct"][k]
                assert vs["difference"] == pytest.approx(
                    s["agreement"]["learned"][k]["mean"] - base["agreement"]["evaluator"][k]["mean"], abs=1e-5)
        else:
            assert "learned" not in b
        assert s["rows"]["compared"] == [x["n_test"] for x in mine]  # the fake never fails
    # the majority-class baseline: the training split's most frequent label for every test pair
    (ref,) = res["reference"]
    assert ref["method"] == "majority" and ref["bootstrap"]["agreement"]["w_ties"]["resamples"] == 50
    by_hand = []
    for seed in (0, 1):
        fitted = train(task="faireval", data=str(tmp_path / "pairs.jsonl"), method="dna", llm="fake",
                       seed=seed, train_frac=0.5, cache_dir=str(tmp_path / "cache"),
                       method_options={"dna_mode": "direct"})
        t = fitted.score_table
        train_labels, test = list(t[t["split"] == "train"]["human"]), list(t[t["split"] == "test"]["human"])
        top, forced = max(("a", "b", "tie"), key=train_labels.count), max(("a", "b"), key=train_labels.count)
        by_hand.append(_by_hand(test, [top] * len(test), [forced] * len(test)))
    for k in ("w_ties", "wo_ties"):
        assert ref["agreement"]["evaluator"][k]["mean"] == pytest.approx(np.mean([h[k] for h in by_hand]), abs=1e-5)
    assert set(res["cost"]) == {"dna-direct", "hdeval", "dna"}
    assert res["calls"] == len(fake_calls) == sum(c["calls"] for c in res["cost"].values())
    assert all(c["prompt_tokens"] > 0 for c in res["cost"].values())
    md = (out / "results.md").read_text()
    # both agreements with their intervals and differences, the majority baseline, in results.md too
    assert ("| method | train frac | w/o ties | 95% CI | w/ ties | 95% CI | Δ w/o ties vs dna-direct [95% CI], p "
            "| Δ w/ ties vs dna-direct [95% CI], p | failed | rows compared | requests (new calls) |") in md
    assert "| dna | 0.5 |" in md and "| hdeval-lr | 0.5 |" in md and "Cost per method" in md
    assert "| dna (learned) | 0.5 |" in md and "| majority | 0.5 |" in md
    dna_row = next(line for line in md.splitlines() if line.startswith("| dna | 0.5 |")).split(" | ")
    ci = res["settings"][2]["bootstrap"]["agreement"]["w_ties"]
    assert dna_row[5] == f"[{ci['low']:.3f}, {ci['high']:.3f}]"  # the w/ ties interval
    page = (out / "report.html").read_text()
    # one training fraction: the agreement bars only (no data-efficiency curve)
    assert page.count("data:image/png;base64,") == 1 and "dna (learned)" in page and "majority" in page
    assert "Agreement with the human labels at training fraction 0.5" in page and "<script" not in page
    # Again, from the cache: not one call, the same figures.
    fake_calls.clear()
    r = _pair_bench(tmp_path, out, "--force")
    assert r.exit_code == 0, r.output
    again = json.loads((out / "results.json").read_text())
    assert fake_calls == [] and again["calls"] == 0
    strip = lambda settings: [{k: v for k, v in s.items() if k != "usage"} for s in settings]  # noqa: E731
    assert strip(again["settings"]) == strip(res["settings"])


@pytest.mark.parametrize("task, methods, message", [
    ("faireval", "direct,dna", "--methods: direct does not run on pairwise tasks (task faireval); for a "
                               "pairwise task choose from dna-direct, hdeval, dna"),
    ("faireval", "paireval,direct-yesno,hdeval", "--methods: paireval, direct-yesno do not run on pairwise"),
    ("toy", "hdeval,dna-direct", "--methods: dna-direct does not run on pointwise tasks"),
])
def test_benchmark_methods_of_the_other_shape_are_a_one_line_error_before_any_call(
        tmp_path: Path, fake_calls: list[int], task: str, methods: str, message: str) -> None:
    out = tmp_path / "bench"
    if task == "toy":
        r = _bench(tmp_path, out, "--methods", methods)
    else:
        r = _pair_bench(tmp_path, out, methods=methods)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert fake_calls == [] and not out.exists()


# ------------------------------------------------------------------ method options, pairwise plots
def test_pairwise_benchmark_with_method_options_and_two_training_fractions(
        tmp_path: Path, fake_calls: list[int]) -> None:
    from hdeval.report.bench import pair_curves

    out = tmp_path / "bench"
    # a tie margin no two totals are apart by: every DnA prediction is a tie, so its agreement with
    # ties is the share of human ties among the test pairs, countable by hand
    extra = ("--train-fracs", "0.25,0.5", "--seeds", "1", "--method-option", "dna.tie_margin=100",
             "--method-option", "dna.swap=false")
    r = _pair_bench(tmp_path, out, *extra, methods="dna-direct,dna")
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    assert res["spec"]["method_options"] == {"dna": {"tie_margin": 100.0, "swap": False}}
    assert [(s["method"], s["train_frac"], s["method_options"]) for s in res["settings"]] == [
        ("dna-direct", 0.25, {}), ("dna", 0.25, {"tie_margin": 100.0, "swap": False}),
        ("dna-direct", 0.5, {}), ("dna", 0.5, {"tie_margin": 100.0, "swap": False})]
    rows = _pair_rows()
    human = {row["id"]: row["label"] for row in rows}
    from hdeval.run.train import train

    for run in res["runs"]:
        if run["method"] != "dna":
            continue
        fitted = train(task="faireval", data=str(tmp_path / "pairs.jsonl"), method="dna", llm="fake",
                       seed=0, train_frac=run["train_frac"], cache_dir=str(tmp_path / "cache"),
                       method_options={"tie_margin": 100.0, "swap": False})
        test = fitted.score_table[fitted.score_table["split"] == "test"]
        assert set(test["prediction"]) == {"tie"}
        ties = sum(human[i] == "tie" for i in test["pair_id"])
        assert run["agreement"]["evaluator"]["w_ties"] == round(ties / len(test), 6)
    # the plots' numbers: agreement bars per line at the largest fraction and a data-efficiency curve
    # per line, "dna (learned)" a line of its own; all of them the settings' mean/std over seeds
    assert [label for label, _, _ in pair_curves(res)] == ["dna-direct", "dna", "dna (learned)"] * 2
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "Data efficiency (agreement" in page
    # the same sweep again: the cache answers everything
    fake_calls.clear()
    r = _pair_bench(tmp_path, out, *extra, "--force", methods="dna-direct,dna")
    assert r.exit_code == 0, r.output
    assert fake_calls == [] and json.loads((out / "results.json").read_text())["calls"] == 0


def test_method_option_reaches_a_pointwise_method(tmp_path: Path) -> None:
    # paireval.comparisons=1: the benchmark's run is the one `train --comparisons 1` makes
    from hdeval.benchmark.spec import BenchmarkSpec, parse_method_options
    from hdeval.benchmark.sweep import run_benchmark
    from hdeval.run.train import train

    task, data = _toy(tmp_path)
    options = dict(data=str(data), llm="fake", layers=1, limit=24, cache_dir=str(tmp_path / "c"))
    spec = BenchmarkSpec(str(task), ("paireval",), ("lr",), 1, (0.5,), 20, options,
                         parse_method_options(["paireval.comparisons=1"]))
    res = run_benchmark(spec)
    assert res["settings"][0]["method_options"] == {"comparisons": 1}
    mine = {k: v for k, v in options.items() if k != "layers"}  # the sweep gives --layers to HD-Eval only
    one = train(task=str(task), method="paireval", aggregator="lr", method_options={"comparisons": 1}, **mine)
    three = train(task=str(task), method="paireval", aggregator="lr", **mine)
    assert res["runs"][0]["dataset"] == one.metrics["final"] != three.metrics["final"]
    assert res["runs"][0]["usage"]["calls"] + res["runs"][0]["usage"]["cache_hits"] \
        < three.metrics["usage"]["calls"] + three.metrics["usage"]["cache_hits"]


@pytest.mark.parametrize("options, message", [
    (("paireval.comparisons",), "--method-option 'paireval.comparisons': expected METHOD.NAME=VALUE"),
    (("dna.swap=",), "--method-option 'dna.swap=': expected METHOD.NAME=VALUE"),
    (("dn\na.k=1",), "--method-option 'dn\\na.k=1': expected METHOD.NAME=VALUE"),  # still one line
    (("magic.k=1",), "--method-option magic.k: unknown method 'magic'"),
    (("hdeval.tie_margin=1",), "--method-option hdeval.tie_margin: hdeval takes no option 'tie_margin' (its "
                               "options: aggregator, children, comparisons, decompose_base_url, decompose_llm, "
                               "layers, scorer, swap, top_k, tree)"),
    (("dna.k=two",), "--method-option dna.k: 'two' is not a valid integer"),
    (("dna.tie_margin=nan",), "--method-option dna.tie_margin: 'nan' is not a finite number"),
    (("dna.swap=maybe",), "--method-option dna.swap: 'maybe' is not a valid boolean"),
    (("dna.aspect_source=random",), "--method-option dna.aspect_source: 'random' is not one of 'predefined'"),
    (("dna.tie_margin=-1",), "--method-option dna: --tie-margin must be 0 or more, got -1.0"),
    (("hdeval.comparisons=0",), "--method-option hdeval: --comparisons must be a whole number of at least 1"),
    (("dna-direct.dna_mode=cot",), "--method-option dna-direct.dna_mode: dna-direct is dna with dna_mode = direct"),
    (("dna.k=2", "dna.k=3"), "--method-option dna.k is given more than once"),
    # options the sweep sets from its own flags: accepted, then overridden by --layers' default 3
    (("hdeval.layers=2",), "--method-option hdeval.layers: benchmark sets layers for every run; give --layers"),
    (("hdeval.aggregator=rf",), "--method-option hdeval.aggregator: benchmark sets aggregator for every run; "
                                "give --aggregators"),
    (("paireval.comparisons=2",), "--method-option paireval.comparisons: paireval is not among --methods "
                                  "(dna-direct, dna, hdeval)"),
])
def test_bad_method_options_are_one_line_errors_before_any_call(
        tmp_path: Path, fake_calls: list[int], options: tuple[str, ...], message: str) -> None:
    out = tmp_path / "bench"
    r = _pair_bench(tmp_path, out, *[a for o in options for a in ("--method-option", o)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert fake_calls == [] and not out.exists()


# ------------------------------------------------------------------ --keep-artifacts
def _keep_bench(tmp_path: Path, out: Path, *extra: str):
    task, data = tmp_path / "toy_task.toml", tmp_path / "toy.jsonl"
    if not task.exists():
        _toy(tmp_path)
    args = ["benchmark", "--task", str(task), "--data", str(data), "--methods", "direct,hdeval", "--aggregators",
            "lr", "--layers", "1", "--limit", "33", "--resamples", "20", "--llm", "fake",
            "--cache-dir", str(tmp_path / "cache"), "-q", "-o", str(out), *extra]
    return CliRunner().invoke(cli, args)


def test_keep_artifacts_saves_each_run_and_replaces_only_its_own(tmp_path: Path, fake_calls: list[int]) -> None:
    from hdeval.methods.registry import load_artifact

    out = tmp_path / "bench"
    r = _keep_bench(tmp_path, out, "--keep-artifacts")
    assert r.exit_code == 0, r.output
    assert "2 run artifact(s) in runs/" in r.stdout
    res = json.loads((out / "results.json").read_text())
    names = ["runs/direct-frac0.5-seed0", "runs/hdeval-lr-frac0.5-seed0"]
    assert [x["artifact"] for x in res["runs"]] == names and res["artifacts"] == names
    for run in res["runs"]:  # each artifact is the evaluator the run measured
        ev = load_artifact(out / run["artifact"])
        assert ev.method == run["method"] and ev.metrics["final"] == run["dataset"]
    assert sorted(p.name for p in (out / "runs").iterdir()) == [n.split("/")[1] for n in names]
    # again with --force: from the cache, the artifacts replaced, a file of the user's in runs/ kept
    (out / "runs" / "notes.txt").write_text("mine")
    fake_calls.clear()
    r = _keep_bench(tmp_path, out, "--keep-artifacts", "--force")
    assert r.exit_code == 0, r.output
    assert fake_calls == [] and (out / "runs" / "notes.txt").read_text() == "mine"
    assert load_artifact(out / names[1]).method == "hdeval"
    # a sweep without --keep-artifacts leaves them and still lists them as the benchmark's ...
    r = _keep_bench(tmp_path, out, "--force")
    assert r.exit_code == 0, r.output
    again = json.loads((out / "results.json").read_text())
    assert again["artifacts"] == names and "artifact" not in again["runs"][0]
    # ... so a later --keep-artifacts --force may replace them
    r = _keep_bench(tmp_path, out, "--keep-artifacts", "--force")
    assert r.exit_code == 0, r.output
    # but not one a user put a file into: replacing it would delete the file (refused before any call)
    (out / names[1] / "NOTES.txt").write_text("mine")
    fake_calls.clear()
    r = _keep_bench(tmp_path, out, "--keep-artifacts", "--force", "--cache-dir", str(tmp_path / "fresh"))
    assert r.exit_code == 2 and f"refusing to replace the artifact in {out / names[1]}" in r.stderr, r.output
    assert "NOTES.txt" in r.stderr and fake_calls == [] and (out / names[1] / "NOTES.txt").read_text() == "mine"


def test_keep_artifacts_never_replaces_a_directory_it_did_not_write(tmp_path: Path, fake_calls: list[int]) -> None:
    out = tmp_path / "bench"
    assert _keep_bench(tmp_path, out).exit_code == 0  # a benchmark output without run artifacts
    mine = out / "runs" / "hdeval-lr-frac0.5-seed0"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    fake_calls.clear()
    r = _keep_bench(tmp_path, out, "--keep-artifacts", "--force")
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"error: refusing to replace {mine}: the previous benchmark in {out} did not write it; "
                        "move it away or choose another output directory\n")
    assert fake_calls == [] and (mine / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["hdeval-lr-frac0.5-seed0"]
    # runs/ as a symbolic link: refused too
    (mine / "notes.txt").unlink()
    mine.rmdir()
    (out / "runs").rmdir()
    (tmp_path / "elsewhere").mkdir()
    (out / "runs").symlink_to(tmp_path / "elsewhere")
    r = _keep_bench(tmp_path, out, "--keep-artifacts", "--force")
    assert r.exit_code == 2 and "refusing to write run artifacts into" in r.stderr
    assert fake_calls == [] and list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.parametrize("methods, options, message", [
    ("direct,paireval", ("paireval.comparisons=40",), "paireval run (train-frac 0.5, seed 0): --comparisons 40 is "
                                                     "more than the"),
    ("direct,paireval", ("paireval.comparison_data=MISSING",), "paireval run (train-frac 0.5, seed 0): comparison "
                                                               "file MISSING does not exist"),
    ("direct,hdeval", ("hdeval.scorer=pairwise", "hdeval.comparisons=40"),
     "hdeval run (train-frac 0.5, seed 0): --comparisons 40 is more than the"),
])
def test_a_method_option_its_fit_refuses_stops_the_sweep_before_any_call(
        tmp_path: Path, fake_calls: list[int], methods: str, options: tuple[str, ...], message: str) -> None:
    # the direct run comes first: a paireval / hdeval run that cannot start must not let it pay first
    out, missing = tmp_path / "bench", str(tmp_path / "missing.jsonl")
    opts = [a for o in options for a in ("--method-option", o.replace("MISSING", missing))]
    r = _keep_bench(tmp_path, out, "--methods", methods, *opts)
    assert r.exit_code == 2, r.output
    err = r.stderr.replace(missing, "MISSING")
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err
    assert fake_calls == [] and not out.exists()


def test_a_scorer_the_pairwise_task_refuses_stops_the_sweep_before_any_call(
        tmp_path: Path, fake_calls: list[int]) -> None:
    out = tmp_path / "bench"
    r = _pair_bench(tmp_path, out, "--method-option", "hdeval.scorer=pairwise")
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: hdeval run (train-frac 0.5, seed 0): --scorer pairwise ")
    assert len(r.stderr.strip().splitlines()) == 1
    assert fake_calls == [] and not out.exists()


class _Saves:
    method = "direct"

    def save(self, path: Path, force: bool = False) -> Path:
        path.mkdir(parents=True)
        (path / "manifest.json").write_text("{}")
        return path


class _DiskFull:
    def save(self, path: Path, force: bool = False) -> Path:
        import errno
        import os

        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("previous", ["none", "empty", "benchmark"])
def test_a_failed_write_of_the_run_artifacts_leaves_the_output_directory_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, previous: str) -> None:
    # the disk fills while the run artifacts are saved: the ones this write saved are taken back,
    # so the directory is as before (absent, or the previous benchmark) and a rerun may write it
    import hdeval.benchmark.output as written

    monkeypatch.setattr(written, "render_markdown", lambda results: "table\n")
    monkeypatch.setattr(written, "render_html", lambda results: "<html></html>\n")
    out = tmp_path / "bench"
    results = {"format": written.FORMAT, "runs": []}
    if previous == "benchmark":
        written.write_benchmark(results, out)
    elif previous == "empty":
        out.mkdir()
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as exc:
        written.write_benchmark(results, out, force=True, artifacts={"a-seed0": _Saves(), "b-seed0": _DiskFull()})
    assert str(exc.value) == f"cannot write the benchmark to {out}: No space left on device"
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before
    written.check_output_dir(out, force=True, artifacts=["a-seed0", "b-seed0"])  # a rerun is not refused


def test_run_artifact_names_tell_every_training_fraction_apart() -> None:
    # two fractions equal in 6 significant digits: one run's artifact must not replace the other's
    from hdeval.benchmark.spec import BenchmarkSpec

    spec = BenchmarkSpec("faireval", ("dna",), ("lr",), 1, (0.1234567, 0.1234568, 0.5))
    assert spec.artifact_names() == ["dna-frac0.1234567-seed0", "dna-frac0.1234568-seed0", "dna-frac0.5-seed0"]


# ------------------------------------------------------------------ one set of rows
def test_limit_never_cuts_the_last_document() -> None:
    from hdeval.core.types import Sample
    from hdeval.data.samples import limit_samples

    samples = [Sample(id=f"d{d}-{k}", doc_id=f"d{d}", fields={"x": "y"}, scores={})
               for d in range(10) for k in range(3)]
    for limit in (1, 4, 5, 7, 29):
        got = limit_samples(samples, limit, seed=0)
        per_doc = {}
        for s in got:
            per_doc[s.doc_id] = per_doc.get(s.doc_id, 0) + 1
        assert set(per_doc.values()) == {3}, limit  # every document whole
        assert limit <= len(got) < limit + 3  # at least N, at most one document more


def test_failed_rows_are_left_out_for_every_method_and_each_failure_rate_is_reported(tmp_path: Path) -> None:
    """A fake LLM that garbles some of its replies (below the 20% a run allows): direct leaves those rows empty, HD-Eval
    imputes them; both are scored on the rows neither failed, and each reports its failure rate."""
    from hdeval.core.metrics import metric_table
    from hdeval.run.train import train

    out = tmp_path / "bench"
    r = _bench(tmp_path, out, "--methods", "direct,hdeval", "--aggregators", "lr", "--seeds", "1",
               "--train-fracs", "0.5", "--llm", "fake:garbage=0.15")
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    direct, hd = res["runs"]
    n = direct["n_test"]
    assert direct["rows"]["test"] == hd["rows"]["test"] == n
    assert direct["rows"]["failed"] > 0 and hd["rows"]["failed"] > 0
    assert direct["rows"]["failure_rate"] == pytest.approx(direct["rows"]["failed"] / n, abs=1e-6)
    # by hand from both score tables: the rows neither method has an empty cell in
    tables = {}
    for method in ("direct", "hdeval"):
        own = {"layers": 2, "aggregator": "lr"} if method == "hdeval" else {}  # direct takes neither
        fitted = train(task=str(tmp_path / "toy_task.toml"), data=str(tmp_path / "toy.jsonl"), method=method,
                       llm="fake:garbage=0.15", limit=33, seed=0, train_frac=0.5, cache_dir=str(tmp_path / "cache"),
                       **own)
        t = fitted.score_table
        test = t[t["split"] == "test"]
        cells = test[[c for c in test.columns if c not in ("sample_id", "split") and not c.startswith("human:")]]
        tables[method] = (fitted, t, test, cells.isna().any(axis=1).to_numpy())
    failed = tables["direct"][3] | tables["hdeval"][3]
    assert int(tables["direct"][3].sum()) == direct["rows"]["failed"]
    assert direct["rows"]["compared"] == hd["rows"]["compared"] == int((~failed).sum()) < n
    fitted, t, test, _ = tables["hdeval"]
    aspects = ["clarity", "accuracy"]
    y = test[[f"human:{a}" for a in aspects]].to_numpy(float)
    pred = fitted.held_out_predictions(t, test)
    assert hd["dataset"] == metric_table(y[~failed], pred[~failed], aspects)  # not its imputed rows
    # beside it, each method's figure on all its own rows and its failure rate
    mine = ~tables["hdeval"][3]
    assert hd["own_rows"]["rows"] == int(mine.sum()) >= hd["rows"]["compared"]
    # direct, which fails on fewer rows, is also shown on the rows only HD-Eval failed on
    assert direct["own_rows"]["rows"] == int((~tables["direct"][3]).sum()) > direct["rows"]["compared"]
    assert hd["own_rows"]["dataset"] == metric_table(y[mine], pred[mine], aspects)
    assert hd["own_rows"]["failure_rate"] == hd["rows"]["failure_rate"]
    setting = next(s for s in res["settings"] if s["method"] == "hdeval")
    assert setting["own_rows"]["average_spearman"]["mean"] == hd["own_rows"]["dataset"]["average"]["spearman"]
    md = (out / "results.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| direct | 0.5 |"))
    assert f"| {direct['rows']['failure_rate']:.3f} | {direct['rows']['compared']} |" in row
    hd_row = next(line for line in md.splitlines() if line.startswith("| hdeval-lr | 0.5 |"))
    assert f"({hd['own_rows']['rows']} rows) |" in hd_row


def test_a_tiny_p_value_is_printed_as_a_bound() -> None:
    from hdeval.benchmark.tables import _delta

    y, groups, rng = _noisy()
    good = y + rng.normal(scale=0.05, size=y.shape)
    bad = rng.normal(size=y.shape)
    vs = pooled_paired_bootstrap([(y, good, bad, groups)], n_resamples=999)
    assert vs["p_value"] < 0.001 and _delta(vs).endswith(", p < 0.001")
    close = good + rng.normal(scale=0.02, size=y.shape)
    vs = pooled_paired_bootstrap([(y, good, close, groups)], n_resamples=999)
    assert vs["p_value"] > 0.001 and _delta(vs).endswith(f", p={vs['p_value']:.3f}")
    # an older results.json's bootstrap p at its resamples' floor stays a bound
    old = {"difference": 0.2, "low": 0.1, "high": 0.3, "p_value": 0.002, "p_floor": 0.002}
    assert _delta(old).endswith(", p ≤ 0.002")


def test_overlapping_test_sets_are_resampled_once_not_as_independent_data() -> None:
    # Three seeds that tested the very same documents hold no more test information than one:
    # resampling each seed apart (the old pooled bootstrap) narrowed the interval by about √3.
    y, groups, rng = _noisy(60)
    pred = y + rng.normal(size=y.shape)
    one = pooled_bootstrap_ci([(y, pred, groups)], n_resamples=400, seed=0)
    three = pooled_bootstrap_ci([(y, pred, groups)] * 3, n_resamples=400, seed=0)
    assert three["test_sd"] == pytest.approx(one["test_sd"], rel=0.02)
    assert three["high"] - three["low"] == pytest.approx(one["high"] - one["low"], rel=0.02)


def test_the_interval_holds_the_training_variability_the_seeds_show() -> None:
    # Seeds whose evaluators differ (here: in their noise) spread more than their test sets
    # explain: that spread widens the interval; without the training sizes, or with one seed, the
    # interval says it covers the test documents only.
    cases = []
    for seed in range(3):
        y, groups, rng = _noisy(seed=seed)
        cases.append((y, y + rng.normal(scale=0.3 + seed, size=y.shape), groups))
    test_only = pooled_bootstrap_ci(cases, n_resamples=300)
    both = pooled_bootstrap_ci(cases, n_resamples=300, train_sizes=[60, 60, 60])
    assert both["estimate"] == pytest.approx(np.mean([avg_spearman(c[0], c[1]) for c in cases]), abs=1e-6)
    assert test_only["covers"] == "test documents only" and test_only["training_sd"] is None
    assert both["covers"] == "test documents and training" and both["training_sd"] > 0.1
    assert both["test_sd"] == test_only["test_sd"]
    assert both["low"] < test_only["low"] and both["high"] > test_only["high"]
    one = pooled_bootstrap_ci(cases[:1], n_resamples=300, train_sizes=[60])
    assert one["covers"] == "test documents only" and one["training_sd"] is None


def test_few_test_documents_warn_in_every_output(tmp_path: Path) -> None:
    from hdeval.benchmark.sweep import few_documents

    assert few_documents([{"rows": {"documents_compared": 30}}]) == []
    (w,) = few_documents([{"rows": {"documents_compared": 30}}, {"rows": {"documents_compared": 12}}])
    assert w.startswith("only 12 test document(s) compared (fewer than 30)")
    out = tmp_path / "bench"
    r = _bench(tmp_path, out, "--methods", "direct", "--seeds", "1", "--train-fracs", "0.5")
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    (w,) = res["warnings"]
    assert "test document(s) compared (fewer than 30)" in w
    assert f"**Warning:** {w}" in (out / "results.md").read_text()
    assert f"warning: {w}" in r.stderr
    assert "test documents" in (out / "report.html").read_text()
