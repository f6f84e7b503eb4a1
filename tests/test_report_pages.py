"""Every method's report page (pointwise HD-Eval, pairwise HD-Eval, DnA, the benchmark) in the
shared style: the verdict banner, embedded plots, hostile text escaped, the per-sample view with
the LLM's raw replies read from the cache (and said so when the cache is not there), and the
terminal's file:// URL. Small runs with the fake LLM."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from conftest import run_cli, write_jsonl
from markupsafe import escape

from hdeval.report.banner import Banner, llm_line, model_size, split_line

HOSTILE = '<script>alert("x")</script> & <img src=x onerror=alert(1)>'
PNG = b"\x89PNG\r\n\x1a\n"


def _hostile_copy(src: Path, dest: Path, n: int, fields: tuple[str, ...]) -> Path:
    """The first ``n`` rows of ``src`` with hostile markup appended to ``fields`` of every row,
    so whichever sample a report shows carries it."""
    rows = [json.loads(line) for line in src.read_text(encoding="utf-8").splitlines()[:n]]
    for r in rows:
        for f in fields:
            r[f] = f"{r[f]} {HOSTILE}"
    return write_jsonl(dest, rows)


def _images(page: str) -> list[bytes]:
    srcs = re.findall(r'<img src="([^"]*)"', page)
    out = []
    for src in srcs:
        assert src.startswith("data:image/png;base64,"), src[:40]
        raw = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert raw.startswith(PNG)
        out.append(raw)
    return out


def _safe(page: str) -> None:
    """No markup from the data survives: the hostile text is there, escaped, and the page has
    no script and loads nothing from outside."""
    assert "<script" not in page.lower() and "onerror=alert" not in page.replace("onerror=alert(1)&gt;", "")
    assert str(escape(HOSTILE)) in page
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", page)


def _banner(page: str) -> str:
    m = re.search(r'<section class="verdict[^"]*">(.*?)</section>', page, re.S)
    assert m, "no verdict banner"
    assert page.index("<section class=\"verdict") < page.index("<h2>", page.index("</section>"))
    return m.group(1)


def _url(stdout: str, page: Path) -> None:
    assert f"open: {page.resolve().as_uri()}" in stdout.splitlines()


def _renders(page: Path, tmp_path: Path) -> None:
    """The page draws in a real browser (headless Chromium), when one is installed."""
    import shutil

    if not (shutil.which("chromium") or Path("/usr/bin/chromium").exists()):
        return  # tests/test_report.py skips its rendering test with the install hint
    from test_report import _screenshot_is_not_blank

    _screenshot_is_not_blank(page, tmp_path)


# --------------------------------------------------------------------------- the banner's rules
def test_banner_warns_about_fake_and_tiny_llms_overfitting_and_a_small_test_set() -> None:
    assert model_size("llamacpp:SmolLM2-135M-Instruct.Q4_1.gguf#8b3c5b1f00") == pytest.approx(1.35e8)
    assert model_size("openai:gpt-4o-mini") is None  # "4o" is no size
    for ident, warned in (("fake:v1", True), ("llamacpp:SmolLM2-135M-Instruct.Q4_1.gguf#ab", True),
                          ("openai:Qwen2.5-0.5B-Instruct", True), ("openai:llama-3.1-70b-instruct", False),
                          ("openai:gpt-4o-mini", False)):
        b = Banner()
        llm_line(b, ident)
        assert b.lines[0].warn is warned, ident
    b = Banner()
    split_line(b, 32, 200, 20)  # the example: 32 training rows for 20 criteria
    assert [line.label for line in b.lines if line.warn] == ["overfitting"]
    b = Banner()
    split_line(b, 800, 30, 20)
    assert [line.label for line in b.lines if line.warn] == ["small test set"]
    b = Banner()
    split_line(b, 800, 800, 20)
    assert b.warnings == 0 and b.headline.startswith("No warnings")


# --------------------------------------------------------------------------- pointwise HD-Eval
def test_pointwise_report_has_banner_plots_escaped_text_and_the_largest_disagreements(data_dir, tmp_path):
    from hdeval.data.samples import read_samples
    from hdeval.judge.scoring import scoring_request
    from hdeval.llm.backends.fake import FakeBackend
    from hdeval.llm.cache.client import request_key
    from hdeval.methods.hdeval.evaluator import Evaluator

    data = _hostile_copy(data_dir / "sfres.jsonl", tmp_path / "sfres60.jsonl", 60, ("output",))
    cache, art = tmp_path / "cache", tmp_path / "art"
    r = run_cli("train", "--task", "sfres", "--data", data, "--llm", "fake", "--layers", "2",
                "--aggregator", "lr", "--cache-dir", cache, "--out", art, "-q")
    assert r.exit_code == 0, r.output
    r = run_cli("report", art, "--cache-dir", cache, "--max-samples", "10", "--curve-points", "3", "-q")
    assert r.exit_code == 0, r.output
    page_path = art / "report" / "report.html"
    _url(r.stdout, page_path)
    page = page_path.read_text(encoding="utf-8")
    _safe(page)
    ban = _banner(page)
    ev = Evaluator.load(art)
    assert "fake:v1" in ban and "offline fake LLM" in ban
    n = len(ev.feature_keys)
    assert f"30 training rows and 30 held-out rows for {n} criteria" in ban
    from hdeval.report.banner import ROWS_PER_FEATURE

    # the kept layer's criteria decide the overfitting line (layer 2: 30 rows for 15 criteria)
    assert ("overfitting" in ban) == (30 < ROWS_PER_FEATURE * n) and "small test set" in ban
    kept = json.loads((art / "metrics.json").read_text())["selection"]["kept_layer"]
    assert f"layer {kept}" in ban and "strongest baseline" in ban
    assert len(_images(page)) == 2 + 3 * 3
    # the per-sample view: the held-out sample furthest from the human scores comes first, with
    # every criterion's score and the reply the cache holds for exactly that prompt
    view = page[page.index("<h2>Largest disagreements with the human scores</h2>"):]
    first = re.search(r"<summary>([^:<]+):", view).group(1)
    test_ids = set(ev.run["split"]["test"])
    assert first in test_ids and view.count("<details") == 10
    sample = next(s for s in read_samples(data, ev.task, require_scores=False) if s.id == first)
    key = ev.feature_keys[-1]
    reply = FakeBackend().complete(scoring_request(ev.templates["score"], ev.task, ev.tree, ev.tree[key],
                                                   sample)).text
    first_block = view[:view.index("</details>")]
    assert re.search(rf'<td class="txt">{re.escape(str(escape(key)))} — [^<]*</td><td class="num">[0-9.]+</td>'
                     rf'<td class="reply">{re.escape(str(escape(reply)))}</td>', first_block)
    assert str(escape(HOSTILE)) in first_block  # the sample's own (escaped) text
    assert request_key  # the cache is read, not written: its files are unchanged below
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*")}

    # without the cache: the view says so, and no cache is created where it was looked for
    r = run_cli("report", art, "-o", tmp_path / "r2", "--cache-dir", tmp_path / "no-cache", "--max-samples", "5",
                "--curve-points", "3", "-q")
    assert r.exit_code == 0, r.output
    page2 = (tmp_path / "r2" / "report.html").read_text(encoding="utf-8")
    assert "is not available, so raw replies are not shown" in page2
    assert not (tmp_path / "no-cache").exists()
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*")} == before


# --------------------------------------------------------------------------- pairs
def _faireval_hostile(data_dir: Path, tmp_path: Path) -> Path:
    return _hostile_copy(data_dir / "faireval.jsonl", tmp_path / "pairs.jsonl", 40, ("output_a", "source"))


def _wrong_verdicts(page: str) -> list[tuple[str, str, str]]:
    return re.findall(r'<summary>([^:<]+): human <span>([^<]*)</span>, verdict <span class="wrong">([^<]*)</span>',
                      page)


def test_pairwise_hdeval_report_has_agreement_plots_and_wrong_verdicts_with_raw_replies(data_dir, tmp_path):
    import pandas as pd

    data = _faireval_hostile(data_dir, tmp_path)
    cache, art = tmp_path / "cache", tmp_path / "art"
    r = run_cli("train", "--task", "faireval", "--data", data, "--method", "hdeval", "--llm", "fake",
                "--layers", "2", "--aggregator", "lr", "--cache-dir", cache, "--out", art, "-q")
    assert r.exit_code == 0, r.output
    r = run_cli("report", art, "--cache-dir", cache)
    assert r.exit_code == 0, r.output
    page_path = art / "report" / "report.html"
    _url(r.stdout, page_path)
    page = page_path.read_text(encoding="utf-8")
    _safe(page)
    ban = _banner(page)
    assert "offline fake LLM" in ban and "20 training pairs and 20 held-out pairs for 20 criteria" in ban
    assert "layer kept" in ban and "equal-weight sum of the layer-1 differences" in ban
    for h in ("Agreement by layer", "Agreement with the human labels", "Confusion matrix",
              "Criterion weights (importance)", "Per-aspect differences"):
        assert f"<h2>{h}</h2>" in page
    assert len(_images(page)) == 5
    # the wrong verdicts are exactly the held-out pairs whose label the classifier misses
    m = json.loads((art / "metrics.json").read_text())
    wrong = _wrong_verdicts(page)
    right = sum(v for h, row in m["final"]["confusion"].items() for p, v in row.items() if h == p)
    assert len(wrong) == min(10, m["final"]["n"] - right) and all(h != p for _, h, p in wrong)
    test = set(pd.read_csv(art / "scores.csv", dtype=str).query("split == 'test'")["pair_id"])
    assert {pid for pid, _, _ in wrong} <= test
    block = page[page.index(f"<summary>{wrong[0][0]}:"):]
    block = block[:block.index("</details>")]
    assert "Response A" in block and str(escape(HOSTILE)) in block
    replies = re.findall(r'<td class="reply">([^<]*)</td>', block)
    assert len(replies) == 2 * 20 and all(t.strip() and t != "—" for t in replies)
    _renders(page_path, tmp_path)


def test_dna_report_has_weights_confusion_position_consistency_and_wrong_verdicts(data_dir, tmp_path):
    data = _faireval_hostile(data_dir, tmp_path)
    art = tmp_path / "art"
    r = run_cli("train", "--task", "faireval", "--data", data, "--method", "dna", "--llm", "fake", "--swap",
                "--cache-dir", tmp_path / "cache", "--out", art, "-q")
    assert r.exit_code == 0, r.output
    r = run_cli("report", art, "-o", tmp_path / "rep", "--cache-dir", tmp_path / "cache")
    assert r.exit_code == 0, r.output
    page_path = tmp_path / "rep" / "report.html"
    _url(r.stdout, page_path)
    page = page_path.read_text(encoding="utf-8")
    _safe(page)
    ban = _banner(page)
    m = json.loads((art / "metrics.json").read_text())
    assert "offline fake LLM" in ban and "position consistency" in ban
    assert f"{m['position_consistency']:.3f} of the pairs" in ban
    assert f"swap flip rate {m['swap_flip_rate']:.3f}" in ban and "tie margin" in ban
    assert f"swap flip rate         {m['swap_flip_rate']:.3f}" in r.stdout
    assert f"tie margin {m['tie_margin']['value']} (learned on {m['split']['train']} training pairs" in r.stdout
    for h in ("Agreement with the human labels", "Confusion matrix (llm weights)", "Confusion matrix (learned)",
              "Weights", "Per-aspect differences", "Position consistency"):
        assert f"<h2>{h}</h2>" in page, h
    assert len(_images(page)) == 6
    wrong = _wrong_verdicts(page)
    conf = m["test"]["llm_weights"]["confusion"]
    missed = sum(v for h, row in conf.items() for p, v in row.items() if h != p)
    assert len(wrong) == min(10, missed) and all(h != p for _, h, p in wrong)
    # per-aspect scores of both responses, as scores.csv holds them
    import pandas as pd

    table = pd.read_csv(art / "scores.csv", dtype={"pair_id": str}).set_index("pair_id")
    pid = wrong[0][0]
    block = page[page.index(f"<summary>{pid}:"):]
    block = block[:block.index("</details>")]
    for aspect in ("helpfulness", "accuracy"):
        assert re.search(rf'<td class="txt">{aspect}</td><td class="num">{table.loc[pid, aspect + ":a"]:.2f}</td>'
                         rf'<td class="num">{table.loc[pid, aspect + ":b"]:.2f}</td>', block)
    # each aspect's raw reply: the one the cache holds for that pair's prompt (A shown first)
    from hdeval.data.samples import read_task_samples
    from hdeval.llm.backends.fake import FakeBackend
    from hdeval.methods.dna.prompts import score_request
    from hdeval.methods.dna.replies import AspectSpec
    from hdeval.methods.registry import load_artifact

    ev = load_artifact(art)
    pair = next(p for p in read_task_samples(data, ev.task) if p.id == pid)
    a = ev.task.aspect("accuracy")
    reply = FakeBackend().complete(score_request(ev.templates["score"], ev.task, pair,
                                                 AspectSpec(a.key, a.name, a.definition), False,
                                                 ev.settings.logprobs)).text
    assert re.search(rf'<td class="txt">accuracy</td>(<td class="num">[^<]*</td>){{3}}'
                     rf'<td class="reply">{re.escape(str(escape(reply)))}</td>', block)
    assert str(escape(HOSTILE)) in block and "Response B" in block
    _renders(page_path, tmp_path)


# --------------------------------------------------------------------------- benchmark
def test_benchmark_report_has_html_tables_a_banner_and_no_markdown(data_dir, tmp_path):
    out = tmp_path / "bench"
    data = _faireval_hostile(data_dir, tmp_path)
    r = run_cli("benchmark", "--task", "faireval", "--data", data, "--methods", "dna-direct,dna",
                "--seeds", "1", "--resamples", "20", "--llm", "fake", "--cache-dir", tmp_path / "cache", "-q",
                "-o", out)
    assert r.exit_code == 0, r.output
    _url(r.stdout, out / "report.html")
    page = (out / "report.html").read_text(encoding="utf-8")
    md = (out / "results.md").read_text(encoding="utf-8")
    assert "| method |" in md and "|---|" not in page and "| method |" not in page and "<pre>" not in page
    assert page.count("<table>") == md.count("| method |") == 2
    assert "<th class=\"txt\">method</th>" in page and "<td class=\"txt\">dna-direct</td>" in page
    _renders(out / "report.html", tmp_path)
    ban = _banner(page)
    assert "offline fake LLM" in ban and "strongest baseline" in ban and "dna-direct" in ban
    assert len(_images(page)) == 1


# --------------------------------------------------------------------------- the reply cache, read-only
def test_raw_replies_are_read_without_writing_and_entries_hdeval_never_writes_are_skipped(tmp_path):
    import sqlite3

    import diskcache

    from hdeval.llm.backends.base import CompletionRequest, Message
    from hdeval.llm.backends.fake import FakeBackend
    from hdeval.llm.cache.client import CachedBackend
    from hdeval.llm.cache.codec import encode_completion
    from hdeval.llm.cache.guard import DBNAME, TABLE_DBNAME
    from hdeval.llm.cache.store import JSONDisk
    from hdeval.report.samples import read_only_lookup

    cache = tmp_path / "cache"
    llm = CachedBackend(FakeBackend(), cache)
    reqs = [CompletionRequest(messages=(Message("user", f"Score {i}: <b>x</b>"),), kind="score")
            for i in range(3)]
    replies = [llm.complete(r) for r in reqs]
    texts = [c.text for c in replies]
    keys = [llm.key(r) for r in reqs]
    llm.close()
    # the first reply stays in the reply table; the two others move to diskcache's rows, where
    # an hdeval before the table stored them (still read)
    con = sqlite3.connect(cache / TABLE_DBNAME)
    con.execute("DELETE FROM reply WHERE key != ?", (bytes.fromhex(keys[0]),))
    con.commit()
    con.close()
    with diskcache.Cache(str(cache), disk=JSONDisk) as c:
        for k, r in zip(keys[1:], replies[1:]):
            c.set(k, encode_completion(r))
    con = sqlite3.connect(cache / DBNAME)
    # keys are stored as their 32 bytes: a pickled value (never unpickled), and one entry under
    # the hex text key an older hdeval wrote (still read)
    con.execute("UPDATE Cache SET mode = 4 WHERE key = ?", (bytes.fromhex(keys[1]),))
    con.execute("UPDATE Cache SET key = ? WHERE key = ?", (keys[2], bytes.fromhex(keys[2])))
    con.commit()
    con.close()
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in cache.rglob("*")}
    found, note = read_only_lookup(cache, [keys[0], keys[1], keys[2], "0" * 64])
    assert note is None and found == {keys[0]: texts[0], keys[2]: texts[2]}
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in cache.rglob("*")} == before
    found, note = read_only_lookup(tmp_path / "missing", keys)
    assert found == {} and "is not available" in note and not (tmp_path / "missing").exists()


def test_the_per_sample_view_shows_the_replies_to_the_requests_the_evaluator_names(tmp_path):
    """report/ knows no method: it asks the fitted evaluator which request is behind each (row,
    column), so a method it has never heard of (a plug-in) is served as the built-in ones are,
    and one that cannot say gets a note, not an error."""
    from hdeval.llm.backends.base import CompletionRequest, Message
    from hdeval.llm.backends.fake import FakeBackend
    from hdeval.llm.cache.client import CachedBackend
    from hdeval.methods.base import Fitted
    from hdeval.report import samples

    def ask(row: str, column: str) -> CompletionRequest:
        return CompletionRequest(messages=(Message("user", f"Score {row} on {column}"),), kind="score")

    class Unsaved(Fitted):  # the seam's required members, which this view never calls
        def score(self, samples, backend=None, cache_dir=None, concurrency=None, progress=None):
            raise AssertionError("the per-sample view scores nothing")

        def write(self, out):
            raise AssertionError("the per-sample view writes nothing")

        @classmethod
        def from_artifact(cls, art):
            raise AssertionError("the per-sample view loads nothing")

    class PluginFitted(Unsaved):
        method = "plugin"

        def reply_requests(self, items, columns):
            return [((row, c), ask(row, c)) for row in items for c in columns], None

    cache = tmp_path / "cache"
    llm = CachedBackend(FakeBackend(), cache)
    text = llm.complete(ask("s1", "clarity")).text  # s2 was never asked
    llm.close()
    got = samples.replies(PluginFitted(None, None, None, FakeBackend().identity, {}), ["s1", "s2"], ["clarity"],
                          cache)
    assert got.note is None and got.texts == {("s1", "clarity"): text} and text

    class Silent(Unsaved):  # a method that does not say how it asked
        method = "silent"

    got = samples.replies(Silent(None, None, None, FakeBackend().identity, {}), ["s1"], ["clarity"], cache)
    assert got.texts == {} and "raw replies are not shown" in got.note


def test_counts_are_ticked_as_integers(monkeypatch):
    """Layers and criteria counts are whole numbers: no 1.5 on their axes."""
    import hdeval.report.plots as plots

    figs = []

    def keep(fig, tight=False):
        fig.canvas.draw()
        figs.append([t.get_position()[0] for t in fig.axes[0].get_xticklabels() if t.get_text()])
        plots.pyplot().close(fig)
        return b""

    monkeypatch.setattr(plots, "png", keep)
    layers = {str(k): {"w_ties": 0.4 + k / 20, "wo_ties": 0.5 + k / 20} for k in (1, 2, 3)}
    plots.layer_agreement(layers, {"w_ties": 0.3, "wo_ties": 0.35}, "baseline")
    ticks = figs[0]
    assert len(ticks) >= 2 and all(float(x).is_integer() for x in ticks), ticks
