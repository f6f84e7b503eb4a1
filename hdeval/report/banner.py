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
        banner.add("LLM", f"{ident}: the offline fake LLM answers with seeded noise; these numbers "
                          "test the pipeline and say nothing about any real evaluator", warn=True)
    elif ident == "local":  # the embedded runtime's default model is the bundled SmolLM2-135M
        banner.add("LLM", "local: the embedded model (SmolLM2-135M unless another GGUF was given) is for "
                          "trying the pipeline; expect scores close to chance", warn=True)
    elif size is not None and size < TINY_PARAMS:
        banner.add("LLM", f"{ident}: a tiny model ({size / 1e6:.0f}M parameters) is for trying the "
                          "pipeline; expect scores close to chance", warn=True)
    else:
        banner.add("LLM", ident)


def split_line(banner: Banner, n_train: int | None, n_test: int | None, n_features: int | None,
               features: str = "criteria", rows: str = "rows") -> None:
    if n_train is None or n_test is None:
        banner.add("data", "the artifact records no train/test sizes")
        return
    text = f"{n_train} training {rows} and {n_test} held-out {rows}"
    if n_features:
        text += f" for {n_features} {features}"
    banner.add("data", text)
    if n_features and n_train < ROWS_PER_FEATURE * n_features:
        banner.add("overfitting", f"{n_train} training {rows} for {n_features} {features} "
                                  f"(fewer than {ROWS_PER_FEATURE} per feature): the aggregator is likely "
                                  "to fit noise; use more data or fewer criteria", warn=True)
    if n_test < SMALL_TEST:
        banner.add("small test set", f"only {n_test} held-out {rows}: a held-out figure can move by 0.1 or "
                                     "more on another split", warn=True)


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
            f"{k} {v:.3f}" if isinstance(v, (int, float)) else f"{k} n/a" for k, v in scores.items())
    held = ((metrics.get("final") or {}).get("average") or {}).get("spearman")
    if isinstance(held, (int, float)):
        text += f"; held-out Spearman of the kept one {held:.3f}"
    warn = sel.get("simpler_was_better")
    banner.add("aggregator kept", text + (f". {warn}" if isinstance(warn, str) else ""), warn=isinstance(warn, str))


def baseline_line(banner: Banner, evaluator: float | None, baselines: Mapping[str, float | None],
                  measure: str, label: str = "strongest baseline") -> None:
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
