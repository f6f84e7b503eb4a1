"""`hdeval view`: the artifacts under a folder with their verdict banners and headline figures,
each one's report, two side by side; through the labelling app's server code (Starlette's
TestClient here; tests/test_view_app_browser.py drives it in chromium)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import TOY_TASK, one_line_error, run_cli, toy_rows, train_artifact, write_jsonl
from markupsafe import escape


def client(root: Path, token: str | None = None, host: str = "127.0.0.1", port: int = 8766):
    from starlette.testclient import TestClient

    from hdeval.app.view import Catalogue, ReportPages, build_view_app

    pages = ReportPages()
    app = build_view_app(Catalogue(root), pages, host=host, port=port, token=token)
    c = TestClient(app, base_url=f"http://{host}:{port}")
    c.pages = pages  # type: ignore[attr-defined]
    return c


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- without an artifact to train
def test_a_missing_folder_is_one_line_before_anything_is_served(tmp_path):
    one_line_error(run_cli("view", tmp_path / "nowhere", "--port", "0"), "nowhere", "not a folder")


def test_a_broken_artifact_is_listed_with_why_and_its_text_escaped(tmp_path):
    bad = tmp_path / "runs" / "<script>alert(1)</script>"
    bad.mkdir(parents=True)
    (bad / "manifest.json").write_text(
        json.dumps({"format": "hdeval-artifact", "format_version": 4, "method": "<b>nope</b>"}), encoding="utf-8"
    )
    (tmp_path / "runs" / "not-an-artifact").mkdir()
    page = client(tmp_path).get("/")
    assert page.status_code == 200
    body = page.text
    assert "1 artifact under this folder" in body
    assert "<script>alert(1)</script>" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "cannot be read:" in body and "not-an-artifact" not in body
    assert "script-src 'self'" in page.headers["content-security-policy"]


def test_a_listing_cut_at_its_limit_says_how_many_there_are(tmp_path):
    from hdeval.app.view import MAX_ARTIFACTS

    manifest = json.dumps({"format": "hdeval-artifact", "format_version": 4})
    for i in range(MAX_ARTIFACTS + 2):
        (tmp_path / "runs" / f"a{i:04d}").mkdir(parents=True)
        (tmp_path / "runs" / f"a{i:04d}" / "manifest.json").write_text(manifest, encoding="utf-8")
    body = client(tmp_path).get("/").text
    assert f"showing {MAX_ARTIFACTS} of {MAX_ARTIFACTS + 2} artifacts under this folder" in body
    assert body.count('<section class="artifact') == MAX_ARTIFACTS
    for i in range(2):  # two fewer: all listed, and nothing said of a limit
        shutil.rmtree(tmp_path / "runs" / f"a{i:04d}")
    body = client(tmp_path).get("/").text
    assert f"{MAX_ARTIFACTS} artifacts under this folder" in body and "showing" not in body


def test_an_empty_folder_says_so(tmp_path):
    assert "No hdeval artifact under" in client(tmp_path).get("/").text


def test_a_page_names_artifacts_only_by_their_place_in_the_listing(tmp_path):
    (tmp_path / "inner").mkdir()
    c = client(tmp_path / "inner")
    for name in ("../", "..", "/etc", str(tmp_path), "nope"):
        r = c.get("/report", params={"a": name})
        assert r.status_code == 404 and "no such artifact in this folder" in r.text


def test_the_same_guard_as_the_labelling_app(tmp_path):
    c = client(tmp_path)
    assert c.get("/", headers={"Host": "evil.example:8766"}).status_code == 403  # DNS rebinding
    t = client(tmp_path, token="s3cret", host="0.0.0.0")
    assert t.get("/").status_code == 403
    t.cookies.set("hdeval_token", "s3cret")
    assert t.get("/").status_code == 200


# ---------------------------------------------------------------- over trained artifacts
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Two artifacts of the toy task (HD-Eval and direct) under runs/, trained with the fake LLM."""
    tmp = tmp_path_factory.mktemp("view")
    task = tmp / "toy.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = write_jsonl(tmp / "toy.jsonl", toy_rows())
    runs = tmp / "runs"
    runs.mkdir()
    for name, args in (("hd", ()), ("direct", ("--method", "direct"))):
        art = train_artifact(str(task), data, tmp / name, *args)
        shutil.move(str(art), str(runs / f"toy-{name}"))
    return runs


@pytest.mark.slow
def test_the_listing_shows_each_banner_and_headline_figure(trained):
    from hdeval.methods.registry import load_artifact

    body = client(trained).get("/").text
    assert "2 artifacts under this folder" in body
    for name in ("toy-hd", "toy-direct"):
        ev = load_artifact(trained / name)
        b = ev.banner()
        assert str(escape(b.headline)) in body
        for line in b.lines:
            assert str(escape(line.text)) in body
        spearman = ev.metrics["final"]["average"]["spearman"]
        assert f"<td>{spearman:.2f}</td>" in body
    assert body.count('class="open-report"') == 1  # direct writes no report


@pytest.mark.slow
def test_a_report_is_the_artifacts_own_drawn_aside_with_no_script(trained):
    before = tree(trained)
    c = client(trained)
    r = c.get("/report", params={"a": "toy-hd"})
    assert r.status_code == 200
    assert "script-src" not in r.headers["content-security-policy"]  # default-src 'none': no script
    assert "default-src 'none'" in r.headers["content-security-policy"]
    from hdeval.methods.registry import load_artifact

    banner = load_artifact(trained / "toy-hd").banner()
    assert str(escape(banner.headline)) in r.text  # the banner view listed is the report's
    assert "permutation importance" in r.text.lower()
    assert tree(trained) == before  # nothing written into the artifacts
    assert list(c.pages.dir.rglob("report.html"))
    c.pages.close()
    no = c.get("/report", params={"a": "toy-direct"})
    assert "writes no report" in no.text


@pytest.mark.slow
def test_two_artifacts_side_by_side(trained):
    from hdeval.methods.registry import load_artifact

    c = client(trained)
    body = c.get("/compare", params={"a": "toy-hd", "b": "toy-direct"}).text
    assert 'id="compare-table"' in body and 'id="side-a"' in body and 'id="side-b"' in body
    a, b = (load_artifact(trained / n).headline() for n in ("toy-hd", "toy-direct"))
    key = "held-out spearman (average)"
    assert f"<th>{key}</th><td>{a[key]:.2f}</td><td>{b[key]:.2f}</td><td>{b[key] - a[key]:.2f}</td>" in body
    assert "different tasks" not in body
    assert "Choose a second artifact" in c.get("/compare", params={"a": "toy-hd"}).text
