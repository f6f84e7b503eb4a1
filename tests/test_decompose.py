"""Decomposition replies are validated; malformed replies are retried, then fail clearly."""

from __future__ import annotations

import json

import pytest

from hdeval.core.errors import DecompositionError
from hdeval.core.types import CriteriaTree
from hdeval.data.tasks import load_task
from hdeval.judge.fill import extract_json
from hdeval.judge.prompts import load_templates
from hdeval.llm.backends.base import Completion
from hdeval.llm.backends.fake import FakeBackend
from hdeval.methods.hdeval.decompose import decompose, validate_subcriteria
from hdeval.methods.registry import load_artifact
from hdeval.run.train import train


def parse(text, *args):
    return validate_subcriteria(extract_json(text), *args)


class Scripted:
    identity = "scripted"

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []

    def complete(self, request):
        self.requests.append(request)
        return Completion(self.replies.pop(0))


def _setup():
    task = load_task("summeval")
    tree = CriteriaTree.from_aspects(task.aspects)
    return task, tree, tree["coherence"]


GOOD = json.dumps({"subcriteria": [
    {"key": "Logical Order", "name": "Logical order", "definition": "Ideas follow each other."},
    {"key": "flow", "name": "Flow", "definition": "Sentences connect."},
]})


def test_valid_reply_becomes_children_with_path_keys():
    task, tree, node = _setup()
    kids = parse("```json\n" + GOOD + "\n```", node, tree, 4, set())
    assert [k.key for k in kids] == ["coherence/logical_order", "coherence/flow"]
    assert all(k.parent_key == "coherence" and k.layer == 2 for k in kids)


def test_count_is_capped():
    task, tree, node = _setup()
    many = {"subcriteria": [{"key": f"k{i}", "name": f"N{i}", "definition": f"d{i}"} for i in range(7)]}
    assert len(parse(json.dumps(many), node, tree, 3, set())) == 3


@pytest.mark.parametrize("reply, problem", [
    ("not json at all", "no JSON object"),
    ('{"subcriteria": []}', "non-empty list"),
    ('{"subcriteria": [{"key": "a", "name": "", "definition": "d"}]}', "needs a non-empty name$"),
    ('{"subcriteria": [{"key": "a", "name": "N", "definition": " "}]}', "needs a non-empty definition$"),
    # a key that slugs to nothing is named as what it is, not as an empty field
    ('{"subcriteria": [{"key": "...", "name": "N", "definition": "d"}]}', r"key '\.\.\.' holds no letter or digit"),
])
def test_malformed_replies_are_rejected(reply, problem):
    task, tree, node = _setup()
    with pytest.raises(ValueError, match=problem):
        parse(reply, node, tree, 4, set())


def test_clashing_keys_are_numbered_and_repeats_dropped():
    task, tree, node = _setup()
    reply = json.dumps({"subcriteria": [
        {"key": "order", "name": "Order", "definition": "Ideas in order."},
        {"key": "Order", "name": "Order of events", "definition": "Events in time order."},
        {"key": "order", "name": "Order", "definition": "Ideas in order."},
        {"key": "flow", "name": "Flow", "definition": "Sentences connect."},
    ]})
    kids = parse(reply, node, tree, 4, {"coherence/flow"})
    assert [k.key for k in kids] == ["coherence/order", "coherence/order_2", "coherence/flow_2"]
    assert len({k.key for k in kids}) == 3


def test_malformed_reply_is_retried_with_feedback_then_succeeds():
    task, tree, node = _setup()
    backend = Scripted(["{oops", GOOD])
    kids = decompose(backend, load_templates()["decompose"], task, tree, node, 4)
    assert len(kids) == 2
    assert len(backend.requests) == 2
    retry = backend.requests[1].messages
    assert retry[-2].role == "assistant" and retry[-2].content == "{oops"
    assert "not usable" in retry[-1].content


def test_persistent_garbage_fails_naming_the_criterion():
    task, tree, node = _setup()
    backend = Scripted(["no", "still no", "never"])
    with pytest.raises(DecompositionError, match="'coherence'.*3 replies were unusable"):
        decompose(backend, load_templates()["decompose"], task, tree, node, 4)


# ---------------------------------------------------------------- the quality gate
def _reply(*subs):
    return json.dumps({"subcriteria": [{"key": k, "name": n, "definition": d} for k, n, d in subs]})


FLOW = ("flow", "Flow", "Sentences connect.")
# the three degenerate replies the embedded model gave
PARENT_COPY = _reply(("coherence", "Coherence", "The collective quality of all sentences."), FLOW)
TWIN_SIBLINGS = _reply(("logical_order", "Logical order", "Ideas follow each other."),
                       ("logical_order_2", "Logical Order.", "Ideas come in a sensible order."))
BOILERPLATE = _reply(FLOW, ("scale", "Scale", "The summary should be a 1-5 scale, with a 1-5 scale, and a "
                                             "1-5 scale, and a 1-5 scale"))


@pytest.mark.parametrize("reply, problem", [
    (PARENT_COPY, "#1 'Coherence' repeats its parent 'coherence'"),
    (TWIN_SIBLINGS, "#2 'Logical Order.' has the same name as sibling 'Logical order'"),
    (BOILERPLATE, "#2 'Scale' is rubric boilerplate: it describes the rating scale"),
    (_reply(FLOW, ("same", "Same words", "Ideas follow each other.")) .replace("Ideas follow each other.",
                                                                          "Sentences connect."),
     "same definition as sibling 'Flow'"),
    (_reply(FLOW, ("loop", "Looping", "good and clear and good and clear and good and clear")),
     "repeats the phrase 'good and clear' 3 times"),
    (_reply(("own_def", "Own words", "The collective quality of all sentences.")), "same definition"),
])
def test_degenerate_subcriteria_are_rejected_naming_which_and_why(reply, problem):
    task, tree, node = _setup()
    if "Own words" in reply:  # a definition equal to the parent's, whatever the name
        reply = reply.replace("The collective quality of all sentences.", node.definition)
    with pytest.raises(ValueError, match=problem.replace(".", r"\.").replace("(", r"\(")):
        parse(reply, node, tree, 4, set())


def test_a_grandparent_copy_is_rejected_and_clean_fake_style_names_pass():
    task, tree, node = _setup()
    kids = parse(GOOD, node, tree, 4, set())
    tree = tree.with_children("coherence", kids)
    child = tree["coherence/flow"]
    # a criterion named after its parent's facet plus more is a narrower quality: kept
    ok = parse(_reply(("flow", "Coherence: flow: flow", "How sentences connect within a paragraph.")),
                           child, tree, 4, set(tree.keys))
    assert [k.key for k in ok] == ["coherence/flow/flow"]
    with pytest.raises(ValueError, match="repeats its parent 'coherence'"):
        parse(_reply(("c", "coherence", "Anything.")), child, tree, 4, set(tree.keys))


@pytest.mark.parametrize("bad", [PARENT_COPY, TWIN_SIBLINGS, BOILERPLATE])
def test_a_degenerate_reply_is_reasked_and_recorded(bad):
    task, tree, node = _setup()
    backend = Scripted([bad, GOOD])
    found = []
    kids = decompose(backend, load_templates()["decompose"], task, tree, node, 4, rejections=found)
    assert [k.name for k in kids] == ["Logical order", "Flow"]
    assert len(backend.requests) == 2
    reask = backend.requests[1].messages[-1].content
    assert "narrower quality of 'Coherence'" in reask and "rating scale" in reask
    assert len(found) == 1 and found[0]["criterion"] == "coherence"


def test_a_model_that_stays_degenerate_leaves_the_node_unexpanded_and_says_so():
    from hdeval.core.progress import Progress
    from hdeval.methods.hdeval.decompose import decompose_nodes

    class Said(Progress):
        def __init__(self):
            self.lines = []

        def message(self, text):
            self.lines.append(text)

    task, tree, node = _setup()
    backend = Scripted([PARENT_COPY, TWIN_SIBLINGS, BOILERPLATE, GOOD])
    found, said = [], Said()
    out = decompose_nodes(backend, load_templates()["decompose"], task, tree, [node, tree["fluency"]], 4,
                          said, found)
    assert out.children("coherence") == []  # never scored
    assert [c.key for c in out.children("fluency")] == ["fluency/logical_order", "fluency/flow"]
    assert len(backend.requests) == 4  # 3 attempts on coherence, then fluency
    assert [r["criterion"] for r in found] == ["coherence"] * 4
    assert found[-1] == {"criterion": "coherence", "unexpanded": True, "attempts": 3}
    assert "repeats its parent" in found[0]["rejected"] and "boilerplate" in found[2]["rejected"]
    assert len(said.lines) == 1
    assert said.lines[0].startswith("warning: criterion 'coherence' left unexpanded: 3 decomposition replies")
    assert "rubric boilerplate" in said.lines[0]


def test_malformed_json_still_stops_with_one_error_even_after_degenerate_replies():
    task, tree, node = _setup()
    backend = Scripted([PARENT_COPY, "no", "never"])
    with pytest.raises(DecompositionError, match="'coherence'.*3 replies were unusable"):
        decompose(backend, load_templates()["decompose"], task, tree, node, 4)


def test_train_records_rejections_in_the_manifest_and_warns_in_the_summary(toy, tmp_path):
    from hdeval.llm.backends.fake import RESPONDERS

    def clarity_is_degenerate(request, fake):
        if request.data["criterion"] == "clarity":  # every attempt: the parent again
            return Completion(_reply(("clarity", "Clarity", "How clear the answer is, clearly.")))
        return RESPONDERS["decompose"](request, fake)

    task, data = toy
    fake = FakeBackend(responders={**RESPONDERS, "decompose": clarity_is_degenerate})
    ev = train(task=str(task), data=str(data), method="hdeval", layers=2, children=2, aggregator="lr",
               backend=fake, cache_dir=str(tmp_path / "c"))
    assert ev.tree.children("clarity") == [] and len(ev.tree.children("accuracy")) == 2
    rejected = ev.manifest_extra["decomposition_rejections"]
    assert rejected[-1] == {"criterion": "clarity", "unexpanded": True, "attempts": 3}
    assert all(r["criterion"] == "clarity" for r in rejected)
    path = ev.save(tmp_path / "art")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["state"]["decomposition_rejections"] == rejected
    again = load_artifact(path)  # kept through a load and save
    assert again.manifest_extra["decomposition_rejections"] == rejected
    lines = [t for t, to_err in again.summary_lines(path) if to_err]
    assert any("1 criteria left unexpanded" in t and "clarity" in t for t in lines)


def _artifact_files(path):
    out = {}
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = f.relative_to(path).as_posix()
        if rel.endswith(".skops"):
            continue  # a zip stamped with its write time; the manifest and metrics describe the model
        if rel == "manifest.json":
            m = json.loads(f.read_text())
            for k in ("created", "hdeval_version", "versions", "files"):  # when and with what it ran
                m.pop(k, None)
            out[rel] = m
        elif rel == "metrics.json":
            m = json.loads(f.read_text())
            m.pop("usage", None), m.pop("usage_decompose", None)  # this run's calls and cache hits
            out[rel] = m
        else:
            out[rel] = f.read_bytes()
    return out


def test_a_rerun_takes_a_cached_degenerate_decomposition_as_final_and_pays_nothing(toy, tmp_path):
    from hdeval.llm.backends.fake import RESPONDERS

    asked = []

    def clarity_is_degenerate(request, fake):
        if request.data["criterion"] == "clarity":  # every attempt: the parent again
            asked.append(request)
            return Completion(_reply(("clarity", "Clarity", "How clear the answer is, clearly.")))
        return RESPONDERS["decompose"](request, fake)

    task, data = toy

    def run(name):
        fake = FakeBackend(responders={**RESPONDERS, "decompose": clarity_is_degenerate})
        ev = train(task=str(task), data=str(data), method="hdeval", layers=2, children=2, aggregator="lr",
                   backend=fake, cache_dir=str(tmp_path / "c"))
        return fake, ev, ev.save(tmp_path / name)

    first_fake, first, first_art = run("first")
    assert len(asked) == 3 and first_fake.calls > 3  # the first run keeps its 3 attempts
    assert first.tree.children("clarity") == []
    again_fake, again, again_art = run("again")
    assert again_fake.calls == 0 and len(asked) == 3  # the cached rejection is the outcome
    assert again.manifest_extra["decomposition_rejections"] == first.manifest_extra["decomposition_rejections"]
    assert _artifact_files(again_art) == _artifact_files(first_art)


@pytest.mark.parametrize("degenerate_first", [False, True], ids=["malformed", "degenerate-then-malformed"])
def test_a_rerun_still_reasks_a_chain_that_ends_malformed(tmp_path, degenerate_first):
    # malformed JSON is a fault a fix (another model, a constraining server) can cure: asked anew,
    # also when an earlier reply of the chain was degenerate
    from hdeval.llm.cache.client import CachedBackend

    task, tree, node = _setup()
    degenerate = _reply(("coherence", "Coherence", "How coherent the summary is, coherently."))
    cached = CachedBackend(Scripted([degenerate if degenerate_first else "no", "never", "nothing"]), tmp_path / "c")
    with pytest.raises(DecompositionError):
        decompose(cached, load_templates()["decompose"], task, tree, node, 4)
    cached.close()
    fixed = Scripted([GOOD])
    cached = CachedBackend(fixed, tmp_path / "c")
    kids = decompose(cached, load_templates()["decompose"], task, tree, node, 4)
    cached.close()
    assert [k.name for k in kids] == ["Logical order", "Flow"] and len(fixed.requests) == 1


def test_a_cure_that_ends_degenerate_is_final_for_the_next_rerun(tmp_path):
    # run 1 ends malformed; run 2 (a changed server) re-asks and ends degenerate, an outcome;
    # run 3 replays both chains from the cache and pays nothing (it used to walk past the
    # cached degenerate re-asks and pay for a fresh one on every rerun)
    from hdeval.llm.cache.client import CachedBackend

    task, tree, node = _setup()
    degenerate = _reply(("coherence", "Coherence", "How coherent the summary is, coherently."))
    for replies, fails in ((["no", "never", "nothing"], True), ([degenerate] * 3, False), ([], False)):
        llm = Scripted(replies)
        cached = CachedBackend(llm, tmp_path / "c")
        try:
            if fails:
                with pytest.raises(DecompositionError):
                    decompose(cached, load_templates()["decompose"], task, tree, node, 4)
            else:
                assert decompose(cached, load_templates()["decompose"], task, tree, node, 4) == []
        finally:
            cached.close()
        assert len(llm.requests) == len(replies)


def test_a_failed_layer_2_keeps_layer_1_with_a_warning(toy, tmp_path):
    from hdeval.core.progress import Progress
    from hdeval.llm.backends.fake import RESPONDERS

    task, data = toy
    said: list[str] = []

    class Heard(Progress):
        def message(self, text: str) -> None:
            said.append(text)

    dots = '{"subcriteria": [{"key": "...", "name": "...", "definition": "..."}]}'  # a small model's reply
    fake = FakeBackend(responders={**RESPONDERS, "decompose": lambda request, fake: Completion(dots)})
    ev = train(task=str(task), data=str(data), backend=fake, layers=2, cache_dir=str(tmp_path / "c"),
               progress=Heard())
    assert {c.layer for c in ev.tree} == {1}  # what was scored and fitted is kept, not lost
    assert "could not decompose" in ev.metrics["stopped"] and "key '...' holds no letter" in ev.metrics["stopped"]
    assert any(s.startswith("warning: could not decompose") and "keeps layers 1-1" in s for s in said)
    ev.save(tmp_path / "art")
    assert load_artifact(tmp_path / "art").metrics["stopped"] == ev.metrics["stopped"]
