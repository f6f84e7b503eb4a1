"""The labelling app in a real browser: Selenium driving Debian's chromium through
/usr/bin/chromedriver, against `hdeval label` run as a subprocess (as a user runs it) with the
fake LLM. Skipped with a reason when chromium or chromedriver is absent."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from browser import wait
from conftest import REPO, TOY_TASK, run_cli, toy_rows, write_jsonl

pytestmark = pytest.mark.slow

# one reply cache for the module: the pool's criterion scores are paid once (fake calls, but many)
CACHE: Path | None = None
HOSTILE = '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'


@pytest.fixture(scope="module", autouse=True)
def _shared_cache(tmp_path_factory):
    global CACHE
    CACHE = tmp_path_factory.mktemp("label-cache")


@pytest.fixture
def pool(tmp_path):
    task = tmp_path / "toy.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    rows = toy_rows(12, 3)
    for r in rows:
        r.pop("scores")
        r["source"] = HOSTILE + " " + r["source"]  # every sample carries it: whichever is shown
    return task, write_jsonl(tmp_path / "pool.jsonl", rows)


def start_label(servers, tmp_path: Path, task: Path, data: Path, *args: str, cache: Path | None = None):
    """`hdeval label` on the fake LLM, its labels in tmp_path/labels.db."""
    return servers(tmp_path, ["label", "--task", str(task), "--data", str(data), "--labels",
                              str(tmp_path / "labels.db"), "--llm", "fake", "--cache-dir", str(cache or CACHE),
                              "--port", "0", *args])


def state(server, token: str | None = None) -> dict:
    """The labelling app's /api/state."""
    return server.get_json("/api/state", token)


def shown(d) -> str | None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return d.find_element("id", "sample").get_attribute("data-sample-id")
    except (NoSuchElementException, StaleElementReferenceException):
        return None


def keys(d, text: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(d).send_keys(text).perform()


def start_as(d, url: str, name: str) -> str:
    d.get(url)
    box = wait(lambda: d.find_elements("id", "rater-name"), what="the name form")[0]
    box.send_keys(name + "\n")
    try:
        return wait(lambda: shown(d), what="the first sample")
    except AssertionError:
        raise AssertionError(f"no sample shown at {d.current_url}: {d.page_source[:3000]}") from None


def label_by_keys(d, digits: str) -> str:
    """Score the shown sample with one digit per aspect (the last one saves); the next sample's id."""
    before = shown(d)
    keys(d, digits)
    return wait(lambda: (lambda s: s if s and s != before else None)(shown(d)), what="the next sample")


def test_label_ten_by_keyboard_undo_reload_and_inert_script(pool, tmp_path, servers, browsers):
    server = start_label(servers, tmp_path, *pool)
    d = browsers()
    ids = [start_as(d, server.url, "ann")]
    # a sample's text holding <script> and an onerror handler is shown as text, never run
    assert d.execute_script("return window.__pwned === undefined")
    assert HOSTILE in wait(lambda: d.find_element("css selector", '[data-field="source"]').text)
    for i in range(10):
        if i == 3:  # a note, typed after `n`; Escape leaves the field so the keys score again
            keys(d, "n")
            d.switch_to.active_element.send_keys("unclear question")
            from selenium.webdriver.common.keys import Keys

            d.switch_to.active_element.send_keys(Keys.ESCAPE)
        ids.append(label_by_keys(d, f"{1 + i % 5}{5 - i % 5}"))
    assert len(set(ids)) == 11
    assert state(server)["labelled"] == 10
    keys(d, "u")  # undo: the last labelled sample comes back
    wait(lambda: shown(d) == ids[9], what="the undone sample")
    assert state(server)["labelled"] == 9
    d.refresh()  # a reload shows the same sample, and loses nothing
    assert wait(lambda: shown(d)) == ids[9]
    assert state(server)["labelled"] == 9
    assert d.execute_script("return window.__pwned === undefined")
    out = tmp_path / "raw.jsonl"
    assert run_cli("data", "export-labels", tmp_path / "labels.db", "-o", out, "--raw").exit_code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["note"] for r in rows if r["sample_id"] == ids[3]] == ["unclear question"] * 2
    assert sum(r["action"] == "undo" for r in rows) == 2


def test_two_raters_in_two_browsers(pool, tmp_path, servers, browsers):
    server = start_label(servers, tmp_path, *pool, "--double-share", "1")
    ann, bob = browsers(), browsers()
    a = start_as(ann, server.url, "ann")
    b = start_as(bob, server.url, "bob")
    assert a != b  # never the same sample to two people at once
    label_by_keys(ann, "34")
    label_by_keys(bob, "21")
    # every sample goes to two raters here: bob, who labelled after ann, is asked for ann's
    bob.refresh()
    assert wait(lambda: shown(bob)) == a
    now = wait(lambda: (lambda s: s if s["labelled"] == 2 else None)(state(server)), what="two labels")
    assert now["raters"] == ["ann", "bob"]
    assert "second opinion" in wait(lambda: bob.find_element("id", "reason").text)


def test_kill_9_loses_no_acknowledged_label(pool, tmp_path, servers, browsers):
    server = start_label(servers, tmp_path, *pool)
    d = browsers()
    start_as(d, server.url, "ann")
    done = [shown(d)]
    for digits in ("12", "33", "45"):
        done.append(label_by_keys(d, digits))  # the next sample is shown: the label was acknowledged
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    again = start_label(servers, tmp_path, *pool)
    assert state(again)["labelled"] == 3
    out = tmp_path / "labeled.jsonl"
    assert run_cli("data", "export-labels", tmp_path / "labels.db", "-o", out).exit_code == 0
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == done[:3]


def test_a_non_loopback_bind_refuses_requests_without_the_token(pool, tmp_path, servers, browsers):
    # 127.0.0.2 is loopback (nothing leaves the machine) but not one of the names served without
    # a token: the token check runs as on a public address
    server = start_label(servers, tmp_path, *pool, "--host", "127.0.0.2")
    assert "?token=" in server.url
    for path in ("/", "/api/state", "/static/app.js"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.base + path, timeout=10)
        assert refused.value.code == 403
    d = browsers()
    start_as(d, server.url, "ann")  # the printed URL works, and its token becomes a cookie
    assert "token" not in d.current_url
    assert state(server, server.url.split("token=")[1])["raters"] == []


def test_export_then_train_gives_the_figure_the_panel_showed(pool, tmp_path, servers, browsers):
    from hdeval.learn.selection import assess

    server = start_label(servers, tmp_path, *pool, "--refit-every", "12")  # re-fits at 2 labels (too few), then 14
    d = browsers()
    start_as(d, server.url, "ann")
    rng = np.random.default_rng(3)
    for _ in range(14):
        label_by_keys(d, "".join(str(v) for v in rng.integers(1, 6, 2)))
    now = wait(lambda: (lambda s: s if s["agreement"] and s["agreement"]["n_labels"] == 14 else None)(
        state(server)), timeout=120, what="the re-fit on 14 labels")
    d.refresh()
    shown_figure = float(wait(lambda: d.find_element("id", "agreement").get_attribute("data-value")))
    assert shown_figure == pytest.approx(now["agreement"]["value"])
    out = tmp_path / "labeled.jsonl"
    assert run_cli("data", "export-labels", tmp_path / "labels.db", "-o", out).exit_code == 0
    art = tmp_path / "art"
    r = run_cli("train", "--task", pool[0], "--data", out, "--llm", "fake", "--cache-dir", CACHE,
                "--layers", "2", "--aggregator", "lr", "--test-frac", "0.3", "--train-frac", "0.7", "-o", art, "-q")
    assert r.exit_code == 0, r.output
    assert "LLM calls made: 0" in r.stderr  # the app's criteria and scores: the same cache entries
    import pandas as pd

    table = pd.read_csv(art / "scores.csv")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    table = table.set_index("sample_id").loc[[row["id"] for row in rows]]
    criteria = [c for c in table.columns if c != "split" and not c.startswith("human:")]
    X = table[criteria].to_numpy(float)
    y = np.array([[row["scores"][a] for a in ("clarity", "accuracy")] for row in rows])
    from hdeval.data.tasks import load_task
    from hdeval.learn.selection import task_template

    # the aggregator train makes for these criteria, chosen by train's own chooser
    again = assess(X, y, [row["doc_id"] for row in rows], template=task_template(load_task(pool[0]), criteria))
    assert again.agreement == pytest.approx(shown_figure)
    assert d.find_element("id", "aggregator").text == again.aggregator


def test_the_docs_screenshots_come_from_the_real_page(tmp_path, servers, browsers):
    """docs/labelling.md's screenshots: made here from the running app. With
    HDEVAL_UPDATE_SCREENSHOTS=1 they replace the ones in docs/images/."""
    task = tmp_path / "toy.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    rows = toy_rows(12, 3)
    for r in rows:
        r.pop("scores")
    server = start_label(servers, tmp_path, task, write_jsonl(tmp_path / "pool.jsonl", rows), "--refit-every", "4")
    d = browsers()
    start_as(d, server.url, "ann")
    rng = np.random.default_rng(5)
    for n in (10, 14):  # re-fits at 2, 6 (too few for a figure), 10 and 14: two points on the curve
        while state(server)["labelled"] < n:
            label_by_keys(d, "".join(str(v) for v in rng.integers(1, 6, 2)))
        wait(lambda: (lambda s: s["agreement"] and s["agreement"]["n_labels"] == n)(state(server)),
             timeout=120, what=f"the re-fit on {n} labels")
    d.refresh()
    wait(lambda: d.find_element("id", "curve"))
    keys(d, "4")  # the first aspect scored: the page as a person sees it mid-sample
    shot = tmp_path / "labelling.png"
    d.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("HDEVAL_UPDATE_SCREENSHOTS") == "1":
        (REPO / "docs" / "images").mkdir(exist_ok=True)
        shutil.copy(shot, REPO / "docs" / "images" / "labelling.png")


def test_the_docs_commands_as_written(tmp_path):
    """README's and docs/labelling.md's commands (```sh blocks: tests/test_readme.py does not run a server
    that runs until stopped), verbatim, in a fresh folder beside examples/:
    label (a few labels over HTTP, as the page sends them), stop, export, train."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    docs = (REPO / "docs" / "labelling.md").read_text(encoding="utf-8")
    label = "hdeval label --task examples/qa_task.toml --data examples/qa.jsonl --labels artifacts/labels.db --llm fake"
    export = "hdeval data export-labels artifacts/labels.db -o artifacts/labeled.jsonl"
    train = "hdeval train --task examples/qa_task.toml --data artifacts/labeled.jsonl --layers 2 --llm fake"
    assert label in readme and label in docs and export in docs and train in docs
    shutil.copytree(REPO / "examples", tmp_path / "examples")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    hdeval = [sys.executable, "-m", "hdeval.cli"]
    proc = subprocess.Popen(hdeval + label.split()[1:], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        url = proc.stdout.readline().decode().strip()
        assert url == "http://127.0.0.1:8765/", proc.stderr.read1().decode() if proc.poll() is not None else url
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())

        def post(path, body):
            req = urllib.request.Request(url + path.lstrip("/"), json.dumps(body).encode(),
                                         {"Content-Type": "application/json", "X-Hdeval": "1"})
            return json.loads(opener.open(req, timeout=10).read())

        wait(lambda: opener.open(url, timeout=10).status == 200, what="the server")
        post("/api/rater", {"name": "ann"})
        for k in range(12):
            page = wait(lambda: (lambda t: t if "data-sample-id" in t else None)(
                opener.open(url, timeout=10).read().decode()), what="a sample")
            sid = page.split('data-sample-id="')[1].split('"')[0]
            assert post("/api/label", {"sample_id": sid, "values": {"clarity": 1 + k % 5, "accuracy": 5 - k % 4}})["ok"]
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C, as a person stops it
        proc.wait(timeout=30)
        err = proc.stderr.read().decode()
        proc.stdout.close()
        proc.stderr.close()
    # the dry run's count before scoring (a fresh cache: nothing cached), and what was kept at the stop
    assert re.search(r"on 10 criteria .*: 240 LLM calls, 0 of them cached, ~[0-9.]+ M prompt tokens", err), err
    assert "every label the page acknowledged is in the labels file" in err
    for command in (export, train):
        r = subprocess.run(hdeval + command.split()[1:], cwd=tmp_path, env=env, capture_output=True, timeout=300)
        assert r.returncode == 0, r.stderr.decode()
    assert len((tmp_path / "artifacts" / "labeled.jsonl").read_text().splitlines()) == 12
    assert (tmp_path / "artifacts").is_dir()
