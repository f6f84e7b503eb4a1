"""Decomposition replies are validated; malformed replies are retried, then fail clearly."""

from __future__ import annotations

import json

import pytest

from hdeval.backends.base import Completion
from hdeval.methods.hdeval.decompose import decompose, parse_subcriteria
from hdeval.errors import DecompositionError
from hdeval.prompts import load_templates
from hdeval.tasks import load_task
from hdeval.types import CriteriaTree


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
    kids = parse_subcriteria("```json\n" + GOOD + "\n```", node, tree, 4, set())
    assert [k.key for k in kids] == ["coherence/logical_order", "coherence/flow"]
    assert all(k.parent_key == "coherence" and k.layer == 2 for k in kids)


def test_count_is_capped():
    task, tree, node = _setup()
    many = {"subcriteria": [{"key": f"k{i}", "name": f"N{i}", "definition": "d"} for i in range(7)]}
    assert len(parse_subcriteria(json.dumps(many), node, tree, 3, set())) == 3


@pytest.mark.parametrize("reply, problem", [
    ("not json at all", "no JSON object"),
    ('{"subcriteria": []}', "non-empty list"),
    ('{"subcriteria": [{"key": "a", "name": "", "definition": "d"}]}', "non-empty key, name and definition"),
])
def test_malformed_replies_are_rejected(reply, problem):
    task, tree, node = _setup()
    with pytest.raises(ValueError, match=problem):
        parse_subcriteria(reply, node, tree, 4, set())


def test_clashing_keys_are_numbered_and_repeats_dropped():
    task, tree, node = _setup()
    reply = json.dumps({"subcriteria": [
        {"key": "order", "name": "Order", "definition": "Ideas in order."},
        {"key": "Order", "name": "Order of events", "definition": "Events in time order."},
        {"key": "order", "name": "Order", "definition": "Ideas in order."},
        {"key": "flow", "name": "Flow", "definition": "Sentences connect."},
    ]})
    kids = parse_subcriteria(reply, node, tree, 4, {"coherence/flow"})
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
