"""The report of a jury artifact: its jury sections show metrics.json's figures, as recorded,
and escape what the artifact holds.

Simulated judges (tests/simjury.py) of known quality; the report is drawn by the real
``hdeval report`` command."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import run_cli, trained_and_refitted
from simjudge import pointwise_rows, write_pointwise
from simjury import jury

from hdeval.artifact.directory import MANIFEST, sha256_file
from hdeval.run.train import train

HOSTILE = '<img src=x onerror="alert(1)">'


class Tables(HTMLParser):
    """Every table of a page as rows of cell texts, and every tag seen."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.tags: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def table(self, *head: str) -> dict[str, list[str]]:
        """The table whose header starts with ``head``: first cell -> the row's cells."""
        (t,) = [t for t in self.tables if t and t[0][: len(head)] == list(head)]
        return {row[0]: row for row in t[1:]}


def rewrite_metrics(art: Path, change) -> dict:
    """metrics.json changed by ``change`` and resealed, so that the artifact loads."""
    path = art / "metrics.json"
    metrics = json.loads(path.read_text(encoding="utf-8"))
    change(metrics)
    path.write_text(json.dumps(metrics), encoding="utf-8")
    manifest = json.loads((art / MANIFEST).read_text(encoding="utf-8"))
    manifest["files"]["metrics.json"] = sha256_file(path)
    (art / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    return metrics


def f3(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def band(entry) -> str:
    return f"[{f3(entry['low'])}, {f3(entry['high'])}]"


def signed(x) -> str:
    s = f3(x)
    return s if s.startswith("-") else "+" + s


@pytest.mark.slow
def test_a_jury_report_shows_metrics_json_figures_and_escapes_the_artifact(tmp_path: Path) -> None:
    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=24, seed=3))
    judges = jury(0.6, 1.2, None)
    jf = tmp_path / "jury.toml"
    jf.write_text('[[judge]]\nname = "j1"\nllm = "fake"\nprice_in = 1.5\nprice_out = 6\n'
                  '[[judge]]\nname = "j2"\nllm = "fake"\n[[judge]]\nname = "j3"\nllm = "fake"\n',
                  encoding="utf-8")
    ev = train(task=str(task), data=str(data), jury=str(jf), judge_backends=judges, layers=1,
               aggregator="lr", cache_dir=str(tmp_path / "cache"), seed=3, prune_judges=True)
    art = ev.save(tmp_path / "art")
    # an artifact is untrusted: a tampered metrics.json's names must reach the page as text
    metrics = rewrite_metrics(art, lambda m: m["jury"]["agreement_alpha"].update({HOSTILE: 0.5}))

    res = run_cli("report", art, "-o", tmp_path / "rep", "--max-samples", "10", "--repeats", "2",
                  "--curve-points", "2")
    assert res.exit_code == 0, res.output
    html = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    page = Tables()
    page.feed(html)
    rec = metrics["jury"]
    base, iv = rec["baselines"], rec["intervals"]
    # the pure-noise judge, as built; then j2 (noisier than j1): once j3 is gone, leaving j2 out
    # costs .006 of the cross-validated figure, within the .01 margin
    assert rec["dropped"] == ["j3", "j2"]

    # each evaluator's held-out figures, interval and difference, as metrics.json has them
    rows = page.table("evaluator")
    learned = rows["learned jury"]
    assert learned[1:4] == [f3(base["learned"]["average"]["pearson"]), f3(base["learned"]["average"]["spearman"]),
                            band(iv["learned"])]
    assert base["learned"] == metrics["final"]
    expected = {"jury mean (PoLL's average pooling)": (base["jury_mean"], iv["jury_mean"])}
    for n in ("j1", "j2", "j3"):
        tag = " (dropped by --prune-judges)" if n in rec["dropped"] else ""
        expected[f"{n} alone, direct{tag}"] = (base["judges"][n]["direct"], iv["judges"][n]["direct"])
        expected[f"{n} alone, HD-Eval{tag}"] = (base["judges"][n]["hdeval"], iv["judges"][n]["hdeval"])
    assert set(rows) == {"learned jury", *expected}
    for label, (table, entry) in expected.items():
        d = entry["learned_minus"]
        assert rows[label][1:] == [f3(table["average"]["pearson"]), f3(table["average"]["spearman"]), band(entry),
                                   f"{signed(d['difference'])} {band(d)}"], label
        assert d["low"] <= d["difference"] <= d["high"]
    per_aspect = page.table("held-out Spearman per aspect")
    assert per_aspect["j1 alone, direct"][1:] == [f3(base["judges"]["j1"]["direct"][a]["spearman"])
                                                 for a in ("clarity", "accuracy")]
    # the learned jury beats the pure-noise judge, and the report says so with an interval above 0
    assert iv["judges"]["j3"]["direct"]["learned_minus"]["low"] > 0

    # agreement, correlated errors, effective number
    alpha = page.table("criterion", "Krippendorff's alpha")
    assert alpha["clarity — Clarity"][1] == f3(rec["agreement_alpha"]["clarity"])
    assert alpha[HOSTILE][1] == "0.500"  # shown as text ...
    assert "<img" not in html.replace("<img src=\"data:image/png", "")  # ... never as a tag
    assert "&lt;img src=x onerror=" in html
    errors = page.table("judges' errors")
    assert errors["j1"][1:] == [f3(rec["error_correlation"]["j1"][b]) for b in ("j1", "j2", "j3")]
    assert f"3 judges behave like {rec['effective_judges']:.2f} independent ones." in html

    # each judge's calls, tokens, cost and importance
    judges_t = page.table("judge")
    for n in ("j1", "j2", "j3"):
        c = rec["cost"][n]
        assert judges_t[n][2:8] == ["dropped" if n in rec["dropped"] else "kept", f"{c['calls']:,}", f"{c['hits']:,}",
                                    f"{c['prompt_tokens']:,}", f"{c['completion_tokens']:,}",
                                    "n/a (no price)" if c["cost"] is None else f"{c['cost']:.4f}"]
        assert judges_t[n][8] == signed(rec["importance_cv_spearman"][n])
    assert rec["cost"]["j1"]["cost"] > 0 and rec["cost"]["j2"]["cost"] is None

    # report.json carries the same record
    numbers = json.loads((tmp_path / "rep" / "report.json").read_text(encoding="utf-8"))
    assert numbers["jury"] == rec


@pytest.mark.slow
def test_a_jury_report_from_an_artifact_without_intervals_says_so(tmp_path: Path) -> None:
    """An artifact trained before the intervals were recorded still draws, with "n/a"."""
    task, data = write_pointwise(tmp_path, pointwise_rows(n_docs=16, seed=1))
    judges = jury(0.6, 1.2)
    jf = tmp_path / "jury.toml"
    jf.write_text('[[judge]]\nname = "j1"\nllm = "fake"\n[[judge]]\nname = "j2"\nllm = "fake"\n', encoding="utf-8")
    ev = train(task=str(task), data=str(data), jury=str(jf), judge_backends=judges, layers=1,
               aggregator="lr", cache_dir=str(tmp_path / "cache"), seed=1)
    art = ev.save(tmp_path / "art")
    metrics = rewrite_metrics(art, lambda m: m["jury"].pop("intervals"))
    res = run_cli("report", art, "-o", tmp_path / "rep", "--max-samples", "10", "--repeats", "2",
                  "--curve-points", "2")
    assert res.exit_code == 0, res.output
    page = Tables()
    page.feed((tmp_path / "rep" / "report.html").read_text(encoding="utf-8"))
    rows = page.table("evaluator")
    assert rows["learned jury"][2] == f3(metrics["final"]["average"]["spearman"])
    assert rows["learned jury"][3] == "n/a" and rows["j1 alone, direct"][4] == "n/a"


@pytest.mark.slow
def test_a_refitted_artifacts_report_shows_the_swap_as_metrics_json_records_it(tmp_path: Path) -> None:
    art, art2 = trained_and_refitted(tmp_path)
    rec = json.loads((art2 / "metrics.json").read_text(encoding="utf-8"))["refit"]
    res = run_cli("report", art2, "-o", tmp_path / "rep", "--max-samples", "10", "--repeats", "2",
                  "--curve-points", "2")
    assert res.exit_code == 0, res.output
    html = (tmp_path / "rep" / "report.html").read_text(encoding="utf-8")
    page = Tables()
    page.feed(html)
    rows = list(page.table("judge", "held-out avg Spearman").values())
    assert [r[1] for r in rows] == [f3(rec["spearman_before"]), f3(rec["spearman_after"]),
                                    f"{f3(rec['change'])} [{f3(rec['interval'][0])}, {f3(rec['interval'][1])}]"]
    before = json.loads((art / "manifest.json").read_text(encoding="utf-8"))["llm"]["identity"]
    assert rec["from"] == before and rows[0][0] == f"before: {before}" and rows[1][0].startswith("after: fake")
    assert f"The new judge is {rec['verdict']} than {before}." in html
    assert json.loads((tmp_path / "rep" / "report.json").read_text(encoding="utf-8"))["refit"] == rec
