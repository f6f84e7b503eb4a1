"""The labelling app on a pairwise task in a real browser (Selenium, Debian's chromium): pairs
labelled by the keys a, b and t, exported, and `hdeval train` on the export."""

from __future__ import annotations

import json

import pytest
from browser import wait
from conftest import run_cli, write_jsonl
from test_label_app_browser import keys, shown, start_as, start_label, state
from test_label_app_pairwise import PAIR_TOY, pair_rows

from hdeval.data.samples import read_task_samples, split_samples
from hdeval.data.tasks import load_task

pytestmark = pytest.mark.slow
HOSTILE = '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'


def choose_by_key(d, key: str) -> str:
    before = shown(d)
    keys(d, key)
    return wait(lambda: (lambda s: s if s and s != before else None)(shown(d)), what="the next pair")


def test_label_pairs_by_keyboard_export_and_train(tmp_path, servers, browsers):
    task = tmp_path / "pairs.toml"
    task.write_text(PAIR_TOY, encoding="utf-8")
    rows = pair_rows(12, 2)
    for r in rows:
        r["output_a"] = HOSTILE + " " + r["output_a"]  # whichever pair is shown carries it
    server = start_label(servers, tmp_path, task, write_jsonl(tmp_path / "pairs.jsonl", rows), cache=tmp_path / "cache")
    d = browsers()
    first = start_as(d, server.url, "ann")
    assert HOSTILE in wait(lambda: d.find_element("css selector", '[data-field="output_a"]').text)
    assert d.execute_script("return window.__pwned === undefined")
    order = "abtabbaatbab"
    labelled = [first]
    for key in order:
        labelled.append(choose_by_key(d, key))
    assert state(server)["labelled"] == len(order)
    keys(d, "u")  # undo: the last pair comes back, and is chosen again
    wait(lambda: shown(d) == labelled[-2], what="the undone pair")
    choose_by_key(d, "t")
    assert state(server)["labelled"] == len(order)
    out = tmp_path / "labeled.jsonl"
    r = run_cli("data", "export-labels", tmp_path / "labels.db", "-o", out)
    assert r.exit_code == 0, r.output
    pairs = read_task_samples(out, load_task(task), require_labels=True)
    want = {"a": "a", "b": "b", "t": "tie"}
    assert [(p.id, p.label) for p in pairs] == [(i, want[k]) for i, k in zip(labelled, order[:-1] + "t")]
    assert all(p.output_a.startswith(HOSTILE) for p in pairs)
    art = tmp_path / "art"
    r = run_cli("train", "--task", task, "--data", out, "--llm", "fake", "--cache-dir", tmp_path / "cache",
                "--layers", "2", "--test-frac", "0.3", "--train-frac", "0.7", "-o", art, "-q")
    assert r.exit_code == 0, r.output
    assert "LLM calls made: 0" in r.stderr  # the app scored each response as train does: the same cache entries
    metrics = json.loads((art / "metrics.json").read_text(encoding="utf-8"))
    # the 12 pairs labelled, split by document as train splits them (which documents the app
    # picked follows the fake LLM's scores)
    split = split_samples(pairs, 0.3, 0.7, 0)
    assert metrics["shape"] == "pairwise" and len(pairs) == 12
    assert metrics["split"] == {"train": len(split.train_ids), "test": len(split.test_ids)}
    assert metrics["final"]["n"] == len(split.test_ids) and metrics["final"]["failed"] == 0
