"""Simulated judges for testing statistics: the truth is known, the noise is ours.

Each synthetic sample carries a hidden latent quality in its text (``[[q=...]]``); humans rate
the latent plus their own noise, and the simulated judge reads the latent plus noise we choose:
per criterion, a halo shared by all criteria of one sample, a misreading shared by the criteria
of one aspect (for one sample), and criteria that are pure noise. ``real_rows`` puts a real data
set's human scores in the text instead (``[[<aspect name>=...]]``), one latent per aspect.
The fake LLM's numbers mean nothing; these mean exactly what we built into them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import numpy as np
from conftest import TOY_TASK as _TOY_TASK

from hdeval.llm.backends.base import Completion, CompletionRequest
from hdeval.llm.backends.fake import RESPONDERS, FakeBackend

_LATENT = re.compile(r"\[\[q=(-?[0-9.]+)\]\]")
_ASPECT_LATENT = re.compile(r"\[\[([^=\]\[]+)=(-?[0-9.]+)\]\]")


def unit_normal(*parts: str) -> float:
    """A deterministic standard normal draw keyed by ``parts`` (the same request, the same noise)."""
    h = hashlib.sha256("\x1f".join(parts).encode()).digest()
    u1 = (int.from_bytes(h[:8], "big") + 1) / (2**64 + 1)
    u2 = int.from_bytes(h[8:16], "big") / 2**64
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def latents(text: str) -> list[float]:
    return [float(x) for x in _LATENT.findall(text)]


def _prompt(request: CompletionRequest) -> str:
    return "\n".join(m.content for m in request.messages)


def declared(request: CompletionRequest, name: str) -> str:
    """A text the request declares it shows (its ``data``): what a simulated judge reads."""
    value = request.data.get(name, "")
    return value if isinstance(value, str) else ""


def sample_key(request: CompletionRequest) -> str:
    """The key of a pointwise request's per-sample draws: its declared sample, in the form the
    simulations' thresholds were calibrated with."""
    return f"<sample>\n{declared(request, 'sample')}\n"


# ------------------------------------------------------------------ pairwise (DnA)
def pairwise_rows(n: int = 120, seed: int = 0, tie_band: float = 0.6, human_noise: float = 0.3) -> list[dict]:
    """``n`` pairs, one per question; the human label is the sign of the latent difference plus
    noise, a tie when it is within ``tie_band``."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        qa, qb = rng.uniform(2, 9, size=2)
        d = qa - qb + rng.normal(0, human_noise)
        label = "tie" if abs(d) <= tie_band else ("a" if d > 0 else "b")
        rows.append({
            "id": f"sim-{i:03d}", "task": "faireval", "doc_id": f"q{i:03d}",
            "source": f"Question number {i}: explain something.", "context": None,
            "output_a": f"Answer one [[q={qa:.3f}]] with some words.",
            "output_b": f"Answer two [[q={qb:.3f}]] with other words.",
            "system_a": "x", "system_b": "y", "label": label, "annotations": None, "meta": None,
        })
    return rows


def write_pairs(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def pair_backend(fmt: str = "{a} {b}", noise: float = 0.8, json_replies: bool = False,
                 first_bonus: float = 0.0) -> FakeBackend:
    """A DnA judge: each aspect score is the response's latent plus noise (plus ``first_bonus``
    for the response shown first: a position bias), rounded to 1-10, and written in ``fmt``
    (``"R1: {a}; R2: {b}"``, ``"{a} {b}"``, ...). With ``json_replies``, a request carrying a JSON
    schema is answered with ``{"score_a": .., "score_b": ..}``."""

    def scores(request: CompletionRequest) -> tuple[int, int]:
        shown_a, shown_b = declared(request, "response_a"), declared(request, "response_b")
        q = latents(shown_a) + latents(shown_b)
        key = declared(request, "aspect") or "overall"
        a_first = "Answer one" in shown_a
        first, second = (q[0], q[1]) if len(q) >= 2 else (5.0, 5.0)
        out = []
        for side, lat in (("1", first + first_bonus), ("2", second)):
            # the noise of one request: a reworded prompt is another request, as to a real judge
            v = lat + noise * unit_normal(key, side, _prompt(request)[-400:], str(a_first))
            out.append(int(min(10, max(1, round(v)))))
        return out[0], out[1]

    def reply(request: CompletionRequest, fake) -> Completion:
        a, b = scores(request)
        if json_replies and request.json_schema:
            text = json.dumps({"score_a": a, "score_b": b})
        else:
            text = fmt.format(a=a, b=b)
        return Completion(text, None, len(_prompt(request)) // 4, 4)

    import hdeval.methods.dna.fake  # noqa: F401  (registers the fake's aspect and weight responders)

    # a server that does not honour answer constraints: replies go out in ``fmt`` as written
    return FakeBackend(logprobs=False, honour_constraints=False,
                       responders={**RESPONDERS, "dna_score": reply, "dna_direct": reply})


# ------------------------------------------------------------------ pointwise (HD-Eval)
def pointwise_rows(n_docs: int = 40, per_doc: int = 3, seed: int = 0, human_noise: float = 0.35,
                   aspects=("clarity", "accuracy")) -> list[dict]:
    """Samples whose human score on every aspect is a hidden latent quality plus rater noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for d in range(n_docs):
        for k in range(per_doc):
            q = float(rng.uniform(1, 5))
            rows.append({
                "id": f"sim-{d:02d}-{k}", "doc_id": f"doc-{d:02d}",
                "source": f"Question number {d}: how do plants make food?",
                "output": f"Answer {k} [[q={q:.3f}]]: plants use light.",
                "scores": {a: float(np.clip(q + rng.normal(0, human_noise), 1, 5)) for a in aspects},
            })
    return rows


def criterion_depth(name: str) -> int:
    """The fake decomposer names a child "<parent name>: <facet>": depth = parts of the name."""
    return name.count(":") + 1


def pointwise_backend(noise: float = 0.7, halo: float = 0.3, deep_signal: bool = False,
                      noise_criteria: tuple[str, ...] = (), misreading: float = 0.0, seed: str = "",
                      shared: float = 0.0, uneven: float = 0.0) -> FakeBackend:
    """An HD-Eval judge: a layer-1 criterion reads the latent plus a halo shared by every
    criterion of the sample, a ``misreading`` shared by every criterion of the same aspect (the
    first part of its name) on the sample, and its own noise. Deeper criteria are pure noise
    (the judge's deeper questions carry no signal) unless ``deep_signal``; a criterion whose name
    ends in one of ``noise_criteria`` is pure noise at any depth. A sample that carries one
    latent per aspect (``[[<aspect name>=...]]``, see ``real_rows``) is read on its aspect's.
    A jury: judges with different ``seed`` draw their own errors; ``shared`` is a misreading
    every judge makes alike (keyed by aspect and sample, not by seed), as judges of one era
    share blind spots. ``uneven`` > 0 gives each criterion its own noise level, ``noise`` times
    a log-normal factor (``exp(uneven * z)``, z drawn once per criterion name): some criteria
    read their aspect better than others, so equal weights are no longer the best ones."""

    def reply(request: CompletionRequest, fake) -> Completion:
        prompt = _prompt(request)
        name, sample = declared(request, "criterion_name"), sample_key(request)
        aspect = name.split(":")[0].strip()
        per_aspect = dict(_ASPECT_LATENT.findall(sample))
        q = [float(per_aspect[aspect])] if aspect in per_aspect else latents(sample)
        informative = (criterion_depth(name) == 1 or deep_signal) and not any(
            name.lower().endswith(n) for n in noise_criteria)
        if informative and q:
            own = (seed,) if seed else ()  # the default judge draws as before this option existed
            v = (q[0] + halo * unit_normal(*own, "halo", sample)
                 + misreading * unit_normal(*own, "misread", aspect, sample)
                 + shared * unit_normal("shared", aspect, sample)
                 + noise * _noise_factor(uneven, name) * unit_normal(*own, "crit", name, sample))
        else:
            v = 3 + 1.2 * unit_normal("pure-noise", name, sample)
        return Completion(str(int(min(5, max(1, round(v))))), None, len(prompt) // 4, 1)

    return FakeBackend(logprobs=False, responders={**RESPONDERS, "score": reply})


def _noise_factor(uneven: float, name: str) -> float:
    return math.exp(uneven * unit_normal("noise-level", name)) if uneven else 1.0


#: A realistic judge: a halo (0.8) shared by all criteria of a sample, a
#: misreading (2.0) shared by the criteria of one aspect, criterion noise 0.7. On SFHOT its
#: direct scores' held-out Spearman is about .3.
REALISTIC = {"noise": 0.7, "halo": 0.8, "misreading": 2.0, "deep_signal": True}


def real_rows(path: Path, task, n_docs: int | None = None, seed: int = 0) -> list[dict]:
    """A real data set's rows (``n_docs`` of its documents, drawn with ``seed``; all when None)
    with each aspect's human score written into the output as ``[[<aspect name>=<latent>]]``,
    the latent being the score mapped from the aspect's range onto 1-5."""
    rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    docs = sorted({r["doc_id"] for r in rows})
    if n_docs is not None:
        keep = set(np.random.default_rng(seed).choice(docs, size=min(n_docs, len(docs)), replace=False))
        rows = [r for r in rows if r["doc_id"] in keep]
    out = []
    for r in rows:
        tags = []
        for a in task.aspects:
            lo, hi = a.range
            tags.append(f"[[{a.name}={1 + 4 * (r['scores'][a.key] - lo) / (hi - lo):.3f}]]")
        out.append(dict(r, output=f"{r['output']} {' '.join(tags)}"))
    return out


# the toy task of conftest under its own name, so the two kinds of data never share a cache entry
TOY_TASK = _TOY_TASK.replace('name = "toy_qa"', 'name = "sim_qa"')


def write_pointwise(tmp: Path, rows: list[dict]) -> tuple[Path, Path]:
    task = tmp / "sim_qa.toml"
    task.write_text(TOY_TASK, encoding="utf-8")
    data = tmp / "sim_qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return task, data
