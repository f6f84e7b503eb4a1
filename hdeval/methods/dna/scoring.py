"""One run of DnA's stages over pairs: aspects, weights, the pairwise score prompts, and their
aggregation into a verdict per pair (unusable replies become recorded failures); and the calls
of each stage counted without calling the LLM (the dry run)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from hdeval.core.metrics import pair_agreement as agreement
from hdeval.core.progress import Progress
from hdeval.core.types import PairSample, ScoreMatrix, Task
from hdeval.judge.fill import Cell, UnusableReply, ask_json_many, fill_matrix
from hdeval.judge.prompts import Template
from hdeval.llm.backends.base import CompletionRequest
from hdeval.methods.base import ScoreResult, progress_stage, usage_of
from hdeval.methods.dna.decision import decide, position_bias, weighted_totals
from hdeval.methods.dna.prompts import (
    TWO_SCORES,
    _req,
    aspects_request,
    load_dna_templates,
    overall_request,
    pair_block,
    score_request,
    shown_pair,
    weights_request,
)
from hdeval.methods.dna.replies import (
    AspectSpec,
    _feedback,
    _read_cot,
    _read_pair,
    _side,
    more_room,
    read_pair_weighted,
    structured_pair,
    validate_aspects,
    validate_weights,
)
from hdeval.methods.dna.settings import Settings

log = logging.getLogger(__name__)

SWAP = "~swap"  # column suffix of the scores asked in the swapped order


@dataclass
class PairScoreResult(ScoreResult):
    """Scores of pairs: ``predictions`` holds each response's total (columns total_a, total_b)."""

    labels: list[str | None] = field(default_factory=list)  # a / b / tie, None = failed
    labels_ab: list[str | None] = field(default_factory=list)  # forced to a or b
    learned_labels: list[str | None] | None = None
    learned_ab: list[str | None] | None = None
    pair_aspects: dict[str, list[AspectSpec]] = field(default_factory=dict)
    weights: dict[str, list[float]] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)
    consistent: dict[str, bool] = field(default_factory=dict)  # with swap: same winner both orders
    diffs: np.ndarray | None = None  # predefined aspects: per-aspect A minus B (NaN = failed)
    # with swap: each pair's totals (a, b) as shown first, then as shown swapped
    order_totals: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    probe: dict[str, Any] | None = None  # the position probe's record (position_bias), when one ran
    swapped: bool = False  # every pair was judged in both orders (--swap, or the probe's finding)

    def apply_margin(self, tie_margin: float) -> None:
        """Re-decide every verdict that depends on the tie margin (the totals stay)."""
        self.labels = [
            None if lab is None else decide(ta, tb, tie_margin)
            for lab, (ta, tb) in zip(self.labels, self.predictions)
        ]
        self.consistent = {
            pid: decide(fa, fb, tie_margin) == decide(ra, rb, tie_margin)
            for pid, (fa, fb, ra, rb) in self.order_totals.items()
        }

    def agreement(self, samples: Sequence[PairSample]) -> dict[str, Any] | None:
        human = [s.label for s in samples]
        if all(h is None for h in human):  # unlabelled input (apply): nothing to agree with
            return None
        out = {"llm": agreement(human, self.labels, self.labels_ab)}
        if self.learned_labels is not None:
            out["learned"] = agreement(human, self.learned_labels, self.learned_ab)
        return out

    @property
    def failure_rate(self) -> float:
        return sum(1 for lab in self.labels if lab is None) / len(self.labels) if self.labels else 0.0


def _col(spec: AspectSpec, i: int, dynamic: bool) -> str:
    return f"aspect{i + 1}" if dynamic else spec.key


PROBE_PAIRS = 30  # training pairs the position probe judges in both orders (without --swap)
IF_BIASED = "only if the probe finds a position bias"


@dataclass(frozen=True)
class Probe:
    """Pairs judged in both orders after the first order, before the run decides whether every
    pair is: ``both_orders`` gets :func:`position_bias`'s record and says."""

    ids: frozenset[str]
    both_orders: Callable[[dict[str, Any]], bool]


def probe_ids(train_ids: Sequence[str], seed: int) -> list[str]:
    """The training pairs the position probe judges in both orders: a seeded draw, so the dry
    run and the run name the same ones."""
    drawn = np.random.default_rng(seed).permutation(np.array(sorted(train_ids), dtype=object))
    return [str(x) for x in drawn[:PROBE_PAIRS]]


def _what(settings: Settings) -> str:
    return "aspect scores" if settings.uses_aspects else settings.mode


def probe_stage(settings: Settings, per_pair: int) -> str:
    """The position probe's stage, as the dry run lists it and progress shows it."""
    return f"position probe: {_what(settings)} in the swapped order ({per_pair} per pair)"


def rest_stage(settings: Settings, per_pair: int) -> str:
    """The stage that judges the pairs the probe did not in the swapped order, when it found a bias."""
    return f"{_what(settings)} in the swapped order of the other pairs ({per_pair} per pair; {IF_BIASED})"


AGG_REST_STAGE = f"prompt aggregation in the swapped order ({IF_BIASED})"


def progress_units(
    settings: Settings, n_pairs: int, n_aspects: int, probed: int = 0, may_swap: bool = False
) -> int:
    """At most how many calls :func:`run_pairs` draws as progress stages (aspects and weights are
    not drawn): each pair's aspect scores per order, plus prompt aggregation per order; the
    position probe's ``probed`` pairs in the swapped order, and when it ``may_swap``, the other
    pairs' swapped order and its prompt aggregation."""
    per_pair = (settings.k if settings.dynamic else n_aspects) if settings.uses_aspects else 1
    agg = int(settings.mode == "prompt-agg")
    units = n_pairs * settings.orders * (per_pair + agg) + probed * per_pair
    return units + ((n_pairs - probed) * per_pair + n_pairs * agg if probed and may_swap else 0)


def _both_sides(
    llm,
    ids: list[str],
    first: list[Cell],
    second: list[Cell],
    reader,
    concurrency: int | None,
    progress: Progress | None,
    label: str,
    fail,
) -> ScoreMatrix:
    """One stage of pairwise calls: each reply holds both sides' scores, so the first pass pays
    and counts the calls and the second reads the same (now cached) replies for the other side:
    its cache hits are re-reads of replies the first pass counted, and are not counted again.
    ``reader``: a reply's parse, or (its parse, why its logprobs were not used) for the weighted one."""
    doubts: list[str] = []

    def side(cs, i: int):
        got = reader(cs[0])
        if reader is read_pair_weighted:
            got, doubt = got
            if doubt is not None and i == 0:
                doubts.append(doubt)
        return _side(got, i)

    stats = getattr(llm, "stats", None)
    with progress_stage(progress, label, len(first)):
        m1 = fill_matrix(llm, first, lambda cs: side(cs, 0), concurrency, progress, retry=more_room)
        hits = stats.hits if stats is not None else 0
        m2 = fill_matrix(llm, second, lambda cs: side(cs, 1), concurrency, retry=more_room)
    if stats is not None:
        stats.hits = hits  # the second pass re-reads what the first paid for: no cache hits
    if doubts:
        # counted: a server reporting probabilities from before its constraint shows up here
        msg = (
            f"{len(doubts)} of {len(first)} replies had their scores read from the text, not weighted "
            f"by logprobs that do not line up with it (first: {doubts[0]})"
        )
        if progress is not None:
            progress.message(msg)
        else:  # the library never prints; a caller with no progress sees it on the logger
            log.warning(msg)
    matrix = _merge(ids, [m1, m2])
    for f in matrix.failures:
        fail(f.sample_id, f"{f.criterion_key}: {f.reason}")
    return matrix


def run_pairs(
    llm,
    task: Task,
    templates: dict[str, Template],
    settings: Settings,
    pairs: Sequence[PairSample],
    concurrency: int | None = None,
    progress: Progress | None = None,
    probe: Probe | None = None,
) -> PairScoreResult:
    """Every stage of the chosen mode on ``pairs``; unusable replies become recorded failures.

    With ``probe`` (and one order in ``settings``), the pairs it names are judged in the swapped
    order too, as a stage of their own after the first order; when ``probe.both_orders`` says so,
    the other pairs are then, and the result is what --swap gives, else what one order gives (the
    probe's swapped scores only measure)."""
    ids = [p.id for p in pairs]
    failures: dict[str, list[str]] = {}

    def fail(pid: str, reason: str) -> None:
        failures.setdefault(pid, []).append(reason)

    def ask_each(stage: str, todo: list[PairSample], build, check, into: dict, note: str) -> None:
        # one JSON request per pair; an unusable reply fails that pair only
        if progress is not None:
            progress.message(note)
        asks = [(build(p), check(p), _feedback) for p in todo]
        for p, got in zip(todo, ask_json_many(llm, asks, concurrency)):
            if isinstance(got, UnusableReply):
                fail(p.id, f"{stage}: {got}")
            else:
                into[p.id] = got

    aspects: dict[str, list[AspectSpec]] = {}
    weights: dict[str, np.ndarray] = {}
    if settings.uses_aspects:
        if settings.dynamic:
            ask_each(
                "aspects",
                pairs,
                lambda p: aspects_request(templates["aspects"], task, p, settings.k),
                lambda p: validate_aspects(settings.k),
                aspects,
                f"aspects: {len(pairs)} calls, one per pair, each asking for {settings.k} aspects",
            )
        else:
            fixed = [AspectSpec(a.key, a.name, a.definition) for a in task.aspects]
            aspects = {p.id: fixed for p in pairs}
        with_aspects = [p for p in pairs if p.id in aspects]
        tpl_w = templates["weights"]
        ask_each(
            "weights",
            with_aspects,
            lambda p: weights_request(tpl_w, task, p, aspects[p.id]),
            lambda p: validate_weights([s.key for s in aspects[p.id]]),
            weights,
            f"weights: {len(with_aspects)} calls, one per pair",
        )

    # -- the pairwise prompts: (column base, pair, swapped) -> request
    base_cols: dict[str, list[str]] = {}

    def add(
        pid: str, base: str, req_of, first: list[Cell], second: list[Cell], orders: Sequence[bool]
    ) -> None:
        # cells read from the first number of the reply go to ``first``
        for swapped in orders:
            req = req_of(swapped)
            sfx = SWAP if swapped else ""
            # shown first is A (or B when swapped)
            (second if swapped else first).append(Cell(pid, f"{base}:a{sfx}", (req,)))
            (first if swapped else second).append(Cell(pid, f"{base}:b{sfx}", (req,)))

    def score_cells(todo: Sequence[PairSample], orders: Sequence[bool]) -> tuple[list[Cell], list[Cell]]:
        first: list[Cell] = []
        second: list[Cell] = []
        for p in todo:
            if settings.uses_aspects:
                cols = []
                for i, spec in enumerate(aspects[p.id]):
                    base = _col(spec, i, settings.dynamic)
                    cols.append(base)
                    add(
                        p.id,
                        base,
                        lambda sw, p=p, spec=spec: score_request(
                            templates["score"], task, p, spec, sw, settings.logprobs
                        ),
                        first,
                        second,
                        orders,
                    )
                base_cols[p.id] = cols
            else:
                role = settings.mode
                add(
                    p.id,
                    "overall",
                    lambda sw, p=p, role=role: overall_request(templates[role], task, p, sw, role),
                    first,
                    second,
                    orders,
                )
                base_cols[p.id] = ["overall"]
        return first, second

    reader = (
        _read_cot
        if settings.mode == "cot"
        else read_pair_weighted
        if settings.uses_aspects and settings.logprobs
        else _read_pair
    )

    def stage(label: str, todo: Sequence[PairSample], orders: Sequence[bool], on_fail=fail) -> ScoreMatrix:
        first, second = score_cells(todo, orders)
        return _both_sides(
            llm,
            ids,
            first,
            second,
            reader,
            concurrency,
            progress,
            f"{label}, {len(todo)} pairs, calls",
            on_fail,
        )

    def totals_of(p: PairSample) -> tuple[list[str], np.ndarray]:
        # the columns and weights of a pair's total (the probe of prompt-agg reads the aspect scores)
        if settings.uses_aspects:
            return base_cols[p.id], weights[p.id]
        return ["overall"], np.ones(1)

    scorable = [p for p in pairs if p.id not in failures]
    per_pair = (settings.k if settings.dynamic else len(task.aspects)) if settings.uses_aspects else 1
    swap = settings.swap
    probe_record: dict[str, Any] | None = None
    matrix = stage(settings.scoring_stage(per_pair), scorable, (False, True) if swap else (False,))
    if probe is not None and not swap:
        probed = [p for p in scorable if p.id in probe.ids and p.id not in failures]
        # a probe reply that cannot be read fails its pair only if its order is then kept (as
        # --swap): else it only measured, and the pair keeps its first order's verdict
        missed: dict[str, list[str]] = {}

        def probe_failed(pid: str, why: str) -> None:
            missed.setdefault(pid, []).append(why)

        seen = _merge(ids, [matrix, stage(probe_stage(settings, per_pair), probed, (True,), probe_failed)])
        both = []
        for p in probed:
            cols, w = totals_of(p)
            fa, fb = _order_scores(seen, p.id, cols, "")
            ra, rb = _order_scores(seen, p.id, cols, SWAP)
            both.append((*weighted_totals(fa, fb, w), *weighted_totals(ra, rb, w)))
        probe_record = position_bias(both)
        if probe.both_orders(probe_record):
            swap = True
            for pid, whys in missed.items():
                failures.setdefault(pid, []).extend(whys)
            rest = [p for p in scorable if p.id not in probe.ids and p.id not in failures]
            matrix = _merge(ids, [seen, stage(rest_stage(settings, per_pair), rest, (True,))])
        elif progress is not None:  # what is left: prompt aggregation in one order
            progress.expect(len(scorable) if settings.mode == "prompt-agg" else 0)

    # -- prompt aggregation: the aspect scores go back to the LLM
    if settings.mode == "prompt-agg":
        tpl_p = templates["prompt_agg"]
        agg: list[tuple[str, Any]] = []
        for p in scorable:
            if p.id in failures:
                continue
            sa, sb = _mean_scores(matrix, p.id, base_cols[p.id], swap)

            def agg_req(swapped: bool, p=p, sa=sa, sb=sb, specs=aspects[p.id], w=weights[p.id]):
                first, second = (sb, sa) if swapped else (sa, sb)
                # as shown: the weight in whole percent, the scores as written
                shown = [
                    (s.name, f"{w[j] * 100:.0f}", f"{first[j]:g}", f"{second[j]:g}")
                    for j, s in enumerate(specs)
                ]
                lines = "".join(f"- {n} ({pct}%): Response A {a}; Response B {b}\n" for n, pct, a, b in shown)
                return structured_pair(
                    _req(
                        tpl_p,
                        {
                            "task_description": task.description,
                            "pair": pair_block(task, p, swapped),
                            "aspect_scores": lines,
                        },
                        8,
                        answer=TWO_SCORES,
                        data={
                            **shown_pair(task, p, swapped),
                            "aspect_scores": [[n, float(pct), float(a), float(b)] for n, pct, a, b in shown],
                        },
                    )
                )

            agg.append((p.id, agg_req))
        # --swap: one stage of both orders; the probe's finding: the swapped order as a stage of its own
        agg_stages = [(settings.aggregation_stage, (False, True) if settings.swap else (False,))]
        if swap and not settings.swap:
            agg_stages.append((AGG_REST_STAGE, (True,)))
        for label, orders in agg_stages:
            agg_a: list[Cell] = []
            agg_b: list[Cell] = []
            for pid, req_of in agg:
                add(pid, "overall", req_of, agg_a, agg_b, orders)
            extra = _both_sides(
                llm,
                ids,
                agg_a,
                agg_b,
                _read_pair,
                concurrency,
                progress,
                f"{label}, {len(agg)} pairs, calls",
                fail,
            )
            matrix = _merge(ids, [matrix, extra])

    # -- aggregation
    totals = np.full((len(ids), 2), np.nan)
    labels: list[str | None] = [None] * len(ids)
    labels_ab: list[str | None] = [None] * len(ids)
    order_totals: dict[str, tuple[float, float, float, float]] = {}
    keys = list(task.aspect_keys)  # predefined aspects: their score differences are the learned features
    diffs = np.full((len(ids), len(keys)), np.nan) if settings.uses_aspects and not settings.dynamic else None
    for i, p in enumerate(pairs):
        if p.id in failures:
            continue
        if diffs is not None:
            sa, sb = _mean_scores(matrix, p.id, keys, swap)
            diffs[i] = sa - sb
        if settings.mode == "dna":
            cols, w = base_cols[p.id], weights[p.id]
        else:
            cols, w = ["overall"], np.ones(1)
        sa, sb = _mean_scores(matrix, p.id, cols, swap)
        ta, tb = weighted_totals(sa, sb, w)
        totals[i] = (ta, tb)
        labels[i] = ""  # decided below, by the tie margin
        labels_ab[i] = None if ta == tb else ("a" if ta > tb else "b")
        if swap:
            fa, fb = _order_scores(matrix, p.id, cols, "")
            ra, rb = _order_scores(matrix, p.id, cols, SWAP)
            order_totals[p.id] = (*weighted_totals(fa, fb, w), *weighted_totals(ra, rb, w))
    res = PairScoreResult(
        ids,
        ["total_a", "total_b"],
        totals,
        matrix,
        usage_of(llm),
        labels=labels,
        labels_ab=labels_ab,
        pair_aspects=aspects,
        weights={k: [float(x) for x in v] for k, v in weights.items()},
        failures=failures,
        diffs=diffs,
        order_totals=order_totals,
        probe=probe_record,
        swapped=swap,
    )
    # no margin yet (to be learned on the training split): decide at 0 until it is
    res.apply_margin(settings.tie_margin or 0.0)
    return res


def _merge(ids: list[str], parts: Sequence[ScoreMatrix]) -> ScoreMatrix:
    cols = list(dict.fromkeys(c for m in parts for c in m.criterion_keys))
    values = np.full((len(ids), len(cols)), np.nan)
    row = {s: i for i, s in enumerate(ids)}
    col = {c: j for j, c in enumerate(cols)}
    failures = []
    for m in parts:
        for r, sid in enumerate(m.sample_ids):
            for c, key in enumerate(m.criterion_keys):
                if not math.isnan(m.values[r, c]):
                    values[row[sid], col[key]] = m.values[r, c]
        failures += m.failures
    return ScoreMatrix(ids, cols, values, failures)


def _cell(m: ScoreMatrix, sid: str, key: str) -> float:
    index = m.__dict__.get("_dna_index")  # row / column positions, built once per matrix
    if index is None:
        index = ({s: i for i, s in enumerate(m.sample_ids)}, {k: j for j, k in enumerate(m.criterion_keys)})
        m.__dict__["_dna_index"] = index
    return float(m.values[index[0][sid], index[1][key]])


def _order_scores(m: ScoreMatrix, sid: str, cols: Sequence[str], sfx: str) -> tuple[np.ndarray, np.ndarray]:
    return (
        np.array([_cell(m, sid, f"{c}:a{sfx}") for c in cols]),
        np.array([_cell(m, sid, f"{c}:b{sfx}") for c in cols]),
    )


def _mean_scores(m: ScoreMatrix, sid: str, cols: Sequence[str], swap: bool) -> tuple[np.ndarray, np.ndarray]:
    a, b = _order_scores(m, sid, cols, "")
    if swap:
        ra, rb = _order_scores(m, sid, cols, SWAP)
        a, b = (a + ra) / 2, (b + rb) / 2
    return a, b


# Completion tokens a stage's reply is estimated to take (its max_tokens bounds the real figure).
_PLAN_COMPLETION = {"aspects": 40, "weights": 8, "score": 2, "direct": 2, "cot": 300, "prompt_agg": 2}


def plan_dna(config, prep, backend=None) -> list:
    """DnA's calls per stage, without calling the LLM: exact where the requests are known before
    the run; with dynamic aspects the weights and scores depend on the proposed aspects, so k per
    pair is counted, cache state unknown. Re-asks of unusable JSON replies are not counted.
    Without --swap, the position probe's stage, and the stages a bias it finds adds (upper
    bounds: they run only then; not with --no-swap, which keeps one order and warns)."""
    import dataclasses

    from hdeval.methods.run import LayerPlan, backend_for, exact_plan, prompt_chars

    settings = config.options.settings()
    task, pairs = prep.task, list(prep.samples)
    templates = load_dna_templates(settings.prompt_roles)
    orders = (False, True) if settings.swap else (False,)
    probed_ids = set() if settings.swap else set(probe_ids(prep.split.train_ids, config.seed))
    probed = [p for p in pairs if p.id in probed_ids]
    rest = (
        [p for p in pairs if p.id not in probed_ids] if probed and not config.options.one_order_chosen else []
    )
    plans: list = []

    def exact(n: int, stage: str, role: str, reqs: list, conditional: bool = False) -> None:
        row = exact_plan(llm, reqs, _PLAN_COMPLETION[role], n, stage)
        plans.append(dataclasses.replace(row, upper_bound=True) if conditional else row)

    def estimated(
        n: int, stage: str, role: str, calls: int, chars_per_call: float, conditional: bool = False
    ) -> None:
        plans.append(
            LayerPlan(
                n,
                0,
                calls,
                None,
                conditional,
                int(calls * chars_per_call / 4),
                calls * _PLAN_COMPLETION[role],
                stage=stage,
            )
        )

    with backend_for(config, backend, offline=True) as llm:
        if not settings.uses_aspects:
            role = settings.mode

            def overall(todo: list[PairSample], sws: Sequence[bool]) -> list[CompletionRequest]:
                return [overall_request(templates[role], task, p, sw, role) for p in todo for sw in sws]

            exact(1, settings.scoring_stage(1), role, overall(pairs, orders))  # as run_pairs asks
            if probed:
                exact(2, probe_stage(settings, 1), role, overall(probed, (True,)))
            if rest:
                exact(3, rest_stage(settings, 1), role, overall(rest, (True,)), conditional=True)
            return plans
        fixed = [AspectSpec(a.key, a.name, a.definition) for a in task.aspects]

        def weights_req(p: PairSample, specs: list[AspectSpec]) -> CompletionRequest:
            return weights_request(templates["weights"], task, p, specs)

        def score_req(p: PairSample, spec: AspectSpec, sw: bool) -> CompletionRequest:
            return score_request(templates["score"], task, p, spec, sw, settings.logprobs)

        n_orders = len(orders)
        if settings.dynamic:
            exact(
                1,
                "aspects",
                "aspects",
                [aspects_request(templates["aspects"], task, p, settings.k) for p in pairs],
            )
            # the proposed aspects are not known yet: size a weights / score prompt with generic ones
            generic = [
                AspectSpec(f"aspect {i + 1:<5}", f"aspect {i + 1:<5}", "y" * 80) for i in range(settings.k)
            ]
            w_chars = float(np.mean([prompt_chars(weights_req(p, generic)) for p in pairs]))
            s_chars = float(np.mean([prompt_chars(score_req(p, generic[0], False)) for p in pairs]))
            k = settings.k
            estimated(2, "weights", "weights", len(pairs), w_chars)
            estimated(3, settings.scoring_stage(k), "score", len(pairs) * k * n_orders, s_chars)
            if probed:
                estimated(4, probe_stage(settings, k), "score", len(probed) * k, s_chars)
            if rest:
                estimated(5, rest_stage(settings, k), "score", len(rest) * k, s_chars, conditional=True)
        else:

            def scores(todo: list[PairSample], sws: Sequence[bool]) -> list[CompletionRequest]:
                return [score_req(p, spec, sw) for p in todo for spec in fixed for sw in sws]

            exact(1, "weights", "weights", [weights_req(p, fixed) for p in pairs])
            exact(2, settings.scoring_stage(len(fixed)), "score", scores(pairs, orders))
            if probed:
                exact(3, probe_stage(settings, len(fixed)), "score", scores(probed, (True,)))
            if rest:
                exact(4, rest_stage(settings, len(fixed)), "score", scores(rest, (True,)), conditional=True)
        if settings.mode == "prompt-agg":
            chars = np.mean([prompt_chars(score_req(p, fixed[0], False)) for p in pairs]) + 60 * (
                settings.k if settings.dynamic else len(fixed)
            )
            estimated(len(plans) + 1, settings.aggregation_stage, "prompt_agg", len(pairs) * n_orders, chars)
            if rest:
                estimated(len(plans) + 1, AGG_REST_STAGE, "prompt_agg", len(pairs), chars, conditional=True)
        return plans
