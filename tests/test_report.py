"""Reports and explanations (hdeval.methods.hdeval.explain, hdeval.methods.hdeval.report, `hdeval report` / `explain` /
`apply --explain`) on small evaluators trained with the offline fake backend."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from click.testing import CliRunner

DATA_DIR = os.environ.get("HDEVAL_DATA_DIR")
SFRES = Path(DATA_DIR) / "sfres.jsonl" if DATA_DIR else None
pytestmark = pytest.mark.skipif(
    SFRES is None or not SFRES.is_file(),
    reason="HDEVAL_DATA_DIR is not set or holds no sfres.jsonl (set it to the shared data folder)",
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
KINDS = ("lr", "dt", "rf", "nn")


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("report")


@pytest.fixture(scope="module")
def cache_dir(workdir: Path) -> str:
    return str(workdir / "cache")


@pytest.fixture(scope="module")
def two_group_task(workdir: Path) -> Path:
    """sfres with quality on a wider range, so the aggregator has a multi-output pipeline
    (informativeness + naturalness) and a single-output one (quality)."""
    src = Path(__file__).resolve().parents[1] / "tasks" / "sfres.toml"
    text = src.read_text(encoding="utf-8")
    head, quality = text.split('key = "quality"')
    path = workdir / "sfres_two_groups.toml"
    path.write_text(head + 'key = "quality"' + quality.replace("range = [1, 6]", "range = [1, 7]"),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def artifact(workdir: Path, cache_dir: str, two_group_task: Path) -> Callable[[str], Path]:
    """Trains (once per module) and saves an evaluator per aggregator kind; "lr-2g" is the
    two-group task."""
    from hdeval.run.train import train

    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            kind, _, variant = name.partition("-")
            task = str(two_group_task) if variant == "2g" else "sfres"
            ev = train(task=task, data=str(SFRES), llm="fake", layers=2, limit=80, aggregator=kind,
                       cache_dir=cache_dir)
            made[name] = ev.save(workdir / f"art-{name}")
        return made[name]

    return get


def _rows(path: Path, split: str):
    from hdeval.methods.hdeval.evaluator import Evaluator
    from hdeval.methods.hdeval.explain import score_table, split_rows

    ev = Evaluator.load(path)
    return ev, split_rows(ev, score_table(ev), split)


def _cli(*args: str):
    from hdeval.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def rf_report(artifact: Callable[[str], Path], workdir: Path) -> Path:
    out = workdir / "rf-report"
    res = _cli("report", str(artifact("rf")), "-o", str(out), "--max-samples", "30",
               "--curve-points", "6", "-q")
    assert res.exit_code == 0, res.output
    assert "report written to" in res.stdout
    return out


# --------------------------------------------------------------------------- the report
def test_report_has_every_section_and_only_embedded_pngs(rf_report: Path) -> None:
    page = (rf_report / "report.html").read_text(encoding="utf-8")
    for title in ("Held-out correlation by layer", "Criteria tree with importance",
                  "Permutation importance per aspect", "SHAP per aspect", "Criteria efficiency"):
        assert f"<h2>{title}</h2>" in page
    assert page.count("How to read it.") == 6  # five sections and the per-sample view
    # Self-contained: no scripts, nothing fetched from anywhere.
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", page)
    srcs = re.findall(r'<img src="([^"]*)"', page)
    assert len(srcs) == 2 + 3 * 3  # layers + efficiency, and per aspect: importance, beeswarm, |SHAP|
    from PIL import Image

    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        raw = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert raw.startswith(PNG_SIGNATURE)
        with Image.open(io.BytesIO(raw)) as im:
            im.verify()
            assert im.size[0] >= 400 and im.size[1] >= 150
    # the tree, with every criterion's key, name and definition
    data = json.loads((rf_report / "report.json").read_text(encoding="utf-8"))
    for node in data["tree"]:
        assert node["key"] in page
        assert set(node) >= {"layer", "key", "name", "definition", "importance", "rolled_up_importance"}


def test_report_draws_the_same_page_twice(artifact: Callable[[str], Path], cache_dir: str, workdir: Path) -> None:
    # shap's beeswarm jitters with NumPy's global generator: the first report moves it on, so an
    # unseeded second page would place the dots differently
    pages = []
    for name in ("rf-page-1", "rf-page-2"):
        res = _cli("report", str(artifact("rf")), "-o", str(workdir / name), "--cache-dir", cache_dir,
                   "--max-samples", "30", "--curve-points", "6", "-q")
        assert res.exit_code == 0, res.output
        pages.append((workdir / name / "report.html").read_text(encoding="utf-8"))
    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d")  # when each page was written
    assert "data:image/png" in pages[0] and stamp.sub("", pages[0]) == stamp.sub("", pages[1])


def test_report_numbers_match_the_aggregator(rf_report: Path, artifact: Callable[[str], Path]) -> None:
    from hdeval.core.metrics import metric_table
    from hdeval.methods.hdeval.prune import aspect_importance

    data = json.loads((rf_report / "report.json").read_text(encoding="utf-8"))
    ev, test = _rows(artifact("rf"), "test")
    keys, aspects = ev.feature_keys, ev.aggregator.aspects

    # permutation importance: the measure training prunes with, on the held-out rows
    perm = data["permutation_importance"]
    imp = aspect_importance(ev.aggregator, test.X, test.Y, perm["n_repeats"], perm["random_state"])
    for a in aspects:
        np.testing.assert_allclose([perm["per_aspect"][a][k] for k in keys], imp[a], atol=1e-12)

    # tree: importance = own, summed over aspects; rolled up = own + descendants
    nodes = {n["key"]: n for n in data["tree"]}
    assert list(nodes) == ev.tree.keys
    for k, n in nodes.items():
        assert n["importance"] == pytest.approx(sum(perm["per_aspect"][a][k] for a in aspects), abs=1e-12)
        kids = [c.key for c in ev.tree.children(k)]
        assert n["rolled_up_importance"] == pytest.approx(
            n["importance"] + sum(nodes[c]["rolled_up_importance"] for c in kids), abs=1e-12)

    # held-out correlations: recomputed from scores.csv == metrics.json == report
    final = metric_table(test.Y, ev.aggregator.predict(test.X), aspects)
    corr = data["correlations"]
    for a in [*aspects, "average"]:
        for m in ("pearson", "spearman", "kendall"):
            assert corr["final_recomputed"][a][m] == pytest.approx(final[a][m], abs=1e-12)
            assert corr["final"][a][m] == pytest.approx(final[a][m], abs=1e-6)
    assert corr["layers"] == ev.metrics["layers"]
    assert corr["direct_layer1"] == ev.metrics["direct_layer1"]
    assert corr["mean_all_criteria"] == ev.metrics["mean_all_criteria"]

    # the efficiency curve ends with every criterion: exactly the trained aggregator
    pts = data["efficiency"]["points"]
    assert [p["n_criteria"] for p in pts][0] == 1 and pts[-1]["n_criteria"] == len(keys)
    assert sorted(data["efficiency"]["order"]) == sorted(keys)
    assert pts[-1]["correlations"]["average"]["spearman"] == pytest.approx(final["average"]["spearman"])

    # SHAP in the report: additive against the unclipped pipeline output of those samples
    pos = {s: i for i, s in enumerate(test.sample_ids)}
    for a in aspects:
        s = data["shap"]["per_aspect"][a]
        rows = [pos[i] for i in s["sample_ids"]]
        pipe, col = ev.aggregator.model_for(a)
        out = np.asarray(pipe.predict(test.X[rows]))
        out = out if col is None else out[:, col]
        np.testing.assert_allclose(s["predictions"], out, atol=1e-9)
        np.testing.assert_allclose(np.array(s["base_values"]) + np.array(s["values"]).sum(1), out, atol=1e-6)
        assert s["mean_abs"][keys[0]] == pytest.approx(np.abs(np.array(s["values"])[:, 0]).mean())


def _screenshot_is_not_blank(page: Path, tmp_path: Path) -> None:
    from PIL import Image

    shot = tmp_path / "shot.png"
    cmd = [
        shutil.which("chromium") or "/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
        "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
        "--window-size=1200,2000", page.resolve().as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), f"chromium wrote no screenshot (rc {proc.returncode}): {proc.stderr[-2000:]}"
    with Image.open(shot) as im:
        im = im.convert("RGB")
        assert im.size == (1200, 2000)
        extrema = im.getextrema()
        assert any(lo != hi for lo, hi in extrema), "the screenshot is one flat colour"
        # more than a background: a real page has many distinct colours (text, plots)
        assert len(im.getcolors(maxcolors=1 << 20) or []) > 50


def test_report_renders_in_headless_chromium(rf_report: Path, tmp_path: Path) -> None:
    if not (shutil.which("chromium") or Path("/usr/bin/chromium").exists()):
        pytest.skip("chromium not installed: apt-get install -y chromium to render the report")
    _screenshot_is_not_blank(rf_report / "report.html", tmp_path)


def test_report_default_dir_is_inside_the_artifact(artifact: Callable[[str], Path]) -> None:
    from hdeval.methods.hdeval.evaluator import Evaluator

    path = artifact("lr-2g")
    res = _cli("report", str(path), "--max-samples", "10", "--background", "20", "--curve-points", "3", "-q")
    assert res.exit_code == 0, res.output
    assert (path / "report" / "report.html").is_file() and (path / "report" / "report.json").is_file()
    Evaluator.load(path)  # a report inside the artifact does not break loading it
    data = json.loads((path / "report" / "report.json").read_text(encoding="utf-8"))
    assert data["shap"]["explainer"] == "linear" and data["shap"]["n_background"] == 20
    assert set(data["shap"]["per_aspect"]) == {"informativeness", "naturalness", "quality"}


# --------------------------------------------------------------------------- SHAP
@pytest.mark.parametrize("kind", [*KINDS, "lr-2g"])
def test_shap_additivity(kind: str, artifact: Callable[[str], Path]) -> None:
    """base value + sum(SHAP) == the unclipped pipeline prediction, per sample and aspect;
    explain_samples reports the same numbers (top + the rest)."""
    from hdeval.core.types import ScoreMatrix
    from hdeval.methods.base import ScoreResult
    from hdeval.methods.hdeval.explain import explain_samples, shap_explain

    ev, test = _rows(artifact(kind), "test")
    _, train = _rows(artifact(kind), "train")
    X, ids = test.X[:6].copy(), test.sample_ids[:6]
    X[0, :2] = np.nan  # failed LLM scores: imputed by the pipeline, reported as None
    res = shap_explain(ev.aggregator, ev.feature_keys, X, ids, train.X[:30])
    groups = {len(g) for g in ev.aggregator.groups}
    assert groups == ({1, 2} if kind == "lr-2g" else {3})
    for a, r in res.items():
        pipe, col = ev.aggregator.model_for(a)
        out = np.asarray(pipe.predict(X))
        out = out if col is None else out[:, col]
        np.testing.assert_allclose(r.predictions, out, atol=1e-9)
        np.testing.assert_allclose(r.base_values + r.values.sum(axis=1), out, atol=1e-6)

    result = ScoreResult(ids, list(ev.aggregator.aspects), ev.aggregator.predict(X),
                         ScoreMatrix(ids, list(ev.feature_keys), X))
    expl = explain_samples(ev, result, top=3)
    assert len(expl) == len(ids)
    for i, row in enumerate(expl):
        assert list(row) == list(ev.aggregator.aspects)
        for j, (a, e) in enumerate(row.items()):
            assert len(e["top"]) == 3
            assert e["clipped_prediction"] == pytest.approx(result.predictions[i, j])
            total = e["base_value"] + sum(t["shap"] for t in e["top"]) + e["other_shap"]
            assert total == pytest.approx(e["prediction"], abs=1e-6)
            shaps = [abs(t["shap"]) for t in e["top"]]
            assert shaps == sorted(shaps, reverse=True)
            for t in e["top"]:
                x = X[i, ev.feature_keys.index(t["criterion"])]
                assert t["score"] == (None if np.isnan(x) else pytest.approx(x))
                assert t["name"] == ev.tree[t["criterion"]].name


def test_linear_explainer_equals_model_agnostic(artifact: Callable[[str], Path]) -> None:
    """For lr the exact linear explainer gives what the permutation explainer estimates
    (exactly, for an additive model) on the same background."""
    from hdeval.methods.hdeval.explain import shap_explain

    ev, test = _rows(artifact("lr"), "test")
    _, train = _rows(artifact("lr"), "train")
    args = (ev.aggregator, ev.feature_keys, test.X[:3], test.sample_ids[:3], train.X[:20])
    lin, perm = shap_explain(*args), shap_explain(*args, method="permutation")
    for a in lin:
        assert lin[a].explainer == "linear" and perm[a].explainer == "permutation"
        np.testing.assert_allclose(lin[a].values, perm[a].values, atol=1e-8)
        np.testing.assert_allclose(lin[a].base_values, perm[a].base_values, atol=1e-8)



def test_shap_leaves_the_callers_numpy_generator_alone(artifact: Callable[[str], Path]) -> None:
    # shap's permutation explainer (the nn aggregator's) seeds NumPy's global generator and
    # shuffles with it: a Python caller's own random stream must not change under it
    from hdeval.methods.hdeval.explain import shap_explain

    ev, test = _rows(artifact("lr"), "test")
    _, train = _rows(artifact("lr"), "train")
    np.random.seed(1234)
    np.random.random(3)
    expected = np.random.random(5)
    np.random.seed(1234)
    np.random.random(3)
    shap_explain(ev.aggregator, ev.feature_keys, test.X[:3], test.sample_ids[:3], train.X[:20], method="permutation")
    assert np.random.random(5).tolist() == expected.tolist()

# --------------------------------------------------------------------------- CLI explain/apply
def test_explain_prints_one_sample(artifact: Callable[[str], Path], cache_dir: str) -> None:
    ev, test = _rows(artifact("dt"), "test")
    sid = test.sample_ids[0]
    res = _cli("explain", str(artifact("dt")), "--sample", sid, "--data", str(SFRES), "--llm", "fake",
               "--cache-dir", cache_dir, "--top", "2", "-q")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert f"sample {sid}" in out
    for a in ev.aggregator.aspects:
        assert re.search(rf"^{a}: predicted \d", out, re.M)
    assert out.count("base value (average prediction)") == 3
    # the sum line checks out: base + SHAP = prediction, printed per aspect
    for base, shap, pred in re.findall(r"= base (-?[\d.]+) \+ SHAP ([+-][\d.]+) = (-?[\d.]+)", out):
        assert float(base) + float(shap) == pytest.approx(float(pred), abs=2e-3)
    assert len(re.findall(r"= base ", out)) == 3


def test_apply_explain_adds_explanations(artifact: Callable[[str], Path], cache_dir: str, tmp_path: Path) -> None:
    ev, test = _rows(artifact("rf"), "test")
    keep = set(test.sample_ids[:3])
    lines = [ln for ln in SFRES.read_text(encoding="utf-8").splitlines() if json.loads(ln)["id"] in keep]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    res = _cli("apply", str(artifact("rf")), str(inp), "-o", str(out), "--explain", "--top", "2",
               "--llm", "fake", "--cache-dir", cache_dir, "-q")
    assert res.exit_code == 0, res.output
    rows = [json.loads(ln) for ln in out.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 3
    for row in rows:
        for a, e in row["explanation"].items():
            assert e["clipped_prediction"] == pytest.approx(row["scores"][a], abs=1e-5)
            assert len(e["top"]) == 2 and {"criterion", "name", "shap", "score"} <= set(e["top"][0])


# --------------------------------------------------------------------------- bad input
def _one_line_error(res, *needles: str) -> None:
    assert res.exit_code != 0
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "Traceback" not in res.output
    for n in needles:
        assert n in err, err


def _tampered(src: Path, dst: Path, how: str) -> Path:
    shutil.copytree(src, dst)
    if how == "metrics":
        m = json.loads((dst / "metrics.json").read_text(encoding="utf-8"))
        m["final"]["average"]["spearman"] = 0.99
        (dst / "metrics.json").write_text(json.dumps(m), encoding="utf-8")
    elif how == "truncate-model":
        raw = (dst / "aggregator.skops").read_bytes()
        (dst / "aggregator.skops").write_bytes(raw[: len(raw) // 2])
    elif how == "no-scores":
        (dst / "scores.csv").unlink()
    elif how == "no-manifest":
        (dst / "manifest.json").unlink()
    return dst


@pytest.mark.parametrize("how,needle", [
    ("metrics", "metrics.json"),
    ("truncate-model", "aggregator.skops"),
    ("no-scores", "scores.csv"),
    ("no-manifest", "manifest.json"),
])
def test_report_refuses_damaged_artifacts(how: str, needle: str, artifact: Callable[[str], Path],
                                          tmp_path: Path) -> None:
    bad = _tampered(artifact("dt"), tmp_path / "bad", how)
    _one_line_error(_cli("report", str(bad), "-o", str(tmp_path / "r"), "-q"), needle)
    assert not (tmp_path / "r" / "report.html").exists()
    _one_line_error(_cli("explain", str(bad), "--sample", "x", "--data", str(SFRES), "--llm", "fake"), needle)


def test_report_refuses_a_directory_that_is_not_an_artifact(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    _one_line_error(_cli("report", str(tmp_path)), "not an hdeval artifact")
    _one_line_error(_cli("report", str(tmp_path / "missing")), "not an artifact directory")


def test_explain_unknown_sample(artifact: Callable[[str], Path], cache_dir: str) -> None:
    res = _cli("explain", str(artifact("dt")), "--sample", "no-such-id", "--data", str(SFRES),
               "--llm", "fake", "--cache-dir", cache_dir)
    _one_line_error(res, "'no-such-id'", str(SFRES))

