"""The labelling app without a browser: labels.db, export, the loop's state, the security checks
(Starlette's TestClient), and the command's refusals before the server starts."""

from __future__ import annotations

import json
import re
import sqlite3

import numpy as np
import pytest
from conftest import TOY_TASK, one_error, run_cli, toy_rows, write_jsonl

from hdeval.app.labels import LabelStore, export_labels
from hdeval.app.server import build_app
from hdeval.app.session import LabelSession
from hdeval.core.errors import ConfigError, DataError
from hdeval.data.samples import read_samples
from hdeval.data.tasks import load_task

H = {"X-Hdeval": "1"}


@pytest.fixture
def pool(tmp_path):
    task_file = tmp_path / "toy.toml"
    task_file.write_text(TOY_TASK, encoding="utf-8")
    rows = toy_rows(12, 3)
    for r in rows:
        r.pop("scores")
    rows[0]["output"] = 'a <script>alert("x")</script> & <b>bold</b>'
    data = write_jsonl(tmp_path / "pool.jsonl", rows)
    task = load_task(task_file)
    return task, task_file, data, read_samples(data, task, require_scores=False)


def session_of(task, samples, db, **kw) -> LabelSession:
    """A session whose pool is already scored (random criterion scores: no LLM)."""
    s = LabelSession(task, samples, LabelStore(db, task), **kw)
    s.set_criteria(["c1", "c2", "c3"])
    s.add_scores(np.arange(len(samples)), np.random.default_rng(0).uniform(1, 5, (len(samples), 3)))
    return s


def client(session, host="127.0.0.1", port=8765, token=None):
    from starlette.testclient import TestClient

    shown = f"[{host}]" if ":" in host else host
    return TestClient(build_app(session, host=host, port=port, token=token), base_url=f"http://{shown}:{port}")


def named(c, name="ann"):
    assert c.post("/api/rater", json={"name": name}, headers=H).status_code == 200
    return c


def shown_id(c) -> str:
    return re.search(r'data-sample-id="([^"]+)"', c.get("/").text).group(1)


# labels.db
def test_latest_row_wins_undo_is_a_row_and_rows_are_never_changed(pool, tmp_path):
    task, _, _, samples = pool
    with LabelStore(tmp_path / "labels.db", task) as store:
        store.add(samples[1], {"clarity": 2, "accuracy": 3}, rater="ann", session="s")
        store.add(samples[1], {"clarity": 4, "accuracy": 5}, rater="ann", session="s")  # an edit
        store.add(samples[2], {"clarity": 1, "accuracy": 1}, rater="ann", session="s", note="hm")
        assert store.undo(rater="ann", session="s") == samples[2].id
        cur = store.current()
        assert {k: r.value for k, r in cur.items()} == {(samples[1].id, "clarity", "ann"): 4.0,
                                                        (samples[1].id, "accuracy", "ann"): 5.0}
        assert [r["action"] for r in store.rows()] == ["label"] * 6 + ["undo"] * 2
        for sql in ("UPDATE labels SET value = 1", "DELETE FROM labels"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                store._con.execute(sql)
        assert store._con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        with pytest.raises(DataError, match="outside the task's range"):
            store.add(samples[3], {"clarity": 9, "accuracy": 1}, rater="ann", session="s")


def test_a_labels_file_of_another_task_is_refused(pool, tmp_path):
    task = pool[0]
    LabelStore(tmp_path / "labels.db", task).close()
    other = load_task("summeval")
    with pytest.raises(DataError, match="holds labels for task 'toy_qa', not 'summeval'"):
        LabelStore(tmp_path / "labels.db", other)
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    with pytest.raises(DataError, match="not a labels file"):
        LabelStore(tmp_path / "junk.db", task)


def test_a_labels_file_in_a_new_folder_is_made_there(pool, tmp_path):
    """`--labels artifacts/labels.db` in a folder without artifacts/ (the README's command); a
    folder that cannot be made is one line naming the option."""
    LabelStore(tmp_path / "artifacts" / "labels.db", pool[0]).close()
    assert (tmp_path / "artifacts" / "labels.db").is_file()
    (tmp_path / "blocker").write_text("a file, not a folder")
    with pytest.raises(DataError, match=r"^--labels .*blocker/labels.db: cannot make its folder"):
        LabelStore(tmp_path / "blocker" / "labels.db", pool[0])


def test_export_writes_samples_train_reads_with_the_raters_mean(pool, tmp_path):
    task, _, _, samples = pool
    db = tmp_path / "labels.db"
    with LabelStore(db, task) as store:
        store.add(samples[0], {"clarity": 2, "accuracy": 4}, rater="ann", session="s")
        store.add(samples[0], {"clarity": 5, "accuracy": 4}, rater="bob", session="t")
        store.add(samples[4], {"clarity": 3, "accuracy": 1}, rater="bob", session="t")
    out = tmp_path / "labeled.jsonl"
    assert export_labels(db, out) == 2
    back = read_samples(out, task, require_scores=True)
    assert [(s.id, dict(s.scores)) for s in back] == [
        (samples[0].id, {"clarity": 3.5, "accuracy": 4.0}), (samples[4].id, {"clarity": 3.0, "accuracy": 1.0})]
    assert back[0].fields == samples[0].fields and back[0].doc_id == samples[0].doc_id
    with pytest.raises(ConfigError, match="exists; pass --force"):
        export_labels(db, out)
    assert export_labels(db, out, force=True, raw=True) == 6
    assert {json.loads(line)["rater"] for line in out.read_text().splitlines()} == {"ann", "bob"}


def test_export_refuses_a_file_that_is_not_jsonl_and_a_store_with_no_labels(pool, tmp_path):
    # an empty file (exit 0) only failed later in train; '-o x.csv' wrote JSONL that train then
    # read as broken CSV; '-o -' wrote a file named '-'
    task, _, _, samples = pool
    db = tmp_path / "labels.db"
    LabelStore(db, task).close()
    with pytest.raises(DataError, match=r"labels.db holds no labels yet: nothing written"):
        export_labels(db, tmp_path / "e.jsonl")
    assert not (tmp_path / "e.jsonl").exists()
    with LabelStore(db, task) as store:
        store.add(samples[0], {"clarity": 2, "accuracy": 4}, rater="ann", session="s")
    for name in ("e.csv", "-"):
        with pytest.raises(ConfigError, match=r"writes (JSONL|a file)"):
            export_labels(db, tmp_path / name if name != "-" else name)
        assert not (tmp_path / name).exists()


def test_export_labels_command(pool, tmp_path):
    task, _, _, samples = pool
    with LabelStore(tmp_path / "labels.db", task) as store:
        store.add(samples[0], {"clarity": 2, "accuracy": 4}, rater="ann", session="s")
    out = tmp_path / "labeled.jsonl"
    r = run_cli("data", "export-labels", tmp_path / "labels.db", "-o", out)
    assert r.exit_code == 0, r.output
    assert len(out.read_text().splitlines()) == 1
    one_error(run_cli("data", "export-labels", tmp_path / "labels.db", "-o", out), "exists; pass --force")
    one_error(run_cli("data", "export-labels", tmp_path / "nope.db", "-o", tmp_path / "x.jsonl"),
              "no such labels file")


# the loop
def test_a_sample_whose_content_changed_is_flagged_and_asked_again(pool, tmp_path):
    task, _, _, samples = pool
    db = tmp_path / "labels.db"
    with LabelStore(db, task) as store:
        store.add(samples[5], {"clarity": 2, "accuracy": 4}, rater="ann", session="s")
    from dataclasses import replace

    edited = list(samples)
    edited[5] = replace(samples[5], fields={**samples[5].fields, "output": "another answer"})
    s = session_of(task, edited, db)
    assert s.changed == [samples[5].id]
    assert len(s.labelled()[0]) == 0  # the old label is not used for the new content
    assert session_of(task, samples, tmp_path / "labels.db").changed == []


def test_a_share_of_samples_goes_to_a_second_rater(pool, tmp_path):
    task, _, _, samples = pool
    s = session_of(task, samples, tmp_path / "labels.db", double_share=1.0)
    first = s.next_for("ann")
    s.label("ann", "s1", first.sample.id, {"clarity": 3, "accuracy": 3})
    second = s.next_for("bob")
    assert second.sample.id == first.sample.id and "second opinion" in second.reason
    none = session_of(task, samples, tmp_path / "other.db", double_share=0.0)
    a = none.next_for("ann")
    none.label("ann", "s1", a.sample.id, {"clarity": 3, "accuracy": 3})
    assert none.next_for("bob").sample.id != a.sample.id


def test_two_raters_are_never_shown_the_same_sample_at_once(pool, tmp_path):
    task, _, _, samples = pool
    s = session_of(task, samples, tmp_path / "labels.db")
    assert s.next_for("ann").sample.id != s.next_for("bob").sample.id
    assert s.next_for("ann").sample.id == s.next_for("ann").sample.id  # a reload shows the same one


def test_agreement_between_people_is_krippendorffs_alpha(pool, tmp_path):
    import krippendorff

    task, _, _, samples = pool
    s = session_of(task, samples, tmp_path / "labels.db")
    ann, bob = [1, 2, 3, 4, 5], [1, 2, 4, 4, 5]
    for i, (a, b) in enumerate(zip(ann, bob)):
        s.label("ann", "s1", samples[i].id, {"clarity": a, "accuracy": 3})
        s.label("bob", "s2", samples[i].id, {"clarity": b, "accuracy": 3})
    people = s.panel()["people"]
    assert people["shared"] == 5
    want = krippendorff.alpha(reliability_data=[ann, bob], level_of_measurement="interval")
    assert people["aspects"]["clarity"] == pytest.approx(want)
    assert people["aspects"]["accuracy"] is None  # no variation: alpha is undefined, not a number


# the web side
def test_security_headers_and_escaped_sample_text(pool, tmp_path):
    task, _, _, samples = pool
    s = session_of(task, samples, tmp_path / "labels.db")
    s._assigned["ann"] = type(s.next_for("x"))(0, samples[0], "picked", "test")  # the hostile sample
    c = named(client(s))
    r = c.get("/")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    assert "<script>alert" not in r.text and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in r.text
    assert "<b>bold" not in r.text
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", r.text)  # no inline script at all


def test_state_changes_need_the_same_origin(pool, tmp_path):
    task, _, _, samples = pool
    s = session_of(task, samples, tmp_path / "labels.db")
    c = named(client(s))
    sid = shown_id(c)
    body = {"sample_id": sid, "values": {"clarity": 3, "accuracy": 3}}
    assert c.post("/api/label", json=body).status_code == 403  # no X-Hdeval header: a plain form post
    assert c.post("/api/label", json=body, headers={**H, "Origin": "http://evil.example"}).status_code == 403
    assert c.post("/api/label", json=body, headers={**H, "Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert s.labelled()[0].size == 0
    ok = c.post("/api/label", json=body, headers={**H, "Origin": "http://127.0.0.1:8765"})
    assert ok.status_code == 200 and s.labelled()[0].size == 1
    # DNS rebinding: a page of another name that resolves to 127.0.0.1
    assert c.get("/", headers={"Host": "evil.example:8765"}).status_code == 403


def test_a_non_loopback_bind_needs_the_token_on_every_request(pool, tmp_path):
    task, _, _, samples = pool
    s = session_of(task, samples, tmp_path / "labels.db")
    c = client(s, host="127.0.0.2", token="sekrit-token")
    for path in ("/", "/panel", "/api/state", "/static/app.js"):
        assert c.get(path).status_code == 403, path
    assert c.post("/api/rater", json={"name": "ann"}, headers=H).status_code == 403
    assert c.get("/?token=wrong").status_code == 403
    r = c.get("/?token=sekrit-token", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/" and "sekrit-token" not in r.headers["location"]
    assert c.get("/api/state").status_code == 200  # the cookie the redirect set
    named(c)
    assert c.post("/api/label", json={"sample_id": shown_id(c), "values": {"clarity": 1, "accuracy": 2}},
                  headers=H).status_code == 200


def test_keys_label_undo_and_skip_through_the_api(pool, tmp_path):
    task, _, _, samples = pool
    s = session_of(task, samples, tmp_path / "labels.db")
    c = named(client(s))
    first = shown_id(c)
    assert c.post("/api/label", json={"sample_id": first, "values": {"clarity": 2}}, headers=H).json() == {
        "error": "rate every aspect: accuracy missing"}
    c.post("/api/label", json={"sample_id": first, "values": {"clarity": 2, "accuracy": 5}}, headers=H)
    second = shown_id(c)
    assert second != first
    assert c.post("/api/undo", json={}, headers=H).json()["undone"] == first
    assert shown_id(c) == first and s.labelled()[0].size == 0
    c.post("/api/skip", json={"sample_id": first}, headers=H)
    assert shown_id(c) != first


# the command
def test_label_refuses_bad_input_in_one_line_before_serving(pool, tmp_path):
    _, task_file, data, _ = pool
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "source": "q"}\n', encoding="utf-8")
    common = ["--llm", "fake", "--cache-dir", tmp_path / "cache", "--port", "0"]
    one_error(run_cli("label", "--task", task_file, "--data", bad, "--labels", tmp_path / "l.db", *common),
              "bad.jsonl", "line 1", "output")
    other_task = tmp_path / "other.toml"
    other_task.write_text(TOY_TASK.replace('key = "source"', 'key = "reference"'), encoding="utf-8")
    one_error(run_cli("label", "--task", other_task, "--data", data, "--labels", tmp_path / "l.db", *common),
              "pool.jsonl", "lines 1, 2, 3", "'reference'")  # every line lacks it, each is counted
    LabelStore(tmp_path / "other.db", load_task("summeval")).close()
    one_error(run_cli("label", "--task", task_file, "--data", data, "--labels", tmp_path / "other.db", *common),
              "holds labels for task 'summeval'")
    one_error(run_cli("label", "--task", "llmbar", "--data", data, "--labels", tmp_path / "l.db", *common),
              "pool.jsonl", "lines 1, 2, 3", "output_a")  # a pool of single responses for a task of pairs
    one_error(run_cli("label", "--task", task_file, "--data", data, "--labels", tmp_path / "l.db", *common,
                      "--double-share", "1.5"), "--double-share must be between 0 and 1")
    one_error(run_cli("label", "--task", task_file, "--data", data, "--labels", tmp_path / "l.db", *common,
                      "--strategy", "best"), "--strategy 'best'", "random")
    assert not (tmp_path / "l.db").exists()


def test_a_port_in_use_leaves_no_labels_file_behind(pool, tmp_path):
    """With the port taken, `hdeval label` exited 2 with a clear error but had made the labels
    file (and its folder) already."""
    import socket

    _, task_file, data, _ = pool
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        db = tmp_path / "new" / "l2.db"
        one_error(run_cli("label", "--task", task_file, "--data", data, "--labels", db, "--llm", "fake",
                          "--cache-dir", tmp_path / "cache", "--port", port),
                  f"--port {port} is in use")
    assert not db.exists() and not db.parent.exists()


@pytest.mark.slow
def test_an_artifacts_criteria_score_the_pool(pool, toy, tmp_path):
    from conftest import train_artifact

    from hdeval.app.launch import prepare
    from hdeval.llm.config import LLMConfig

    _, task_file, data, samples = pool
    from conftest import REPO

    # a --tree file's layers are kept whole: the kept evaluator reads layer 2 whatever its CV figure
    art = train_artifact(str(toy[0]), toy[1], tmp_path, "--tree", REPO / "examples" / "qa_tree.json",
                         "--aggregator", "lr")
    app = prepare(task=str(task_file), data=data, labels=tmp_path / "l.db", artifact=art, port=0,
                  llm=LLMConfig(model="fake", cache_dir=str(tmp_path / "cache")))
    try:
        app.start_scoring().join(timeout=120)
        state = app.session.scoring
        assert state.done and state.error is None
        assert state.criteria == list(app.artifact.feature_keys) and len(state.criteria) > 2  # layer 2 too
        assert np.isfinite(app.session.X).all() and app.session.X.shape == (len(samples), len(state.criteria))
    finally:
        app.close()
    other = tmp_path / "other.toml"
    other.write_text(TOY_TASK.replace('name = "toy_qa"', 'name = "toy_other"'), encoding="utf-8")
    one_error(run_cli("label", "--task", other, "--data", data, "--labels", tmp_path / "o.db", "--artifact", art,
                      "--llm", "fake", "--port", "0"), "judges task 'toy_qa'", "not 'toy_other'")


def test_export_says_which_strategy_picked_each_sample(pool, tmp_path):
    """labels.db records the strategy that showed a sample (e.g. 'diversity'), but the export dropped it: `hdeval estimate` then took actively picked
    labels for a random sample and gave an interval that does not hold."""
    task, _, _, samples = pool
    db = tmp_path / "labels.db"
    with LabelStore(db, task) as store:
        store.add(samples[0], {"clarity": 2, "accuracy": 4}, rater="ann", session="s", strategy="diversity")
        store.add(samples[0], {"clarity": 4, "accuracy": 4}, rater="bob", session="t", strategy="second rating")
        store.add(samples[4], {"clarity": 3, "accuracy": 1}, rater="bob", session="t", strategy="random")
        store.add(samples[5], {"clarity": 3, "accuracy": 1}, rater="bob", session="t")  # not shown by the picker
    out = tmp_path / "labeled.jsonl"
    assert export_labels(db, out) == 3
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows[samples[0].id]["selection"] == "diversity" and rows[samples[4].id]["selection"] == "random"
    assert "selection" not in rows[samples[5].id]
    assert len(read_samples(out, task, require_scores=True)) == 3


def test_a_default_session_picks_at_random_from_the_first_label(pool, tmp_path):
    """The default strategy is random, but the app's first 8 picks were a diverse cold start with
    no sampling probability: `hdeval estimate` then refused the labels of a default session.
    A model-based strategy still starts diverse."""
    task, _, _, samples = pool
    s = session_of(task, samples, tmp_path / "labels.db", double_share=0.0)
    for _ in range(10):
        shown = s.next_for("ann")
        assert shown.strategy == "random" and "at random" in shown.reason
        s.label("ann", "s1", shown.sample.id, {"clarity": 3, "accuracy": 4})
    out = tmp_path / "labeled.jsonl"
    assert export_labels(tmp_path / "labels.db", out) == 10
    assert {json.loads(line)["selection"] for line in out.read_text().splitlines()} == {"random"}
    for strategy in ("uncertainty", "diversity", "hybrid"):
        first = session_of(task, samples, tmp_path / f"{strategy}.db", strategy=strategy).next_for("ann")
        assert first.strategy == strategy and "unlike those already labelled" in first.reason


@pytest.mark.slow  # trains a jury artifact (4 s at a load average of 2)
def test_a_jury_artifact_is_refused_before_serving(pool, toy, tmp_path):
    """A jury's columns are judge:criterion: the app served, then its pool scoring died on a
    KeyError in the background; it is refused in one line, before labels.db exists."""
    _, task_file, data, _ = pool
    art = tmp_path / "jury"
    r = run_cli("train", "--task", toy[0], "--data", toy[1], "--layers", "1", "--llm", "fake",
                "--llm", "fake:logprobs=0", "--cache-dir", tmp_path / "cache", "-o", art, "-q")
    assert r.exit_code == 0, r.output
    one_error(run_cli("label", "--task", task_file, "--data", data, "--labels", tmp_path / "l.db",
                      "--artifact", art, "--llm", "fake", "--cache-dir", tmp_path / "cache", "--port", "0"),
              "--artifact", "jury")
    assert not (tmp_path / "l.db").exists()


def test_unusable_decompositions_leave_the_aspects_and_labelling_goes_on(pool, tmp_path):
    """A small model (--llm local's) answers the decomposition prompt with keys of dots: the pool's
    scoring stopped there, and no sample could ever be labelled. Now the aspects alone are scored,
    with a warning, as train keeps layer 1 when layer 2's decomposition fails."""
    from hdeval.app.launch import prepare
    from hdeval.llm.backends.base import Completion
    from hdeval.llm.backends.fake import RESPONDERS, FakeBackend
    from hdeval.llm.config import LLMConfig

    _, task_file, data, samples = pool
    dots = '{"subcriteria": [{"key": "...", "name": "...", "definition": "..."}]}'
    fake = FakeBackend(responders={**RESPONDERS, "decompose": lambda request, fake: Completion(dots)})
    said: list[str] = []
    app = prepare(task=str(task_file), data=data, labels=tmp_path / "l.db", port=0, notify=said.append,
                  llm=LLMConfig(model="fake", cache_dir=str(tmp_path / "cache")), backend=fake)
    try:
        app.start_scoring().join(timeout=60)
        state = app.session.scoring
        assert state.done and state.error is None
        assert state.criteria == ["clarity", "accuracy"]
        assert np.isfinite(app.session.X).all() and app.session.X.shape == (len(samples), 2)
        assert any(s.startswith("warning: could not decompose") and "the task's aspects alone" in s for s in said)
        c = named(client(app.session))
        assert c.post("/api/label", json={"sample_id": shown_id(c), "values": {"clarity": 3, "accuracy": 4}},
                      headers=H).status_code == 200
    finally:
        app.close()
