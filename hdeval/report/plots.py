"""matplotlib helpers every report uses: the Agg backend, one clean sans-serif style, names
drawn literally (no mathtext), integer ticks for counts, PNG bytes out."""

from __future__ import annotations

import functools
import io
import sys
from typing import Any, Callable, Mapping, Sequence

STYLE = {
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Liberation Sans", "Arial", "Helvetica"],
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.titleweight": "bold",
    "axes.edgecolor": "#888",
    "legend.frameon": False,
    # criterion and aspect names are the user's (or the LLM's) text: a name like
    # "price $x^$" must show as written, not be parsed as TeX (an unbalanced one raises)
    "text.parse_math": False,
}
COLORS = ["#4a7ab5", "#e69500", "#5a9e6f", "#c0504d", "#8064a2", "#4bacc6", "#9c6b3e", "#7f7f7f"]


def pyplot() -> Any:
    """pyplot on the Agg backend (no display needed). If the caller already imported pyplot
    (a notebook), its backend is left alone: switching would close the caller's figures."""
    if "matplotlib.pyplot" not in sys.modules:
        import matplotlib

        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def styled(plot: Callable[..., bytes]) -> Callable[..., bytes]:
    """Draw ``plot`` in the reports' style (which includes mathtext off)."""

    @functools.wraps(plot)
    def draw(*args: Any, **kwargs: Any) -> bytes:
        with pyplot().rc_context(STYLE):
            return plot(*args, **kwargs)

    return draw


def png(fig: Any, tight: bool = False) -> bytes:
    """The figure as PNG bytes (``tight``: laid out first); the figure is closed (pyplot keeps
    every open figure alive)."""
    if tight:
        fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    pyplot().close(fig)
    return buf.getvalue()


def integer_ticks(ax: Any, axis: str = "x") -> None:
    """Counts (layers, criteria, pairs) have no fractional values: tick them as integers."""
    from matplotlib.ticker import MaxNLocator

    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))


def short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@styled
def agreement_bars(series: Mapping[str, Mapping[str, Any]], title: str) -> bytes:
    """Held-out agreement with and without ties, one bar pair per named series."""
    plt = pyplot()
    names = list(series)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names) + 2), 3.8))
    width = 0.38
    x = list(range(len(names)))
    for k, (key, label) in enumerate((("wo_ties", "without ties"), ("w_ties", "with ties"))):
        vals = [_num((series[n] or {}).get(key)) for n in names]
        bars = ax.bar([i + (k - 0.5) * width for i in x], vals, width, label=label, color=COLORS[k])
        ax.bar_label(bars, labels=["" if v != v else f"{v:.2f}" for v in vals], fontsize=8, padding=2)
    ax.set_xticks(
        x,
        [short(n, 28) for n in names],
        rotation=15 if len(names) > 3 else 0,
        ha="right" if len(names) > 3 else "center",
    )
    ax.set(ylim=(0, 1.08), ylabel="held-out agreement with humans", title=title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png(fig, tight=True)


@styled
def confusion(matrix: Mapping[str, Mapping[str, int]], title: str) -> bytes:
    """Human label (rows) against the evaluator's (columns), counts in the cells."""
    plt = pyplot()
    rows = [r for r in ("a", "b", "tie") if r in matrix] + sorted(
        r for r in matrix if r not in ("a", "b", "tie")
    )
    cols_seen = {c for r in matrix.values() for c in (r or {})}
    cols = [c for c in ("a", "b", "tie", "failed") if c in cols_seen or c in ("a", "b")]
    cols += sorted(c for c in cols_seen if c not in cols)
    counts = [[int((matrix.get(r) or {}).get(c, 0)) for c in cols] for r in rows]
    fig, ax = plt.subplots(figsize=(1.2 * len(cols) + 2, 0.9 * len(rows) + 1.4))
    im = ax.imshow(counts, cmap="Blues", vmin=0)
    top = max((v for row in counts for v in row), default=0)
    for i, row in enumerate(counts):
        for j, v in enumerate(row):
            ax.text(
                j,
                i,
                str(v),
                ha="center",
                va="center",
                fontsize=11,
                color="white" if top and v > top * 0.6 else "#222",
            )
    ax.set_xticks(range(len(cols)), [f"predicted {c}" for c in cols])
    ax.set_yticks(range(len(rows)), [f"human {r}" for r in rows])
    ax.set_title(title)
    cbar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    integer_ticks(cbar.ax, "y")
    cbar.set_label("pairs")
    return png(fig, tight=True)


@styled
def barh(
    values: Mapping[str, float],
    title: str,
    xlabel: str,
    color: str = COLORS[0],
    limit: int = 20,
    sort: bool = True,
    reference: Mapping[str, float] | None = None,
    reference_label: str = "",
    label: str = "",
) -> bytes:
    """Horizontal bars (weights, importance, per-aspect differences); ``reference`` adds a
    second bar per name (e.g. the LLM's weight next to the learned share)."""
    plt = pyplot()
    items = list(values.items())
    if sort:
        items.sort(key=lambda kv: -abs(_num(kv[1]) if _num(kv[1]) == _num(kv[1]) else 0))
    items = items[:limit][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.8 + 0.36 * max(len(items), 1) * (2 if reference else 1)))
    y = list(range(len(items)))
    h = 0.4 if reference else 0.7
    ax.barh(
        [i + (h / 2 if reference else 0) for i in y],
        [_num(v) for _, v in items],
        h,
        color=color,
        label=(label or xlabel) if reference else None,
    )
    if reference:
        ax.barh(
            [i - h / 2 for i in y],
            [_num(reference.get(k)) for k, _ in items],
            h,
            color=COLORS[1],
            label=reference_label,
        )
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_yticks(y, [short(str(k), 60) for k, _ in items])
    ax.axvline(0, color="#555", lw=0.8)
    ax.set(xlabel=xlabel, title=title)
    ax.grid(axis="x", alpha=0.3)
    return png(fig, tight=True)


@styled
def layer_agreement(
    layers: Mapping[str, Mapping[str, Any]], baseline: Mapping[str, Any] | None, baseline_label: str
) -> bytes:
    """Held-out agreement per layer (with and without ties), the baseline as dashed lines."""
    plt = pyplot()
    ks = sorted(layers, key=int)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for k, (key, label) in enumerate((("wo_ties", "without ties"), ("w_ties", "with ties"))):
        ax.plot(
            [int(x) for x in ks],
            [_num((layers[x] or {}).get(key)) for x in ks],
            marker="o",
            color=COLORS[k],
            label=label,
            lw=2,
        )
        if baseline and _num(baseline.get(key)) == _num(baseline.get(key)):
            ax.axhline(
                _num(baseline[key]), color=COLORS[k], ls="--", lw=1, label=f"{baseline_label} ({label})"
            )
    integer_ticks(ax, "x")
    ax.grid(alpha=0.3)
    ax.set(
        xlabel="layers used (1..k)",
        ylabel="held-out agreement with humans",
        ylim=(0, 1.05),
        title="Agreement by layer",
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return png(fig, tight=True)


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else float("nan")


@styled
def share_bar(value: float, label: str) -> bytes:
    """One share (0-1) as a bar on a full-width track, e.g. position consistency."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 1.2))
    ax.barh([0], [1], color="#e8e8e8")
    ax.barh([0], [_num(value)], color=COLORS[2])
    ax.text(min(_num(value), 0.9) + 0.01, 0, f"{_num(value):.2f}", va="center", fontsize=11)
    ax.set(xlim=(0, 1), xlabel="share of pairs")
    ax.set_yticks([0], [label])
    return png(fig, tight=True)


@styled
def interval_dots(
    rows: Sequence[tuple[str, float | None, float | None, float | None]],
    xlabel: str,
    title: str,
    highlight: int | None = 0,
) -> bytes:
    """One dot per row (label, estimate, low, high) with its interval as a bar, top to bottom in
    the given order; ``highlight``: the row drawn in the accent colour. Missing figures draw
    nothing on their row."""
    import math

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.8 + 0.36 * max(len(rows), 1)))
    for i, (_, est, lo, hi) in enumerate(rows):
        y = len(rows) - 1 - i
        color = COLORS[1] if i == highlight else COLORS[0]
        if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
            ax.plot([lo, hi], [y, y], color=color, lw=2.2, solid_capstyle="butt")
        if est is not None and math.isfinite(est):
            ax.plot([est], [y], "o", color=color, ms=6)
    ax.set_yticks(range(len(rows)), [short(r[0], 44) for r in rows][::-1])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set(xlabel=xlabel, title=title)
    ax.grid(axis="x", alpha=0.3)
    ax.tick_params(labelsize=9)
    return png(fig, tight=True)
