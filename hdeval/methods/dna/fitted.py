"""The fitted DnA judge: what its artifact holds, how it scores new pairs and what it writes."""

from __future__ import annotations

import math
from typing import Annotated, Any, Sequence

import hdeval.methods.dna.fake  # noqa: F401  (registers the fake LLM's dna_* answers)
from hdeval.artifact.directory import ArtifactReader, ArtifactWriter
from hdeval.core.errors import ArtifactError, DataError
from hdeval.core.progress import Progress
from hdeval.core.types import PairSample, Task
from hdeval.judge.prompts import Template, parse_template
from hdeval.methods.base import Fitted, loaded, usage_of
from hdeval.methods.dna.decision import Learned
from hdeval.methods.dna.prompts import PROMPT_FILES, score_request
from hdeval.methods.dna.replies import AspectSpec
from hdeval.methods.dna.scoring import SWAP, PairScoreResult, Probe, _col, _mean_scores, run_pairs
from hdeval.methods.dna.settings import Settings
from hdeval.methods.metrics_file import (
    ABSENT,
    REQUIRED,
    Figure,
    FigureOrAgreement,
    Metrics,
    Number,
    Table,
    Text,
)
from hdeval.methods.pair_report import write_pair_report
from hdeval.methods.state_file import PromptsState

LEARNED = "learned.json"


class ProbeNote(Table):
    warning: Text = None


class LearnedNote(Table):
    skipped: Text = None  # why no aggregator was learned


class TieMargin(Table):
    value: Figure = None
    train_w_ties: Figure = None
    train_w_ties_at_0: Figure = None


class DnaMetrics(Metrics):
    """DnA's ``metrics.json``. ``test``: per aggregation its agreement, and with --swap the split's
    position consistency (a figure)."""

    test: Annotated[dict[str, FigureOrAgreement], REQUIRED]
    primary: Text = None
    position_consistency: Figure = None
    swap_flip_rate: Figure = None
    position_probe: ProbeNote = ABSENT
    mean_weights: dict[str, Number] = ABSENT  # aspect -> the LLM's mean weight
    learned: LearnedNote = ABSENT
    tie_margin: TieMargin = ABSENT


class DynamicWeight(Table):
    """A dynamic aspect's weight: its mean over the pairs it was proposed for, and how many."""

    mean: Annotated[Number, REQUIRED]
    instances: Figure = None


class DynamicDnaMetrics(DnaMetrics):
    """DnA with --dynamic: aspects differ per pair, so each weight is a mean with its count."""

    mean_weights: dict[str, DynamicWeight] = ABSENT  # type: ignore[assignment]


class DnaEvaluator(Fitted):
    """A Decompose-and-Aggregate judge of pairs (optionally with a learned aggregator)."""

    method = "dna"
    State = PromptsState  # the prompts' digests; the settings are method_args, the rest files

    def __init__(
        self,
        task: Task,
        templates: dict[str, Template],
        settings: Settings,
        llm: Any,
        llm_identity: str,
        metrics: dict[str, Any],
        learned: Learned | None = None,
        extra: dict[str, Any] | None = None,
        score_table=None,
    ):
        super().__init__(task, None, llm, llm_identity, metrics, extra, score_table)
        self.templates = templates
        self.settings = settings
        self.learned = learned

    def method_args(self) -> dict[str, Any]:
        return self.settings.to_dict()

    def metrics_model(self) -> type[Metrics]:
        return DynamicDnaMetrics if self.settings.dynamic else DnaMetrics

    def columns_needed(self) -> list[str]:
        s = self.settings
        if not s.uses_aspects:
            bases = ["overall"]
        elif s.dynamic:
            bases = [f"aspect{i + 1}" for i in range(s.k)]
        else:
            bases = list(self.task.aspect_keys)
        if s.mode == "prompt-agg":
            bases = bases + ["overall"]
        sfx = ["", SWAP] if s.swap else [""]
        return [f"{b}:{side}{x}" for b in bases for x in sfx for side in "ab"]

    def score(
        self,
        samples: Sequence[PairSample],
        backend=None,
        cache_dir=None,
        concurrency: int | None = None,
        progress: Progress | None = None,
        probe: Probe | None = None,
    ) -> PairScoreResult:
        samples = list(samples)
        if not samples:
            raise DataError("no pairs to score")
        if not all(isinstance(s, PairSample) for s in samples):
            raise DataError("the dna method scores pairs (output_a / output_b), not single outputs")
        with self.llm_session(backend, cache_dir) as backend:
            res = run_pairs(
                backend, self.task, self.templates, self.settings, samples, concurrency, progress, probe
            )
            res.usage = usage_of(backend)
        if self.learned is not None and res.diffs is not None:
            res.learned_labels, res.learned_ab = self.learned.labels(res.diffs)
        return res

    def output_rows(self, samples: Sequence[PairSample], result: PairScoreResult) -> list[dict[str, Any]]:
        """The JSON lines ``apply`` writes: one per pair."""
        s = self.settings
        rows = []
        for i, p in enumerate(samples):
            ta, tb = result.predictions[i]
            row: dict[str, Any] = {
                "id": p.id,
                "doc_id": p.doc_id,
                "prediction": result.labels[i],
                "totals": None if math.isnan(ta) else {"a": _num(ta), "b": _num(tb)},
            }
            if result.learned_labels is not None:
                row["learned_prediction"] = result.learned_labels[i]
            if s.uses_aspects and p.id in result.pair_aspects:
                w = result.weights.get(p.id)
                items = []
                for j, spec in enumerate(result.pair_aspects[p.id]):
                    base = _col(spec, j, s.dynamic)
                    sa, sb = (
                        _mean_scores(result.criteria, p.id, [base], s.swap)
                        if base + ":a" in result.criteria.criterion_keys
                        else ([math.nan], [math.nan])
                    )
                    items.append(
                        {
                            "aspect": spec.name,
                            "weight": None if w is None else round(w[j], 6),
                            "a": _num(sa[0]),
                            "b": _num(sb[0]),
                        }
                    )
                row["aspects"] = items
            if p.id in result.consistent:
                row["position_consistent"] = result.consistent[p.id]
            if p.id in result.failures:
                row["failures"] = result.failures[p.id]
            if p.label is not None:
                row["human"] = p.label
            rows.append(row)
        return rows

    def export_refusal(self) -> str | None:
        # weights and dynamic aspects are asked per pair as JSON with re-asks on a bad reply: a
        # conversation an offline batch engine cannot hold
        s = self.settings
        if s.mode == "dna" or s.aspect_source == "dynamic":
            return (
                f"--export-requests cannot serve DnA with mode {s.mode!r} and aspects {s.aspect_source!r} "
                "yet: its weights or aspects are asked per pair as JSON with re-asks; use --batch "
                "or an OpenAI-compatible server"
            )
        return None

    def held_out_labels(self, test: Any) -> dict[str, tuple[list, list]]:
        """The ``prediction`` column, forced to a or b by ``total_a`` / ``total_b`` (equal totals
        give no side, as DnA does), and ``learned_prediction`` / ``learned_prediction_ab``."""

        def label(x: Any) -> str | None:  # NaN / None / empty: failed
            return x if isinstance(x, str) and x in ("a", "b", "tie") else None

        pred = [label(x) for x in test["prediction"]]
        ta, tb = test["total_a"].to_numpy(float), test["total_b"].to_numpy(float)
        out = {
            "evaluator": (
                pred,
                [None if p is None or a == b else ("a" if a > b else "b") for p, a, b in zip(pred, ta, tb)],
            )
        }
        if "learned_prediction" in test and "learned_prediction_ab" in test:
            out["learned"] = (
                [label(x) for x in test["learned_prediction"]],
                [label(x) for x in test["learned_prediction_ab"]],
            )
        return out

    write_report = write_pair_report

    def banner(self) -> Any:
        from hdeval.report.pairs import dna_banner, pair_banner

        return pair_banner(self, dna_banner)

    def headline(self) -> dict[str, float | None]:
        test = self.metrics.get("test") or {}
        out: dict[str, float | None] = {}
        for key in (self.metrics.get("primary") or "llm_weights", "learned"):
            if isinstance(test.get(key), dict):
                out[f"held-out agreement w/o ties ({key.replace('_', ' ')})"] = test[key].get("wo_ties")
                out[f"held-out agreement w/ ties ({key.replace('_', ' ')})"] = test[key].get("w_ties")
        out["position consistency"] = self.metrics.get("position_consistency")
        return out

    def reply_requests(self, items: Sequence[PairSample], columns: Sequence[str]) -> tuple[list, str | None]:
        """The per-aspect prompt (one prompt scores both responses), in the order the pair was
        shown first; predefined aspects only (dynamic ones are not in the artifact)."""
        s = self.settings
        if not s.uses_aspects or s.dynamic or "score" not in (self.templates or {}):
            return [], (
                "raw replies are shown for DnA with predefined aspects only; the per-aspect "
                "scores below are what the LLM's replies were read as"
            )
        return [
            (
                (p.id, a.key),
                score_request(
                    self.templates["score"],
                    self.task,
                    p,
                    AspectSpec(a.key, a.name, a.definition),
                    False,
                    s.logprobs,
                ),
            )
            for p in items
            for a in self.task.aspects
            if a.key in columns
        ], None

    def summary_lines(self, path: Any) -> list[tuple[str, bool]]:
        lines = super().summary_lines(path)
        probe = self.metrics.get("position_probe")
        if isinstance(probe, dict) and isinstance(probe.get("warning"), str):
            lines.insert(1, (probe["warning"], True))
        return lines

    def summary_line(self) -> str:
        """One line for the CLI: the held-out agreement with the human labels."""
        t = self.metrics.get("test", {})
        parts = []
        for key in (self.metrics.get("primary"), "learned"):
            a = t.get(key)
            if a:
                parts.append(f"{key} w/o ties {a['wo_ties']}, w/ ties {a['w_ties']}")
        pc = self.metrics.get("position_consistency")
        if pc is not None:
            parts.append(f"position consistency {pc}, swap flip rate {self.metrics.get('swap_flip_rate')}")
        tm = self.metrics.get("tie_margin")
        if isinstance(tm, dict):
            how = "learned on the training split" if tm.get("from") == "training split" else "given"
            parts.append(f"tie margin {tm.get('value')} ({how})")
        return "held-out agreement with human labels: " + "; ".join(parts)

    def write(self, out: ArtifactWriter) -> dict[str, Any]:
        if self.learned is not None:
            out.json(LEARNED, self.learned.to_dict())
        return {
            **self.write_common(out, {PROMPT_FILES[r]: t for r, t in self.templates.items()}),
            **self.extra,
        }

    @classmethod
    def from_artifact(cls, art: ArtifactReader) -> "DnaEvaluator":
        cls.read_state(art)  # the prompts' digests: all a dna state holds
        where = str(art.path / "manifest.json")
        settings = Settings.from_dict(art.manifest.get("method_args"), where)
        files = [f"prompts/{PROMPT_FILES[r]}.toml" for r in settings.prompt_roles]

        def build(task: Task, llm: Any, identity: str) -> DnaEvaluator:
            templates = {
                r: parse_template(PROMPT_FILES[r], art.text(f), str(art.path / f))
                for r, f in zip(settings.prompt_roles, files)
            }
            learned = None
            if LEARNED in art.manifest["files"]:
                learned = Learned.from_dict(art.json(LEARNED), str(art.path / LEARNED))
                if learned.aspects != list(task.aspect_keys):
                    raise ArtifactError(f"{art.path / LEARNED}: its aspects do not match the task's")
            return cls(task, templates, settings, llm, identity, {}, learned)

        ev = loaded(art, files, build)
        if ev.task.shape != "pairwise":
            raise ArtifactError(f"{where}: a dna artifact needs a pairwise task")
        return ev


def _num(x: float) -> float | None:
    return None if math.isnan(x) else round(float(x), 6)
