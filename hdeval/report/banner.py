"""The verdict banner on top of every report: can this evaluator be trusted, at a glance?
Each line is a fact from the artifact (the LLM, the split against the features, the layer
kept, the strongest baseline) with a warning where it undermines the numbers below it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

#: Fewer training rows per feature than this and a fitted aggregator likely memorises noise
#: (a common rule of thumb for regression; e.g. 32 rows for 20 criteria warns).
ROWS_PER_FEATURE = 10
#: Fewer held-out rows than this and a correlation or agreement moves by ±0.1 or more
#: between splits: the held-out numbers are anecdotes, not measurements.
SMALL_TEST = 50
#: Models below this many parameters answer criteria questions barely above chance.
TINY_PARAMS = 1e9

#: An interval wider than this share of an aspect's score range is too wide to act on: apply's
#: --max-interval-width flags a row needs_human past the same share by default.
USABLE_WIDTH = 0.5

_SIZE = re.compile(r"(?<![0-9A-Za-z.])([0-9]+(?:\.[0-9]+)?)([mMbB])(?![0-9A-Za-z])")


@dataclass
class Line:
    label: str
    text: str
    warn: bool = False


@dataclass
class Banner:
    lines: list[Line] = field(default_factory=list)

    @property
    def warnings(self) -> int:
        return sum(line.warn for line in self.lines)

    @property
    def headline(self) -> str:
        n = self.warnings
        if not n:
            return "No warnings: the held-out numbers below can be read at face value."
        return f"{n} warning{'s' if n > 1 else ''}: read the numbers below with care."

    def add(self, label: str, text: str, warn: bool = False) -> None:
        self.lines.append(Line(label, text, warn))


def model_size(identity: str) -> float | None:
    """Parameters named in a model's identity ("SmolLM2-135M" -> 1.35e8), if any."""
    name = (identity or "").split("#")[0]  # after "#" is a file digest: hex, not a size
    sizes = [float(num) * (1e6 if unit in "mM" else 1e9) for num, unit in _SIZE.findall(name)]
    return max(sizes, default=None)


def llm_line(banner: Banner, identity: str | None) -> None:
    ident = str(identity or "unknown")
    size = model_size(ident)
    if ident.startswith("fake"):
        banner.add(
            "LLM",
            f"{ident}: the offline fake LLM answers with seeded noise; these numbers "
            "test the pipeline and say nothing about any real evaluator",
            warn=True,
        )
    elif ident == "local":  # the embedded runtime's default model is the bundled SmolLM2-135M
        banner.add(
            "LLM",
            "local: the embedded model (SmolLM2-135M unless another GGUF was given) is for "
            "trying the pipeline; expect scores close to chance",
            warn=True,
        )
    elif size is not None and size < TINY_PARAMS:
        banner.add(
            "LLM",
            f"{ident}: a tiny model ({size / 1e6:.0f}M parameters) is for trying the "
            "pipeline; expect scores close to chance",
            warn=True,
        )
    else:
        banner.add("LLM", ident)


def split_line(
    banner: Banner,
    n_train: int | None,
    n_test: int | None,
    n_features: int | None,
    features: str = "criteria",
    rows: str = "rows",
) -> None:
    if n_train is None or n_test is None:
        banner.add("data", "the artifact records no train/test sizes")
        return
    text = f"{n_train} training {rows} and {n_test} held-out {rows}"
    if n_features:
        text += f" for {n_features} {features}"
    banner.add("data", text)
    if n_features and n_train < ROWS_PER_FEATURE * n_features:
        banner.add(
            "overfitting",
            f"{n_train} training {rows} for {n_features} {features} "
            f"(fewer than {ROWS_PER_FEATURE} per feature): the aggregator is likely "
            "to fit noise; use more data or fewer criteria",
            warn=True,
        )
    if n_test < SMALL_TEST:
        banner.add(
            "small test set",
            f"only {n_test} held-out {rows}: a held-out figure can move by 0.1 or more on another split",
            warn=True,
        )


def layer_line(banner: Banner, metrics: Mapping[str, Any], trained: list[str] | None = None) -> None:
    """The layer the evaluator kept, as the artifact records it (``layer_choice`` with a reason
    when training wrote one; else ``final_layer``; else the last layer trained)."""
    choice = metrics.get("layer_choice")
    sel = metrics.get("selection")  # what HD-Eval's training writes (pointwise and pairwise)
    if choice is None and isinstance(sel, Mapping):
        choice = {"layer": sel.get("kept_layer"), "reason": sel.get("reason")}
    if isinstance(choice, Mapping) and choice.get("layer") is not None:
        reason = choice.get("reason")
        banner.add("layer kept", f"layer {choice['layer']}" + (f": {reason}" if reason else ""))
    elif isinstance(choice, (int, str)) and not isinstance(choice, bool):
        banner.add("layer kept", f"layer {choice}")
    elif metrics.get("final_layer") is not None:
        banner.add("layer kept", f"layer {metrics['final_layer']}")
    elif trained:
        last = max(trained, key=lambda k: int(k) if str(k).isdigit() else 0)
        banner.add("layer kept", f"layer {last}, the last one trained (the artifact records no choice)")


def aggregator_line(banner: Banner, metrics: Mapping[str, Any]) -> None:
    """The aggregator kept and why, every candidate's cross-validated figure on the kept layer and
    the kept one's held-out figure; a warning when an asked aggregator lost to a simpler one."""
    sel = metrics.get("selection")
    if not isinstance(sel, Mapping) or not isinstance(sel.get("kept_aggregator"), str):
        return
    text = str(sel.get("aggregator_reason") or sel["kept_aggregator"])
    scores = (sel.get("candidates_cv_spearman") or {}).get(str(sel.get("kept_layer")))
    if isinstance(scores, Mapping) and len(scores) > 1:
        text += "; grouped CV Spearman on the training split: " + ", ".join(
            f"{k} {v:.3f}" if isinstance(v, (int, float)) else f"{k} n/a" for k, v in scores.items()
        )
    held = ((metrics.get("final") or {}).get("average") or {}).get("spearman")
    if isinstance(held, (int, float)):
        text += f"; held-out Spearman of the kept one {held:.3f}"
    warn = sel.get("simpler_was_better")
    banner.add(
        "aggregator kept", text + (f". {warn}" if isinstance(warn, str) else ""), warn=isinstance(warn, str)
    )


def baseline_line(
    banner: Banner,
    evaluator: float | None,
    baselines: Mapping[str, float | None],
    measure: str,
    label: str = "strongest baseline",
) -> None:
    """The strongest baseline against the evaluator, on the same held-out measure."""
    known = {k: v for k, v in baselines.items() if isinstance(v, (int, float))}
    if not known:
        banner.add(label, "none recorded in this artifact")
        return
    name, value = max(known.items(), key=lambda kv: kv[1])
    if not isinstance(evaluator, (int, float)):
        banner.add(label, f"{name}: {measure} {value:.3f}")
        return
    diff = evaluator - value
    text = f"{name}: {measure} {value:.3f}; the evaluator {evaluator:.3f} ({diff:+.3f})"
    banner.add(label, text + ("" if diff > 0 else ": the evaluator does not beat it"), warn=diff <= 0)


def interval_verdict(
    half_widths: Mapping[str, float | None], ranges: Mapping[str, tuple[float, float]]
) -> str:
    """``±2.97 on a 1-5 scale: too wide to use``: each aspect's half-width on its scale, judged
    against :data:`USABLE_WIDTH` (the widest decides)."""
    parts, worst = [], 0.0
    scales = {ranges.get(a, (0.0, 0.0)) for a in half_widths}
    for aspect, hw in half_widths.items():
        low, high = ranges.get(aspect, (0.0, 0.0))
        span = high - low
        share = float("inf") if hw is None or span <= 0 else 2 * hw / span
        worst = max(worst, share)
        scale = f" on a {low:g}-{high:g} scale" if span > 0 and len(scales) > 1 else ""
        parts.append(f"{aspect} {'unbounded' if hw is None else f'±{hw:.2f}'}{scale}")
    if len(scales) == 1 and (span := next(iter(scales)))[1] > span[0]:
        parts[-1] += f" on a {span[0]:g}-{span[1]:g} scale"
    judged = (
        "too wide to use (wider than half the scale)"
        if worst > USABLE_WIDTH
        else "wide"
        if worst > USABLE_WIDTH / 2
        else "narrow enough to use"
    )
    return f"{', '.join(parts)}: {judged}"


def next_step(
    *,
    identity: str | None,
    evaluator: float | None,
    direct: float | None,
    n_train: int | None,
    n_features: int | None,
    n_test: int | None,
    too_wide: bool,
    path: Any,
) -> str:
    """What to do next, from the artifact's own figures: the one line the terminal and the
    banner end on (``ready: hdeval apply ...`` only when nothing above undermines it)."""
    ident = str(identity or "")
    size = model_size(ident)
    toy = ident.startswith("fake") or ident == "local" or (size is not None and size < TINY_PARAMS)
    crowded = bool(n_features and n_train is not None and n_train < ROWS_PER_FEATURE * n_features)
    loses = evaluator is None or (direct is not None and evaluator <= direct)
    if ident.startswith("fake"):
        return "train with a real LLM (--llm): the fake LLM's numbers only show the pipeline runs"
    ways = []
    if loses or too_wide or (n_test is not None and n_test < SMALL_TEST):
        ways.append("more labels (`hdeval label`, then train again)")
    if loses and not crowded:
        ways.append(
            "another LLM (--llm)" if not toy else "a real LLM (--llm): a tiny model scores near chance"
        )
    if crowded:
        ways.append("fewer criteria (--layers 1, --top-k)")
    if not ways:
        return f"this evaluator is ready: hdeval apply {path} NEW.jsonl -o scored.jsonl"
    why = (
        "the direct LLM score agrees better than the trained evaluator"
        if loses and evaluator is not None
        else "the intervals are too wide to act on"
        if too_wide
        else "too few rows to trust the figures"
    )
    return f"{', or '.join(ways)}: {why}"


def outlook_lines(
    banner: Banner,
    *,
    intervals: Mapping[str, Any] | None,
    ranges: Mapping[str, tuple[float, float]],
    identity: str | None,
    evaluator: float | None,
    direct: float | None,
    n_train: int | None,
    n_features: int | None,
    n_test: int | None,
    path: Any,
) -> None:
    """The intervals judged on each aspect's scale, and what to do next (the terminal's last line)."""
    too_wide = False
    if isinstance(intervals, Mapping) and isinstance(intervals.get("half_width"), Mapping):
        hw = intervals["half_width"]
        too_wide = any(
            w is None or 2 * w > USABLE_WIDTH * (ranges[a][1] - ranges[a][0])
            for a, w in hw.items()
            if a in ranges
        )
        level = intervals.get("level")
        shown = f"{level:.0%} intervals: " if isinstance(level, (int, float)) else ""
        banner.add("intervals", shown + interval_verdict(hw, ranges), warn=too_wide)
    banner.add(
        "next",
        next_step(
            identity=identity,
            evaluator=evaluator,
            direct=direct,
            n_train=n_train,
            n_features=n_features,
            n_test=n_test,
            too_wide=too_wide,
            path=path,
        ),
    )
