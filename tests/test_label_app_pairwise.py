"""The labelling app on a pairwise task, without a browser: a choice (A, B or tie) per pair in
labels.db, the page, export in the pair format with the majority rule, the panel's figures."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import TOY_TASK, run_cli, write_jsonl

from hdeval.app.labels import LabelStore, export_labels
from hdeval.app.server import build_app
from hdeval.app.session import LabelSession
from hdeval.core.errors import DataError
from hdeval.data.samples import read_task_samples
from hdeval.data.tasks import load_task

H = {"X-Hdeval": "1"}
PAIR_TOY = TOY_TASK.replace('output_label = "Answer"', 'output_label = "Answer"\nshape = "pairwise"')


def pair_rows(n_docs: int = 12, per_doc: int = 2) -> list[dict]:
    return [{"id": f"p{d}-{k}", "doc_id": f"d{d}", "source": f"Question {d}: why is the sky blue?",
             "output_a": f"Answer A{k}: scattering." + " more" * (d + k),
             "output_b": f"Answer B{k}: it reflects the sea." + " words" * (2 * d + k)}
            for d in range(n_docs) for k in range(per_doc)]


@pytest.fixture
def pairs(tmp_path):
    task_file = tmp_path / "pairs.toml"
    task_file.write_text(PAIR_TOY, encoding="utf-8")
    rows = pair_rows()
    rows[0]["output_b"] = 'B <script>alert("x")</script> & <b>bold</b>'
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    task = load_task(task_file)
    return task, task_file, data, read_task_samples(data, task, require_labels=False)


def session_of(task, samples, db, **kw) -> LabelSession:
    """A session whose pool is already scored (random score differences: no LLM)."""
    s = LabelSession(task, samples, LabelStore(db, task), **kw)
    s.set_criteria(["c1", "c2", "c3"])
    s.add_scores(np.arange(len(samples)), np.random.default_rng(0).normal(0, 1, (len(samples), 3)))
    return s


def client(session):
    from starlette.testclient import TestClient

    return TestClient(build_app(session), base_url="http://127.0.0.1:8765")


def named(c, name="ann"):
    assert c.post("/api/rater", json={"name": name}, headers=H).status_code == 200
    return c


def shown_id(c) -> str:
    return re.search(r'data-sample-id="([^"]+)"', c.get("/").text).group(1)


def test_a_pair_is_labelled_with_one_choice_stored_as_a_signed_number(pairs, tmp_path):
    task, _, _, samples = pairs
    with LabelStore(tmp_path / "labels.db", task) as store:
        store.add(samples[0], {"label": "a"}, rater="ann", session="s")
        store.add(samples[1], {"label": "tie"}, rater="ann", session="s")
        store.add(samples[2], {"label": "b"}, rater="ann", session="s")
        assert [(r["aspect"], r["value"]) for r in store.rows()] == [("label", 1.0), ("label", 0.0), ("label", -1.0)]
        for bad in ({"label": "A"}, {"label": 1}, {"clarity": 3}, {"label": "a", "clarity": 3}):
            with pytest.raises(DataError, match="a pair's label is"):
                store.add(samples[3], bad, rater="ann", session="s")
        assert len(store.rows()) == 3


def test_the_page_shows_both_responses_escaped_and_the_choices(pairs, tmp_path):
    task, _, _, samples = pairs
    s = session_of(task, samples, tmp_path / "labels.db")
    c = named(client(s))
    s._assigned["ann"] = type(s.next_for("ann"))(0, samples[0], "test", "random")  # the hostile pair
    html = c.get("/").text
    assert "<script>alert" not in html and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    assert 'data-field="output_a"' in html and 'data-field="output_b"' in html
    assert [m for m in re.findall(r'data-choice="(\w+)"', html)] == ["a", "tie", "b"]
    assert 'data-field="output"' not in html  # no empty single-response box
    assert c.post("/api/label", json={"sample_id": samples[0].id, "values": {"label": "b"}},
                  headers=H).json() == {"ok": True, "labelled": samples[0].id}
    r = c.post("/api/label", json={"sample_id": samples[1].id, "values": {"label": "maybe"}}, headers=H)
    assert r.status_code == 400 and "a pair's label is" in r.json()["error"]
    assert c.get("/api/state").json()["labelled"] == 1
    assert shown_id(c) != samples[0].id


def test_export_writes_pairs_train_reads_with_the_majority_choice(pairs, tmp_path):
    task, _, _, samples = pairs
    db = tmp_path / "labels.db"
    with LabelStore(db, task) as store:
        for who, choice in (("ann", "a"), ("bob", "b")):  # one each way: a tie
            store.add(samples[0], {"label": choice}, rater=who, session="s")
        for who, choice in (("ann", "a"), ("bob", "a"), ("cy", "b")):  # the majority: A
            store.add(samples[1], {"label": choice}, rater=who, session="s")
        store.add(samples[2], {"label": "b"}, rater="ann", session="s")
        store.add(samples[2], {"label": "tie"}, rater="ann", session="s")  # an edit: the latest wins
    out = tmp_path / "labeled.jsonl"
    assert export_labels(db, out) == 3
    back = read_task_samples(out, task, require_labels=True)
    assert [(p.id, p.label) for p in back] == [(samples[0].id, "tie"), (samples[1].id, "a"), (samples[2].id, "tie")]
    assert (back[0].output_a, back[0].output_b, dict(back[0].fields)) == \
        (samples[0].output_a, samples[0].output_b, dict(samples[0].fields))
    assert [json.loads(x)["raters"] for x in out.read_text().splitlines()] == [2, 3, 1]
    r = run_cli("data", "export-labels", db, "-o", tmp_path / "raw.jsonl", "--raw")
    assert r.exit_code == 0 and len((tmp_path / "raw.jsonl").read_text().splitlines()) == 7


def test_the_panel_agreement_is_pairwise_and_people_agree_on_a_nominal_scale(pairs, tmp_path):
    task, _, _, samples = pairs
    s = session_of(task, samples, tmp_path / "labels.db", refit_every=1000)
    truth = ["a" if s.X[i].sum() > 0 else "b" for i in range(len(samples))]
    for i, p in enumerate(samples[:16]):
        s.label("ann", "s", p.id, {"label": truth[i]})
    for i, p in enumerate(samples[:3]):
        s.label("bob", "t", p.id, {"label": truth[i]})
    fit = s.refit()
    assert fit.n_labels == 16 and fit.agreement is not None and 0 <= fit.agreement <= 1  # a rate, not a Spearman
    assert s.panel()["people"] == {"aspects": {"label": 1.0}, "shared": 3}
    s.label("bob", "t", samples[0].id, {"label": "tie"})
    s.label("bob", "t", samples[1].id, {"label": "tie"})
    alpha = s.panel()["people"]["aspects"]["label"]
    assert alpha is not None and alpha < 0.5
    html = client(s).get("/panel").text
    assert "alpha (nominal)" in html and "Choice (A, B or tie)" in html


def test_a_pair_whose_response_changed_is_flagged_not_reused(pairs, tmp_path):
    task, _, data, samples = pairs
    db = tmp_path / "labels.db"
    with LabelStore(db, task) as store:
        store.add(samples[1], {"label": "a"}, rater="ann", session="s")
        store.add(samples[2], {"label": "b"}, rater="ann", session="s")
    rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
    rows[1]["output_b"] += " (edited)"  # only a response changed: the input fields are the same
    edited = read_task_samples(write_jsonl(tmp_path / "edited.jsonl", rows), task, require_labels=False)
    s = LabelSession(task, edited, LabelStore(db, task))
    assert s.changed == [samples[1].id]
    assert [edited[i].id for i in s.labelled()[0]] == [samples[2].id]
